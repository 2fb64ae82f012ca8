"""GET /status: vmpooler's pool and queue summary, plus vmpool's requests, RQ queues
and workers."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import APIRouter
from rq import Queue
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State
from vmpool.api.metrics import fleet_workers
from vmpool.api.responses import reply
from vmpool.config import Config
from vmpool.state.keys import Keys
from workers.queues import queue_names

__all__ = ["pools_status", "router", "rq_status", "status_body"]

log = logging.getLogger(__name__)

STATUS_MESSAGE = "Battle station fully armed and operational."  # vmpooler's

router = APIRouter()


@router.get("/status")
async def get_status(st: State) -> Response:
    return reply(200, await run_in_threadpool(status_body, st))


def status_body(st: ApiState) -> dict[str, Any]:
    pools, totals = pools_status(st.config, st.store.pool_counts(st.config.pools))
    queues, workers = rq_status(st.clients.raw, st.keys)
    r = st.clients.text
    return {
        "pools": pools,
        "queue": {
            "pending": totals["pending"],
            "ready": 0,
            "running": totals["running"],
            "completed": totals["completed"],
            "total": sum(totals.values()),
        },
        "queues": queues,
        "requests": {
            "open": int(r.zcard(st.keys.open_requests)),
            "provisioning": int(r.zcard(st.keys.provision_queue)),
        },
        "status": {
            "ok": True,
            "message": STATUS_MESSAGE,
            "uptime": round(time.monotonic() - st.started, 1),
        },
        "workers": workers,
    }


def pools_status(
    config: Config, counts: Mapping[str, Mapping[str, int]]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Each pool's entry in vmpooler's shape (``pending`` is reserved plus booting), and
    the totals over all pools by pending, running and completed."""
    pools: dict[str, Any] = {}
    totals = dict.fromkeys(("pending", "running", "completed"), 0)
    for name, pool in config.pools.items():
        c = counts[name]
        pending = c["reserved"] + c["pending"]
        entry: dict[str, Any] = {
            "ready": 0,
            "running": c["running"],
            "pending": pending,
            "max": pool.size,
            "lastBoot": None,
            "reserved": c["reserved"],
            "booting": c["pending"],
            "completed": c["completed"],
        }
        if pool.alias:
            entry["alias"] = list(pool.alias)
        pools[name] = entry
        totals["pending"] += pending
        totals["running"] += c["running"]
        totals["completed"] += c["completed"]
    return pools, totals


def rq_status(raw: redis.Redis, keys: Keys) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Jobs waiting in each of the fleet's RQ queues, and the registered workers sorted
    by name."""
    queues: dict[str, int] = {}
    workers: list[dict[str, Any]] = []
    try:
        for name in queue_names(keys):
            queues[name] = Queue(name, connection=raw).count
        for worker in fleet_workers(raw, keys):
            workers.append(
                {
                    "name": worker.name,
                    "state": str(worker.get_state()),
                    "queues": worker.queue_names(),
                }
            )
    except redis.RedisError:
        raise
    except Exception as exc:  # an RQ quirk must not break /status
        log.warning("status: could not read RQ state: %s", exc)
    return queues, sorted(workers, key=lambda w: str(w["name"]))

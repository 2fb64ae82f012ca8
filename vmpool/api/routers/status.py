"""GET /status: vmpooler's pool and queue summary.

Plus vmpool's requests, RQ queues and workers."""

from __future__ import annotations

import functools
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
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
from vmpool.lifecycle.overrides import pools_with_overrides
from vmpool.providers.identity import fleet_ids
from vmpool.state.circuit import read_states
from vmpool.state.fleet_identity import fleet_identity, read_marks
from vmpool.state.keys import Keys
from vmpool.state.pool_failures import read_pool_failures
from vmpool.state.redis_check import check_redis
from vmpool.state.transitions import VMState
from workers.queues import queue_names

__all__ = [
    "exposure_warning",
    "is_loopback",
    "pools_status",
    "router",
    "rq_status",
    "status_body",
]

log = logging.getLogger(__name__)

STATUS_MESSAGE = "Battle station fully armed and operational."  # vmpooler's

router = APIRouter()


@router.get("/status")
async def get_status(st: State, view: str | None = None) -> Response:
    """``?view=a,b``: only those parts (and ``status``, always), as vmpooler's."""
    views = None if view is None else frozenset(part.strip() for part in view.split(","))
    return reply(200, await run_in_threadpool(status_body, st, views))


def exposure_warning(auth_on: bool, host: str | None) -> str | None:
    """The warning for auth off on an address others can reach.

    None when auth is on, or the address is loopback (or unknown: an app built without a
    server)."""
    if auth_on or host is None or is_loopback(host):
        return None
    return (
        f"auth is off and the API listens on {host}: anyone who can reach it may create"
        " and delete requests (configure :auth:, or bind to 127.0.0.1)"
    )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses.

    Any other name or address (the wildcards ``0.0.0.0`` and ``::`` included) may be
    reachable from elsewhere."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def status_body(st: ApiState, views: frozenset[str] | None = None) -> dict[str, Any]:
    """vmpooler's /status, vmpool's parts beside it.

    ``views``: the top-level parts to compute and return (``status`` always is); None:
    every part. vmpooler names ``capacity``, ``queue``, ``clone``, ``boot`` and
    ``pools``; vmpool's own parts are chosen by their names the same way."""

    def wanted(part: str) -> bool:
        return views is None or part in views

    # the pools' sizes as set at runtime (POST /config/poolsize), as vmpooler's /status
    live = replace(st.config, pools=pools_with_overrides(st.clients.text, st.keys, st.config))
    pools, totals = pools_status(live, st.store.pool_counts(st.config.pools))
    r = st.clients.text
    rq = functools.cache(lambda: rq_status(st.clients.raw, st.keys))  # one read for two
    status: dict[str, Any] = {"ok": True, "message": STATUS_MESSAGE}
    parts: dict[str, Callable[[], Any]] = {
        "pools": lambda: pools,
        "capacity": lambda: _capacity(live, totals["ready"]),
        "queue": lambda: _queue(totals),
        "queues": lambda: rq()[0],
        "requests": lambda: {
            "open": int(r.zcard(st.keys.open_requests)),
            "provisioning": int(r.zcard(st.keys.provision_queue)),
        },
        "workers": lambda: rq()[1],
        "auth": lambda: "off" if st.config.auth is None else "on",
        # the settings vmpool's guarantees assume (noeviction, AOF), or "unknown"
        "redis": lambda: check_redis(r).as_dict(),
        # vmpool: each provider's circuit breaker (vmpool/state/circuit.py)
        "providers": lambda: {
            s.provider: s.as_dict() for s in read_states(r, st.keys, st.config.providers)
        },
        "fleet": lambda: _fleet(st),
    }
    body: dict[str, Any] = {part: make() for part, make in parts.items() if wanted(part)}
    empty = [name for name, entry in pools.items() if entry["ready"] == 0 and entry["max"]]
    if empty and wanted("pools"):  # vmpooler's "empty" pools: a warm pool with no ready VM
        status.update(ok=False, empty=empty, message=f"Found {len(empty)} empty pools.")
    body["status"] = {**status, "uptime": round(time.monotonic() - st.started, 1)}
    warnings = _pool_failures(st, pools) if wanted("pools") or wanted("warnings") else []
    warning = exposure_warning(st.config.auth is not None, st.listen_host)
    if warning:
        warnings.append(warning)
    if warnings and wanted("warnings"):
        body["warnings"] = warnings
    return dict(sorted(body.items()))  # vmpooler sorts the top level


def _queue(totals: Mapping[str, int]) -> dict[str, int]:
    """vmpooler's queue: VMs by state over all pools.

    ``pending`` is ``cloning`` (reserved: the create not done) plus ``booting`` (created,
    not ready yet), as vmpooler's booting is its pending less its clones in flight."""
    return {
        "pending": totals["pending"],
        "cloning": totals["cloning"],
        "booting": totals["pending"] - totals["cloning"],
        "ready": totals["ready"],
        "running": totals["running"],
        "completed": totals["completed"],
        "total": sum(totals[key] for key in ("pending", "ready", "running", "completed")),
    }


def _fleet(st: ApiState) -> dict[str, Any]:
    """vmpool: the fleet's identity, the mark each provider tags its VMs with, and the
    fleet's other marks by role (vmpool/state/fleet_identity.py)."""
    r = st.clients.text
    return {
        "id": fleet_identity(r, st.keys),
        "providers": fleet_ids(r, st.keys, st.config.providers),
        "marks": _marks(r, st.keys),
    }


def _marks(r: redis.Redis, keys: Keys) -> dict[str, str]:
    marks = read_marks(r, keys)
    return {} if marks is None else {mark: str(role) for mark, role in marks.others.items()}


def _pool_failures(st: ApiState, pools: dict[str, Any]) -> list[str]:
    """Each pool's create failures into its entry (vmpool.state.pool_failures).

    ``last_error`` ('' when none), ``last_error_at``, ``create_failures`` (in a row, 0
    once one went through) and ``retry_at`` (its top-ups wait until then). Returns a
    warning for each pool whose creates fail now."""
    now, failures = read_pool_failures(st.clients.text, st.keys, pools)
    warnings = []
    for name, f in failures.items():
        shown = f.as_dict(now)
        pools[name].update(
            last_error=f.last_error,
            last_error_at=f.last_error_at,
            create_failures=f.consecutive,
            retry_at=shown["retry_at"],
        )
        if f.failing:
            warnings.append(f"pool {name}: {f.consecutive} creates failed in a row: {f.last_error}")
    return warnings


def _capacity(config: Config, ready: int) -> dict[str, Any]:
    """vmpooler's capacity: ready VMs against the pools' sizes."""
    total = sum(pool.size for pool in config.pools.values())
    percent = round(ready / total * 100.0, 1) if total else 0
    return {"current": ready, "total": total, "percent": percent}


def pools_status(
    config: Config, counts: Mapping[str, Mapping[str, int]]
) -> tuple[dict[str, Any], dict[str, int]]:
    """Each pool's entry in vmpooler's shape, and the totals over all pools.

    An entry's ``pending`` is reserved plus booting. The totals are by pending (and the
    reserved among them, ``cloning``), ready, running and completed."""
    pools: dict[str, Any] = {}
    totals = dict.fromkeys(("pending", "cloning", "ready", "running", "completed"), 0)
    for name, pool in config.pools.items():
        c = counts[name]
        pending = c[VMState.RESERVED] + c[VMState.PENDING]
        entry: dict[str, Any] = {
            "ready": c[VMState.READY],
            "running": c[VMState.RUNNING],
            "pending": pending,
            "max": pool.size,
            "lastBoot": None,
            "reserved": c[VMState.RESERVED],
            "booting": c[VMState.PENDING],
            "completed": c[VMState.COMPLETED],
            "on_hold": c[VMState.ON_HOLD],  # failed its ready check, kept for debugging
        }
        if pool.alias:
            entry["alias"] = list(pool.alias)
        pools[name] = entry
        totals["pending"] += pending
        totals["cloning"] += c[VMState.RESERVED]
        totals["ready"] += c[VMState.READY]
        totals["running"] += c[VMState.RUNNING]
        totals["completed"] += c[VMState.COMPLETED]
    return pools, totals


def rq_status(raw: redis.Redis, keys: Keys) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Jobs waiting in each of the fleet's RQ queues, and the registered workers.

    The workers are sorted by name."""
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

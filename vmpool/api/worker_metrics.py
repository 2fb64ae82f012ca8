"""The fleet's RQ workers as metrics and for /status: read from RQ's own registrations.

Two pipelines per scrape: the members of RQ's per-queue worker sets for the fleet's
queues, then (birth, state, last heartbeat) of each registered worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timezone
from typing import Any, Final

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from rq import Worker
from rq.utils import utcparse
from rq.worker import BaseWorker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from vmpool.api.backlog_metrics import busy_family
from vmpool.state.keys import Keys
from workers.table import QUEUES
from workers.worker import RQ_SETTINGS

__all__ = ["WORKER_TTL_S", "fleet_workers", "worker_families"]

# A worker is alive while RQ's heartbeat (its last_heartbeat, written by the worker
# every few seconds, idle or busy) is younger than the worker_ttl vmpool's workers run
# with: past it RQ itself takes the worker for dead.
WORKER_TTL_S: Final = float(RQ_SETTINGS["worker_ttl"])


def fleet_workers(raw: redis.Redis, keys: Keys) -> list[BaseWorker]:
    """The RQ workers registered on one of the fleet's queues (RQ's per-queue worker sets), by name.

    Another fleet's, under another key prefix, are not ours to report."""
    found: dict[str, BaseWorker] = {}
    for short in QUEUES:
        for key in raw.smembers(WORKERS_BY_QUEUE_KEY % keys.queue(short)):
            worker = Worker.find_by_key(_text(key), connection=raw)
            if worker is not None:
                found[worker.name] = worker
    return [found[name] for name in sorted(found)]


def worker_families(raw: redis.Redis, keys: Keys, now: float) -> Iterator[Metric]:
    """Registered workers by state, those whose heartbeat is fresh, and the busy ones."""
    by_state: dict[str, int] = {}
    alive = busy = 0
    for state, beat in _worker_beats(raw, keys):
        by_state[state] = by_state.get(state, 0) + 1
        if beat is not None and now - beat <= WORKER_TTL_S:
            alive += 1
            busy += state == "busy"
    registered = GaugeMetricFamily(
        "vmpool_workers",
        "RQ workers registered on the fleet's queues, by state",
        labels=["state"],
    )
    for state, n in sorted(by_state.items()):
        registered.add_metric([state], n)
    yield registered
    fresh = GaugeMetricFamily(
        "vmpool_workers_alive",
        f"Workers of the fleet whose RQ heartbeat is under {WORKER_TTL_S:g} s old",
    )
    fresh.add_metric([], alive)
    yield fresh
    yield busy_family(busy)


def _worker_beats(raw: redis.Redis, keys: Keys) -> list[tuple[str, float | None]]:
    """The state and last heartbeat (Unix time) of each worker registered on a fleet queue.

    Two pipelines. A registration whose worker hash is gone is skipped."""
    pipe = raw.pipeline(transaction=False)
    for short in QUEUES:
        pipe.smembers(WORKERS_BY_QUEUE_KEY % keys.queue(short))
    worker_keys = sorted({_text(k) for members in pipe.execute() for k in members})
    pipe = raw.pipeline(transaction=False)
    for key in worker_keys:
        pipe.hmget(key, "birth", "state", "last_heartbeat")
    out: list[tuple[str, float | None]] = []
    for birth, state, beat in pipe.execute() if worker_keys else []:
        if birth is None:
            continue
        # RQ writes the state only once the worker starts working ("?" before, as RQ)
        out.append((_text(state) if state is not None else "?", _heartbeat(beat)))
    return out


def _heartbeat(value: Any) -> float | None:
    if not value:
        return None
    try:
        return utcparse(_text(value)).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

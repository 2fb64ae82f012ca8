"""The dashboard's data: vmpooler's two stats endpoints and the live page's feed.

Reads only, run in the API's thread pool, each a few round trips whatever the number of
requests or VMs (counts of the pool indexes, the history ring's last hour, the first
open requests, the capped failure list). The history is vmpool's own
(vmpool.state.history, written by the ``record_history`` job); a pool whose history has
not begun yet has a shorter ``history``, never invented points.

vmpooler's shapes (lib/vmpooler/api/dashboard.rb):

- ``/dashboard/stats/vmpooler/pool``: ``{"<pool>": {"size": N, "ready": N}}``; with
  ``?history=1`` each entry also has ``"history"``: its ready counts over the last hour,
  one a minute, oldest first.
- ``/dashboard/stats/vmpooler/running``: ``{"<major>": {"running": N}}``, the pools grouped
  by the name before their first ``-`` (a name without one is its own group); with
  ``?history=1`` a ``"history"`` of the group's running counts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vmpool.api.deps import ApiState
from vmpool.config import PoolConfig
from vmpool.lifecycle.overrides import pools_with_overrides
from vmpool.state import reads
from vmpool.state.history import Point, minute_of, per_minute, read_series, series_of
from vmpool.state.pool_failures import latest_failures, read_pool_failures
from vmpool.state.records import RequestRecord, text
from vmpool.state.transitions import VMState

__all__ = [
    "HISTORY_MINUTES",
    "live_feed",
    "major_of",
    "pool_stats",
    "running_stats",
    "site_name",
]

HISTORY_MINUTES: Final = 60  # the last hour, as vmpooler's graphs (Graphite's from=-1hour)
REQUESTS_SHOWN: Final = 25  # open requests the page lists (the count says how many in all)
FAILURES_SHOWN: Final = 20
_TAG: Final = re.compile(r"<[^>]*>")


def site_name(st: ApiState) -> str:
    """``:config: site_name`` as text: vmpooler's may hold HTML (``<b>vmpooler</b>``)."""
    return _TAG.sub("", st.config.site_name).strip() or "vmpool"


def major_of(pool: str) -> str:
    """vmpooler's group of a pool: its name before the first ``-``."""
    return pool.split("-", 1)[0]


def _history(st: ApiState, pools: Sequence[str]) -> dict[str, list[Point | None]]:
    now = minute_of(st.store.server_time())
    return read_series(st.clients.text, st.keys, pools, HISTORY_MINUTES, now)


def _live_pools(st: ApiState) -> dict[str, PoolConfig]:
    """The configured pools with their sizes as set at runtime (as /status)."""
    return pools_with_overrides(st.clients.text, st.keys, st.config)


def pool_stats(st: ApiState, history: bool) -> dict[str, Any]:
    """GET /dashboard/stats/vmpooler/pool."""
    pools = _live_pools(st)
    counts = st.store.pool_counts(pools)
    out: dict[str, Any] = {
        name: {"size": pool.size, "ready": counts[name][VMState.READY]}
        for name, pool in pools.items()
    }
    if history:
        for name, series in series_of(_history(st, list(pools)), "ready").items():
            out[name]["history"] = series
    return out


def running_stats(st: ApiState, history: bool) -> dict[str, Any]:
    """GET /dashboard/stats/vmpooler/running."""
    counts = st.store.pool_counts(st.config.pools)
    out: dict[str, Any] = {}
    for name in st.config.pools:
        group = out.setdefault(major_of(name), {"running": 0})
        group["running"] += counts[name][VMState.RUNNING]
    if history:
        points = _history(st, list(st.config.pools))
        for major in out:
            members = {p: s for p, s in points.items() if major_of(p) == major}
            out[major]["history"] = summed(members, "running")
    return out


def summed(points: Mapping[str, Sequence[Point | None]], field: str) -> list[int]:
    """The pools' series of ``field`` added up minute by minute.

    A pool's gap repeats its point before; the sum starts at the first minute any pool
    has a point."""
    span = max((len(series) for series in points.values()), default=0)
    total: list[int | None] = [None] * span
    for series in points.values():
        last: int | None = None
        for i, point in enumerate(series):
            last = int(getattr(point, field)) if point is not None else last
            if last is not None:
                total[i] = (total[i] or 0) + last
    return _from_first(total)


def _from_first(values: Sequence[int | None]) -> list[int]:
    start = next((i for i, v in enumerate(values) if v is not None), len(values))
    return [v or 0 for v in values[start:]]


def live_feed(st: ApiState) -> dict[str, Any]:
    """What the live page shows, in one answer: pools, requests, failures, rates."""
    pools = _live_pools(st)
    counts = st.store.pool_counts(pools)
    now, failing = read_pool_failures(st.clients.text, st.keys, pools)
    points = read_series(st.clients.text, st.keys, pools, HISTORY_MINUTES, minute_of(now))
    ready = series_of(points, "ready")
    return {
        "site_name": site_name(st),
        "time": now,
        "pools": [
            {
                "name": name,
                "size": pool.size,
                "ready": counts[name][VMState.READY],
                "pending": counts[name][VMState.RESERVED] + counts[name][VMState.PENDING],
                "running": counts[name][VMState.RUNNING],
                "history": ready[name],
                "failures": failing[name].as_dict(now),
            }
            for name, pool in pools.items()
        ],
        "requests": _requests(st, now),
        "failures": [
            {**f.as_dict(), "age_s": round(max(0.0, now - f.time), 1)}
            for f in latest_failures(st.clients.text, st.keys, FAILURES_SHOWN)
        ],
        "rates": {
            "minutes": HISTORY_MINUTES,
            "created": per_minute(points, "created"),
            "destroyed": per_minute(points, "destroyed"),
        },
    }


def _requests(st: ApiState, now: float) -> dict[str, Any]:
    """The open requests (the first by failure deadline: the oldest), with their age."""
    r = st.clients.text
    pipe = r.pipeline(transaction=False)
    pipe.zcard(st.keys.open_requests)
    pipe.zrange(st.keys.open_requests, 0, REQUESTS_SHOWN - 1)
    total, ids = pipe.execute()
    pipe = r.pipeline(transaction=False)
    for rid in ids:
        reads.queue_request(pipe, st.keys, text(rid))
    replies = pipe.execute() if ids else []
    records = [reads.request_from(replies[i], replies[i + 1]) for i in range(0, len(replies), 2)]
    return {
        "open": int(total),
        "shown": [_request_row(rec, now) for rec in records if rec is not None],
    }


def _request_row(record: RequestRecord, now: float) -> dict[str, Any]:
    wanted: dict[str, dict[str, int]] = {}
    for slot in record.slots:
        entry = wanted.setdefault(slot.alias, {"want": 0, "ready": 0})
        entry["want"] += slot.want
        entry["ready"] += slot.have
    return {
        "request_id": record.id,
        "status": record.status,
        "age_s": round(max(0.0, now - record.created), 1),
        "pools": wanted,
    }

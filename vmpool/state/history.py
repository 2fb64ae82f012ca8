"""The dashboard's history: each pool's counts, one point a minute, for a day.

vmpooler draws its dashboard's graphs from Graphite. vmpool keeps the series itself, in
Redis: one hash per pool (``keys.pool_history``) used as a ring of :data:`MINUTES`
slots. The field is a minute's number (Unix minutes, Redis server time) modulo
:data:`MINUTES`; the value is that minute and the pool's counts then::

    "<minute> <ready> <running> <pending> <size> <created> <destroyed>"

``created`` and ``destroyed`` are the pool's running totals (``VMS_METRIC`` of
vmpool.state.counters, counted by the store's scripts): a minute's rate is the
difference between two points.

Writing a minute's slot replaces what it held, so the series has one point a minute
however often the writer runs (the ``record_history`` job; a second run within a
minute only refreshes the point). A slot holds its minute: one written a day or more
ago reads as a gap. Memory is bounded: :data:`MINUTES` short fields per pool (about
100 KB: Redis' MEMORY USAGE of a full day with six-digit totals), and the hash expires a
day after its last write, so a pool taken out of the config leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import redis

from vmpool.state.keys import Keys
from vmpool.state.records import text

__all__ = [
    "MINUTES",
    "Point",
    "minute_of",
    "per_minute",
    "read_series",
    "series_of",
    "write_points",
]

MINUTES: Final = 1440  # a day of points, one a minute


@dataclass(frozen=True)
class Point:
    """A pool's counts in one minute (``created``/``destroyed``: totals so far)."""

    minute: int
    ready: int
    running: int
    pending: int
    size: int
    created: int
    destroyed: int

    def packed(self) -> str:
        return " ".join(
            str(v)
            for v in (
                self.minute,
                self.ready,
                self.running,
                self.pending,
                self.size,
                self.created,
                self.destroyed,
            )
        )

    @classmethod
    def unpacked(cls, raw: str) -> Point:
        minute, ready, running, pending, size, created, destroyed = (int(v) for v in raw.split())
        return cls(minute, ready, running, pending, size, created, destroyed)


def minute_of(server_time: float) -> int:
    """The Unix minute of a server time (the series' clock)."""
    return int(server_time // 60)


def write_points(redis_client: redis.Redis, keys: Keys, points: Iterable[tuple[str, Point]]) -> int:
    """Write each (pool, point) into its pool's ring, in one round trip. Returns how many."""
    pipe = redis_client.pipeline(transaction=False)
    n = 0
    for pool, point in points:
        key = keys.pool_history(pool)
        pipe.hset(key, str(point.minute % MINUTES), point.packed())
        pipe.expire(key, MINUTES * 60)
        n += 1
    if n:
        pipe.execute()
    return n


def read_series(
    redis_client: redis.Redis, keys: Keys, pools: Iterable[str], minutes: int, now_minute: int
) -> dict[str, list[Point | None]]:
    """Each pool's last ``minutes`` points up to ``now_minute``, oldest first.

    One HMGET per pool, in one round trip. A minute without a point is None."""
    span = max(1, min(int(minutes), MINUTES))
    wanted = list(range(now_minute - span + 1, now_minute + 1))
    fields = [str(m % MINUTES) for m in wanted]
    names = list(pools)
    pipe = redis_client.pipeline(transaction=False)
    for pool in names:
        pipe.hmget(keys.pool_history(pool), fields)
    out: dict[str, list[Point | None]] = {}
    for pool, values in zip(names, pipe.execute() if names else [], strict=True):
        out[pool] = [_point(raw, minute) for raw, minute in zip(values, wanted, strict=True)]
    return out


def _point(raw: object, minute: int) -> Point | None:
    """The slot's point if it holds ``minute`` (else it is older: a gap)."""
    if raw is None:
        return None
    try:
        point = Point.unpacked(text(raw))
    except ValueError:
        return None
    return point if point.minute == minute else None


def series_of(points: Mapping[str, list[Point | None]], field: str) -> dict[str, list[int]]:
    """One field of each pool's points, oldest first, from the pool's first point on.

    A gap after it repeats the point before it, as vmpooler fills a missing Graphite
    point."""
    out: dict[str, list[int]] = {}
    for pool, series in points.items():
        values: list[int] = []
        for point in series:
            if point is not None:
                values.append(int(getattr(point, field)))
            elif values:
                values.append(values[-1])
        out[pool] = values
    return out


def per_minute(points: Mapping[str, list[Point | None]], field: str) -> list[int]:
    """A running total's increase minute by minute, over all pools, oldest first.

    From the first minute any pool has a point before it on. A minute next to a gap
    counts 0, and so does a total that went down (a counter reset)."""
    span = max((len(series) for series in points.values()), default=1)
    out: list[int | None] = [None] * max(0, span - 1)
    for series in points.values():
        for i in range(1, len(series)):
            before, now = series[i - 1], series[i]
            if before is not None and now is not None:
                rise = max(0, int(getattr(now, field)) - int(getattr(before, field)))
                out[i - 1] = (out[i - 1] or 0) + rise
    start = next((i for i, v in enumerate(out) if v is not None), len(out))
    return [v or 0 for v in out[start:]]

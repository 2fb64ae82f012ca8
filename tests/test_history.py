"""The dashboard's history (vmpool/state/history.py, the record_history job): one point a
minute per pool, bounded to a day, against a real Redis."""

from __future__ import annotations

import redis

from vmpool import lifecycle
from vmpool.state.history import (
    MINUTES,
    Point,
    minute_of,
    per_minute,
    read_series,
    series_of,
    write_points,
)
from vmpool.state.keys import Keys

from lifecyclehelp import filled, make_fleet, warm_config


def point(minute: int, ready: int = 0, created: int = 0) -> Point:
    return Point(minute, ready, 0, 0, 3, created, 0)


def test_record_history_writes_one_point_a_minute_per_pool(redis_client: redis.Redis) -> None:
    """Proves: the job writes the pool's counts of this minute (ready, size, created
    total), and a second run in the same minute refreshes that point, not adds one."""
    fleet = make_fleet(redis_client, warm_config(3))
    filled(fleet)
    assert lifecycle.record_history(fleet) == 1
    assert lifecycle.record_history(fleet) == 1
    key = fleet.keys.pool_history("debian")
    assert redis_client.hlen(key) == 1
    assert 0 < redis_client.ttl(key) <= MINUTES * 60
    now = minute_of(fleet.store.server_time())
    series = read_series(redis_client, fleet.keys, ["debian"], 60, now)["debian"]
    assert len(series) == 60 and series[:-1] == [None] * 59
    last = series[-1]
    assert last is not None and (last.ready, last.size, last.created) == (3, 3, 3)


def test_the_ring_holds_a_day_and_no_more(redis_client: redis.Redis) -> None:
    """Proves the bound: two days of points leave one field per minute of a day, and a
    slot last written a day ago reads as a gap, not as today's."""
    keys = Keys("t")
    start = 28_000_000
    end = start + 2 * MINUTES  # the last point's minute is end - 1
    write_points(redis_client, keys, [("p", point(m, ready=m % 7)) for m in range(start, end)])
    assert redis_client.hlen(keys.pool_history("p")) == MINUTES
    now = end - 1 + 10  # ten minutes after the last point
    series = read_series(redis_client, keys, ["p"], 30, now)["p"]
    assert series[-10:] == [None] * 10
    assert [p.minute for p in series[:20] if p is not None] == list(range(now - 29, now - 9))


def test_series_fill_gaps_and_rates_are_differences() -> None:
    points: dict[str, list[Point | None]] = {
        "a": [None, point(1, ready=2, created=5), None, point(3, ready=4, created=9)],
        "b": [point(0, created=1), point(1, created=2), point(2, created=2), None],
    }
    assert series_of(points, "ready") == {"a": [2, 2, 4], "b": [0, 0, 0, 0]}
    # a: no pair of neighbours; b: +1 then +0, then a gap
    assert per_minute(points, "created") == [1, 0, 0]

"""GET /summary and /summary/<route>/<key>: vmpooler's daily statistics
(lib/vmpooler/api/helpers.rb get_task_metrics / get_task_summary / get_tag_summary),
their days (the scripts' UTC date) and vmpooler's date checks."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import redis

from vmpool.api.summary import summary_body, task_summary
from vmpool.state.counters import lua_metrics
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.transitions import lua_tables

from apihelp import make_client, spec_config

V = "/api/v3"


def test_task_summary_keeps_vmpoolers_arithmetic() -> None:
    """Two days of boots in two pools: totals add up; per pool, min/max/average come
    from each day's minimum and maximum (vmpooler's quirk: the average is their mean);
    the range has no top-level min/max (vmpooler reads them with string keys: never)."""
    days = {
        "2024-01-01": {"p1:a": "10.00", "p1:b": "30.00", "p2:c": "5.00"},
        "2024-01-02": {"p1:d": "20.00"},
        "2024-01-03": {},
    }
    out = task_summary("boot", days)
    assert out["boot"]["count"] == {"total": 4, "pool": {"p1": {"total": 3}, "p2": {"total": 1}}}
    p1 = out["boot"]["duration"]["pool"]["p1"]
    assert p1 == {"total": 60.0, "min": 10.0, "max": 30.0, "average": (10 + 30 + 20 + 20) / 4}
    assert out["boot"]["duration"]["total"] == 65.0 and "min" not in out["boot"]["duration"]
    day1 = out["daily"][0]["boot"]
    assert list(day1["duration"]) == ["average", "min", "max", "total", "pool"]
    assert day1["duration"]["average"] == 15.0 and day1["duration"]["max"] == 30.0
    assert out["daily"][2]["boot"] == {
        "duration": {"average": 0, "min": 0, "max": 0, "total": 0},
        "count": {"total": 0},
    }
    only = task_summary("boot", days, "count")
    assert set(only["boot"]) == {"count"} and set(only["daily"][0]["boot"]) == {"count"}


def test_summary_body_orders_its_keys_as_vmpooler() -> None:
    days = {t: {"2024-01-01": {}} for t in ("boot", "clone")}
    body = summary_body({**days, "tag": {"2024-01-01": {"vm1:project": "x", "vm2:project": "x"}}})
    assert list(body) == ["daily", "boot", "clone", "tag"]
    assert body["tag"] == {"project": {"x": 2, "total": 2}}
    assert list(body["daily"][0]) == ["date", "boot", "clone", "tag"]


def test_the_scripts_date_is_the_utc_date(redis_client: redis.Redis) -> None:
    """The scripts' day (days-from-civil in Lua) equals Python's UTC date, across
    leap days, month and year ends and centuries."""
    keys = Keys()
    prelude = lua_tables() + lua_metrics(keys) + read_script("vmpool.state.scripts",
                                                             "_prelude.lua")  # fmt: skip
    script = redis_client.register_script(prelude + "return utc_date(tonumber(ARGV[5]))\n")
    args = [keys.pool_state_prefix(), keys.vm_prefix(), "test", ""]
    start = datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    for t in [start + d * 86400 + s for d in range(0, 40000, 97) for s in (0, 1)] + [0, 951782400]:
        expected = datetime.fromtimestamp(t, UTC).date().isoformat()
        assert script(keys=[], args=[*args, repr(t)]) == expected


def test_summary_routes_and_date_checks(redis_url: str, redis_client: redis.Redis) -> None:
    """vmpooler's /summary/<route>/<key> and its 400s (as JSON here), 404 for another
    route; a range reads each day's hash."""
    client = make_client(spec_config(), redis_url)[0]
    keys = Keys()
    today = datetime.fromtimestamp(float(redis_client.time()[0]), UTC).date()
    yesterday = (today - timedelta(days=1)).isoformat()
    redis_client.hset(keys.summary_day("boot", yesterday), "pool1:vm-a", "12.50")
    redis_client.hset(keys.summary_day("tag", yesterday), "vm-a:project", "x")
    r = client.get(f"{V}/summary/boot/count?from={yesterday}")
    assert r.status_code == 200
    assert r.json()["boot"] == {"count": {"total": 1, "pool": {"pool1": {"total": 1}}}}
    assert [d["date"] for d in r.json()["daily"]] == [yesterday, today.isoformat()]
    r = client.get(f"{V}/summary/tag?from={yesterday}")
    assert r.json()["tag"] == {"project": {"x": 1, "total": 1}}
    assert client.get(f"{V}/summary/nosuch").status_code == 404
    tomorrow = (today + timedelta(days=1)).isoformat()
    for query, message in (
        ("from=2024-1-1", "Invalid date format '2024-1-1', must match YYYY-MM-DD."),
        (f"from={today}&to={yesterday}", "Date range is invalid, 'to' cannot come before 'from'."),
        (f"from={tomorrow}&to={tomorrow}", "Date range is invalid, 'from' must be in the past."),
        ("from=2024-02-30", "Invalid date format '2024-02-30', must match YYYY-MM-DD."),
    ):
        r = client.get(f"{V}/summary?{query}")
        assert r.status_code == 400 and r.json() == {"ok": False, "message": message}
    far = (today - timedelta(days=400)).isoformat()
    assert client.get(f"{V}/summary?from={far}").status_code == 400
    assert date.fromisoformat(yesterday) < today

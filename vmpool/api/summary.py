"""vmpooler's run-time statistics (GET /summary, GET /summary/<route>/<key>).

Computed as vmpooler 3.9's helpers compute them (``get_task_metrics``,
``get_task_summary``, ``get_tag_summary`` in lib/vmpooler/api/helpers.rb), from the
daily hashes the store's scripts keep (``Keys.summary_day``: boot and clone
``POOL:VM -> seconds``, tag ``VM:TAG -> value``), written by _prelude.lua's
``count_vm_move`` and tag_vm.lua.

Pure functions of those hashes: the router reads them and replies. vmpooler's quirks
are kept, so that dashboards built on it read the same numbers: a range's ``min``,
``max`` and ``average`` exist only per pool and come from each day's per-pool minimum
and maximum (their ``average`` is the mean of those, not of every boot). A day with
nothing has zeros and no ``pool`` entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from typing import Any

__all__ = [
    "MAX_DAYS",
    "day_range",
    "summary_body",
    "tag_metrics",
    "tag_summary",
    "task_metrics",
    "task_summary",
]

Day = Mapping[str, str]  # one day's hash, as Redis returns it
MAX_DAYS = 366  # the longest from..to range one call may read (vmpooler has no bound)


def day_range(start: date, end: date) -> list[str]:
    return [(start + timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def _mean(values: Sequence[float]) -> float:
    total = sum(values)
    return total / len(values) if total > 0 and values else 0


def _split_pool(field: str) -> str:
    return field.split(":", 1)[0] if ":" in field else "unknown"


def task_metrics(day: Day, only: str | None = None) -> dict[str, Any]:
    """One day of a task (vmpooler's get_task_metrics with ``bypool``)."""
    task: dict[str, Any] = {
        "duration": {"average": 0, "min": 0, "max": 0, "total": 0},
        "count": {"total": len(day)},
    }
    if day:
        by_pool: dict[str, list[float]] = {}
        for field, value in day.items():
            by_pool.setdefault(_split_pool(field), []).append(float(value))
        task["count"]["pool"] = {p: {"total": len(v)} for p, v in by_pool.items()}
        pools: dict[str, Any] = {}
        for pool, times in by_pool.items():
            total = float(sum(times))
            pools[pool] = {
                "total": total,
                "average": round(total / len(times), 1),
                "min": min(times),
                "max": max(times),
            }
        times = [float(v) for v in day.values()]
        duration = task["duration"]
        duration["pool"] = pools
        duration["total"] = float(sum(times))
        duration["average"] = round(duration["total"] / len(times), 1)
        duration["min"], duration["max"] = min(times), max(times)
    if only:
        task = {k: v for k, v in task.items() if k == only}
    return task


def task_summary(name: str, days: Mapping[str, Day], only: str | None = None) -> dict[str, Any]:
    """A task over ``days`` (date -> hash, in order): vmpooler's get_task_summary."""
    daily: list[dict[str, Any]] = [
        {"date": d, name: task_metrics(h, only)} for d, h in days.items()
    ]
    totals: dict[str, Any] = {}
    pool_data: dict[str, dict[str, list[float]]] = {}
    for entry in daily:
        for kind, metrics in entry[name].items():
            out = totals.setdefault(kind, {})
            out["total"] = out.get("total", 0) + metrics["total"]
            out.setdefault("pool", {})
            data = pool_data.setdefault(kind, {})
            for pool, values in metrics.get("pool", {}).items():
                slot = out["pool"].setdefault(pool, {})
                slot["total"] = slot.get("total", 0) + values["total"]
                extremes = [values[k] for k in ("min", "max") if k in values]
                if extremes:
                    data.setdefault(pool, []).extend(extremes)
    for kind, out in totals.items():
        for pool, slot in out["pool"].items():
            found = pool_data[kind].get(pool)
            if found:
                slot["min"], slot["max"] = min(found), max(found)
                slot["average"] = _mean(found)
    return {name: totals, "daily": daily}


def tag_metrics(day: Day, only: str | None = None) -> dict[str, Any]:
    """One day of tags: tag -> value -> count, and its ``total`` (get_tag_metrics)."""
    tags: dict[str, dict[str, int]] = {}
    for field, value in day.items():
        tag = field.split(":", 1)[1] if ":" in field else "unknown"
        if only and tag != only:
            continue
        counts = tags.setdefault(tag, {})
        counts[value] = counts.get(value, 0) + 1
        counts["total"] = counts.get("total", 0) + 1
    return tags


def tag_summary(days: Mapping[str, Day], only: str | None = None) -> dict[str, Any]:
    """Tags over ``days``: vmpooler's get_tag_summary."""
    daily: list[dict[str, Any]] = [
        {"date": d, "tag": tag_metrics(h, only)} for d, h in days.items()
    ]
    totals: dict[str, dict[str, int]] = {}
    for entry in daily:
        for tag, counts in entry["tag"].items():
            out = totals.setdefault(tag, {})
            for key, n in counts.items():
                out[key] = out.get(key, 0) + n
    return {"tag": totals, "daily": daily}


def summary_body(days: Mapping[str, Mapping[str, Day]]) -> dict[str, Any]:
    """GET /summary: ``days`` is task (boot, clone, tag) -> date -> hash."""
    boot = task_summary("boot", days["boot"])
    clone = task_summary("clone", days["clone"])
    tag = tag_summary(days["tag"])
    daily: dict[str, dict[str, Any]] = {}
    for part, key in ((boot, "boot"), (clone, "clone"), (tag, "tag")):
        for entry in part["daily"]:
            daily.setdefault(entry["date"], {})[key] = entry[key]
    return {
        "daily": [
            {"date": d, "boot": v.get("boot"), "clone": v.get("clone"), "tag": v.get("tag")}
            for d, v in daily.items()
        ],
        "boot": boot["boot"],
        "clone": clone["clone"],
        "tag": tag["tag"],
    }

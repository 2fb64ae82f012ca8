"""Queue position and ETA: how far the ETA a pending request is shown is from when it
turns ready, with the fleet loaded past its capacity.

    .venv/bin/python bench/eta.py [--seconds 120] [--load 1.2] [--calibrate 40]

Runs the whole fleet with ``vmpool up`` (its Redis, API, 2 workers, schedulers; the
simulated provider: a create takes 1 s and holds a clone slot, a boot 1.5-2.5 s; clone
limit 2; no warm pool, so every request is cloned and waits its turn at the clone
limit). First its capacity is measured for ``--calibrate`` seconds: the pace at which
requests start (their first VM reserved: the ``started`` time the store records, Redis
server time) while a short line of them waits (:func:`calibrate`). Then one-VM requests
are posted through the API at ``--load`` times that pace for ``--seconds``, evenly
spaced; each is read with GET right after its POST (the ETA a client sees first), and
again every ``--poll`` seconds while it is pending. Once all are ready: for every read,
the predicted ready time (server time of the read + ``eta_s``) against the request's
ready time (its ``status_since``). The figures: the median and 90th percentile of the
absolute error, at the first read and over every read, with the mean wait for scale; and
the fleet's own measure of it (``vmpool_eta_error_seconds``, the ETA each request was
created with), read from Redis.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line  # noqa: E402
from _up import Up, wait_for  # noqa: E402

from vmpool.state.counters import READY_BUCKETS, bucket_field  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.store import Store  # noqa: E402

BACKLOG = 4  # requests kept waiting while the capacity is measured
CONFIG = """\
:providers:
  :simulated: {boot_seconds: [1.5, 2.5], create_latency_seconds: 1, seed: 5}
:config: {ondemand_request_ttl: 15, ondemand_clone_limit: 2, max_vm_retries: 1}
:pools:
  - {name: debian, template: debian-12, size: 0}
"""


def _call(port: int, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v3{path}", data=data, method=method,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=20) as reply:
        return reply.status, json.loads(reply.read())


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Reads:
    """The pending reads of the load: (request, server time of the read, eta_s, first)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, bool]] = []
        self.lock = threading.Lock()

    def read(self, port: int, store: Store, rid: str, first: bool) -> bool:
        """One GET; whether the request is still pending."""
        _, body = _call(port, "GET", f"/ondemandvm/{rid}")
        at = store.server_time()
        if body.get("ready") or "position" not in body:
            return False
        if body.get("eta_s") is not None:
            with self.lock:
                self.rows.append((rid, at, float(body["eta_s"]), first))
        return True


def calibrate(port: int, store: Store, seconds: float) -> float:
    """The fleet's pace with a short line: for ``seconds``, a request is posted whenever
    fewer than :data:`BACKLOG` wait (posted, not yet started), and the pace is the
    requests started per second over the second half of that time (the first half fills
    the line). A burst of many requests at once would measure a slower pace than the
    fleet keeps with a short line (every provision round then walks the whole backlog),
    and 1.2 times that would not load the fleet past its capacity."""
    rids: list[str] = []
    waiting: set[str] = set()
    begin, end = store.server_time(), time.monotonic() + seconds
    while time.monotonic() < end:
        waiting = {r for r in waiting if not _field(store, r, "started")}
        for _ in range(BACKLOG - len(waiting)):
            rid = _call(port, "POST", "/ondemandvm", {"debian": 1})[1]["request_id"]
            rids.append(rid)
            waiting.add(rid)
        time.sleep(0.1)
    finish = store.server_time()
    half = begin + (finish - begin) / 2
    starts = [float(_field(store, r, "started") or "inf") for r in rids]
    started = sum(1 for at in starts if half <= at <= finish)
    wait_for(lambda: all(_field(store, r, "status") == "ready" for r in rids), 600, "the burst")
    return started / (finish - half)


def _field(store: Store, rid: str, name: str) -> str:
    return str(store.redis.hget(store.keys.request(rid), name) or "")


def load(
    port: int, store: Store, rate: float, seconds: float, poll_s: float
) -> tuple[list[str], Reads]:
    reads = Reads()
    rids: list[str] = []
    pollers: list[threading.Thread] = []

    def follow(rid: str) -> None:
        first = True
        while reads.read(port, store, rid, first):
            first = False
            time.sleep(poll_s)

    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        rid = _call(port, "POST", "/ondemandvm", {"debian": 1})[1]["request_id"]
        rids.append(rid)
        thread = threading.Thread(target=follow, args=(rid,), daemon=True)
        thread.start()
        pollers.append(thread)
        i += 1
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
    wait_for(lambda: all(_field(store, r, "status") == "ready" for r in rids), 600, "the load")
    for thread in pollers:
        thread.join(timeout=30)
    return rids, reads


def fleet_histogram_median(store: Store) -> float:
    """The median of the fleet's own ETA error histogram (its bucket's upper bound)."""
    raw = {k: float(v) for k, v in store.redis.hgetall(store.keys.eta_error_metric).items()}
    total = sum(v for k, v in raw.items() if k != "sum")
    seen = 0.0
    for bound in READY_BUCKETS:
        seen += raw.get(bucket_field(bound), 0.0)
        if seen >= total / 2:
            return bound
    return float("inf")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with Up(CONFIG, tag="eta") as up:
        port = up.port
        client = redis.Redis.from_url(up.redis_url, decode_responses=True)
        store = Store(client, Keys())
        capacity = calibrate(port, store, args.calibrate)
        client.delete(store.keys.eta_error_metric)  # the load's alone
        rate = args.load * capacity
        rids, reads = load(port, store, rate, args.seconds, args.poll)
        ready_at = {r: float(_field(store, r, "status_since")) for r in rids}
        created = {r: float(_field(store, r, "created")) for r in rids}
        started = {r: float(_field(store, r, "started") or ready_at[r]) for r in rids}
        fleet_median = fleet_histogram_median(store)
        client.close()
    first = [abs(ready_at[r] - (at + eta)) for r, at, eta, is_first in reads.rows if is_first]
    every = [abs(ready_at[r] - (at + eta)) for r, at, eta, _ in reads.rows]
    waits = [ready_at[r] - created[r] for r in rids]
    slowest = max(rids, key=lambda r: ready_at[r] - created[r])
    return {
        "capacity": capacity, "rate": rate, "requests": len(rids), "reads": len(every),
        "first_p50": _percentile(first, 0.5), "first_p90": _percentile(first, 0.9),
        "every_p50": _percentile(every, 0.5), "every_p90": _percentile(every, 0.9),
        "wait_mean": sum(waits) / len(waits), "wait_max": max(waits),
        "slowest_line": started[slowest] - created[slowest],
        "slowest_served": ready_at[slowest] - started[slowest],
        "fleet_p50_bucket": fleet_median,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--calibrate", type=float, default=40.0, help="seconds")
    parser.add_argument("--poll", type=float, default=5.0)
    args = parser.parse_args()
    print(machine_line({"seconds": f"{args.seconds:g}", "load": f"{args.load:g}x"}))
    m = measure(args)
    print()
    print(
        f"# capacity measured {m['capacity']:.2f} requests/s; posted {m['requests']} at"
        f" {m['rate']:.2f}/s; {m['reads']} pending reads; wait mean {m['wait_mean']:.1f} s,"
        f" max {m['wait_max']:.1f} s (in line {m['slowest_line']:.1f} s, then"
        f" {m['slowest_served']:.1f} s from its first VM reserved to ready)"
    )
    print()
    print("| ETA shown | median absolute error (s) | p90 (s) | reads |")
    print("|---|---|---|---|")
    rows = [
        ("at the first GET after the POST", m["first_p50"], m["first_p90"], m["requests"]),
        ("at every GET while pending", m["every_p50"], m["every_p90"], m["reads"]),
    ]
    for what, p50, p90, n in rows:
        print(f"| {what} | {p50:.1f} | {p90:.1f} | {n} |")
    print(
        f"\n# the fleet's own vmpool_eta_error_seconds: median in the bucket up to"
        f" {m['fleet_p50_bucket']:g} s; loadavg after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()

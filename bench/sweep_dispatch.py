"""check_pending_sweep: the old per-VM enqueue against the batched enqueue_many.

    .venv/bin/python bench/sweep_dispatch.py [--sizes 100,1000,5000] [--reps 3] [--aof]

Runs against a throw-away redis-server (``vmpool.local.redis_server.RedisServer``; no AOF
unless ``--aof``, which turns on vmpool's production ``appendfsync always``). For each
N, N pending VMs are made through the store's transitions (spread over two pools), then
``lifecycle.check_pending_sweep`` runs with each dispatcher, alternating, ``--reps``
times:

- ``cold``: no job queued yet, so every VM's check_pending_vm job is new;
- ``warm``: the sweep again right after, with every job still queued (workers behind):
  every enqueue is a duplicate, whose reclaim check runs.

Between reps the RQ keys are deleted (the VMs stay); one unrecorded rep warms up first.
Reported: the median wall time of one sweep, the client round trips it made (counted on
the redis-py connections), and the per-VM / batched ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line, server_version

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import RQDispatcher, enqueue
from workers.table import QUEUE_VMS

POOLS = ("debian", "centos")


class PerVMDispatcher(RQDispatcher):
    """The dispatch before batching: one enqueue() (several round trips) per subject."""

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        for subject in subjects:
            enqueue(self.conn, self.keys, job, subject)


class Counter:
    def __init__(self) -> None:
        self.n = 0
        counter = self

        class Counting(redis.Connection):
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.n += 1
                super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

        self.cls = Counting

    def client(self, url: str, decode: bool) -> redis.Redis:
        pool = redis.ConnectionPool.from_url(
            url, connection_class=self.cls, decode_responses=decode
        )
        return redis.Redis(connection_pool=pool)


def make_config() -> Config:
    data = {
        # checked VM by VM: this bench measures the per-VM dispatch (the listing sweep: targets)
        ":providers": {
            "sim": {"provider_class": "simulated", "boot_seconds": 0, "batch_status": False}
        },
        ":config": {"ondemand_request_ttl": 3600, "ondemand_clone_limit": 1000000},
        ":pools": [{"name": p, "template": p, "size": 0, "provider": "sim"} for p in POOLS],
    }
    return parse_config(data, source="bench", env={})


def make_pending(store: Store, config: Config, n: int) -> None:
    settings = RequestSettings.from_config(config)
    for p, pool in enumerate(POOLS):
        want = n // len(POOLS) + (1 if p < n % len(POOLS) else 0)
        rid = f"bench-{pool}"
        assert store.create_request(rid, [Slot(pool, pool, want)], settings, actor="b").ok
        for i in range(want):
            name = f"b-{pool}-{i:05d}"
            assert store.reserve_vm(
                rid, name=name, alias=pool, pool=pool, template=pool, provider="sim",
                domain=None, actor="b",
            ).ok  # fmt: skip
            assert store.vm_created(name, actor="b").ok


def clear_rq(conn: redis.Redis) -> None:
    """Delete every key of RQ's (the database is the bench's own)."""
    found = list(conn.scan_iter(match="rq:*", count=1000))
    for i in range(0, len(found), 1000):
        conn.unlink(*found[i : i + 1000])


def run(url: str, sizes: list[int], reps: int) -> list[dict[str, Any]]:
    config = make_config()
    keys = Keys(config.key_prefix)
    plain = redis.Redis.from_url(url)
    rows = []
    for n in sizes:
        plain.flushdb()
        store = Store(redis.Redis.from_url(url, decode_responses=True), keys)
        make_pending(store, config, n)
        fleets = {}
        for mode, cls in (("per_vm", PerVMDispatcher), ("batched", RQDispatcher)):
            counter = Counter()
            fleet = Fleet.build(
                counter.client(url, True), config, cls(counter.client(url, False), keys), "bench"
            )
            fleets[mode] = (fleet, counter)
        times: dict[tuple[str, str], list[float]] = {}
        trips: dict[tuple[str, str], int] = {}
        for rep in range(reps + 1):  # rep 0 warms up (connections, script loads), unrecorded
            for mode, (fleet, counter) in fleets.items():
                for phase in ("cold", "warm"):
                    if phase == "cold":
                        clear_rq(plain)
                    before = counter.n
                    start = time.perf_counter()
                    dispatched = lifecycle.check_pending_sweep(fleet)
                    elapsed = time.perf_counter() - start
                    assert dispatched == n, dispatched
                    assert plain.llen(keys.rq_queue(QUEUE_VMS)) == n
                    if rep:
                        times.setdefault((mode, phase), []).append(elapsed)
                        trips[(mode, phase)] = counter.n - before
        for phase in ("cold", "warm"):
            old = statistics.median(times[("per_vm", phase)])
            new = statistics.median(times[("batched", phase)])
            rows.append(
                {
                    "n": n,
                    "phase": phase,
                    "old_ms": old * 1e3,
                    "new_ms": new * 1e3,
                    "old_rt": trips[("per_vm", phase)],
                    "new_rt": trips[("batched", phase)],
                    "ratio": old / new,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--aof", action="store_true", help="appendonly yes, appendfsync always")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server = RedisServer(appendonly=args.aof).start()
    try:
        settings = {"aof": args.aof, "reps": args.reps}
        version = server_version(server.url)
        print(machine_line(settings, server=version, allocator=server.allocator))
        rows = run(server.url, sizes, args.reps)
    finally:
        server.stop()
    print(
        "| pending VMs | jobs | per-VM enqueue ms | enqueue_many ms | per-VM/batched"
        " | round trips per-VM | round trips batched |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {r['phase']} | {r['old_ms']:.1f} | {r['new_ms']:.1f} |"
            f" {r['ratio']:.1f}x | {r['old_rt']} | {r['new_rt']} |"
        )
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

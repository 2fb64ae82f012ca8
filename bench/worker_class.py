"""Forking Worker vs SimpleWorker, measured: no-op jobs and real vmpool jobs.

    .venv/bin/python bench/worker_class.py [--noop N] [--requests N]

Runs against a throw-away redis-server. For each class, one burst worker (built by
``workers.worker.build_worker``, so with vmpool's heartbeats and settings):
- ``noop``: N no-op jobs enqueued in one pipeline, then drained;
- ``real``: N one-VM requests (simulated provider, boot 0 s) created in the store and
  ``provision_request`` enqueued for each; the burst worker runs the whole chain
  (provision_request -> create_vm -> check_pending_vm: the request turns ready) until the queues
  are empty. jobs/s counts every job the worker ran.
Prints jobs/s per class and the SimpleWorker/Worker ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import redis
import rq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line, server_version

from vmpool.config import load_config
from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import enqueue
from workers.table import QUEUE_VMS
from workers.worker import build_worker

CONFIG = """
:providers:
  :simulated:
    boot_seconds: 0
:config:
  ondemand_request_ttl: 10
  ondemand_clone_limit: 100000
:schedule:
  check_pending_sweep: 1
:pools:
  - name: deb
    template: deb
    size: 0
    provider: simulated
"""


def run_noop(url: str, kind: str, n: int) -> float:
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    queue_name = Keys().queue(QUEUE_VMS)  # build_worker(config=None): the default prefix
    queue = rq.Queue(queue_name, connection=conn)
    with conn.pipeline() as pipe:
        for _ in range(n):
            queue.enqueue("workers.jobs.noop", result_ttl=0, pipeline=pipe)
        pipe.execute()
    worker = build_worker(url, None, [queue_name], kind=kind)
    start = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    elapsed = time.perf_counter() - start
    done = _jobs_done(conn, worker.key)
    assert done == n, done
    return n / elapsed


def run_real(url: str, kind: str, n: int, config_path: str) -> tuple[float, int]:
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    config = load_config(config_path)
    keys = Keys(config.key_prefix)
    store = Store(redis.Redis.from_url(url, decode_responses=True), keys)
    settings = RequestSettings.from_config(config)
    for i in range(n):
        rid = f"bench-{i}"
        assert store.create_request(rid, [Slot("deb", "deb", 1)], settings, actor="bench").ok
        enqueue(conn, keys, "provision_request", rid)
    worker = build_worker(url, config, kind=kind)  # all of the fleet's queues
    start = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    elapsed = time.perf_counter() - start
    ready = sum(
        1 for i in range(n) if (r := store.get_request(f"bench-{i}")) and r.status == "ready"
    )
    return _jobs_done(conn, worker.key) / elapsed, ready


def _jobs_done(conn: redis.Redis, worker_key: str) -> int:
    """Jobs the worker ran, from its Redis hash (a forking worker counts in the horse)."""
    fields = conn.hmget(worker_key, ["successful_job_count", "failed_job_count"])
    return sum(int(v or 0) for v in fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noop", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    server = RedisServer(appendonly=False).start()
    settings = {"noop": args.noop, "requests": args.requests}
    print(machine_line(settings, server=server_version(server.url), allocator=server.allocator))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(CONFIG)
    try:
        noop = {k: run_noop(server.url, k, args.noop) for k in ("fork", "simple")}
        real = {k: run_real(server.url, k, args.requests, f.name) for k in ("fork", "simple")}
    finally:
        server.stop()
        os.unlink(f.name)
    print("| workload | Worker (fork) jobs/s | SimpleWorker jobs/s | Simple/Worker |")
    print("|---|---|---|---|")
    print(
        f"| {args.noop} no-op jobs | {noop['fork']:.0f} | {noop['simple']:.0f} |"
        f" {noop['simple'] / noop['fork']:.1f}x |"
    )
    print(
        f"| {args.requests} one-VM requests (provision+create+check) | {real['fork'][0]:.0f}"
        f" | {real['simple'][0]:.0f} | {real['simple'][0] / real['fork'][0]:.1f}x |"
    )
    print(
        f"# requests ready: fork {real['fork'][1]}/{args.requests},"
        f" simple {real['simple'][1]}/{args.requests}"
    )


if __name__ == "__main__":
    main()

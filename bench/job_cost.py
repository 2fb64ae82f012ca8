"""What one job costs a worker: vmpool's worker against RQ's SimpleWorker, no-op jobs.

    .venv/bin/python bench/job_cost.py [--jobs 2000] [--runs 3]

Against a throw-away redis-server (no AOF), each run queues ``--jobs`` no-op vmpool jobs
(``workers.jobs.noop``, ``result_ttl=0`` as vmpool queues its jobs) in one pipeline and
drains them with one burst worker in this process: vmpool's (``build_worker``, no
Fleet), then a stock ``rq.SimpleWorker``. Per job: the worker process's CPU
(``time.process_time``, its threads included), the round trips it sent (client writes
counted on every connection), and jobs/s. The table shows min / median over the runs.
What a worker pays per job around the job itself: with batch jobs of a few VMs each,
a share of every VM's worker CPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import rq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _machine import machine_line

import workers.jobs  # noqa: F401  (imported before the clock runs, for both workers)
from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from workers.queues import queue_names
from workers.worker import build_worker

SENT = [0]
_SEND = redis.Connection.send_packed_command


def _counting(self: redis.Connection, command: Any, check_health: bool = True) -> None:
    SENT[0] += 1
    _SEND(self, command, check_health)


def drain(url: str, jobs: int, worker: Callable[[redis.Redis, rq.Queue], Any]) -> tuple[float, ...]:
    """Queue ``jobs`` no-op jobs, drain them: (CPU us per job, round trips per job, jobs/s)."""
    conn = redis.Redis.from_url(url)
    conn.flushall()
    queue = rq.Queue(queue_names(Keys())[0], connection=conn)
    with conn.pipeline() as pipe:
        for _ in range(jobs):
            queue.enqueue("workers.jobs.noop", result_ttl=0, pipeline=pipe)
        pipe.execute()
    runner = worker(conn, queue)
    SENT[0] = 0
    cpu, wall = time.process_time(), time.perf_counter()
    runner.work(burst=True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert queue.count == 0
    return 1e6 * cpu / jobs, SENT[0] / jobs, jobs / wall


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # RQ's lines per job: the same for both
    redis.Connection.send_packed_command = _counting  # type: ignore[method-assign]
    workers_by_name: dict[str, Callable[[redis.Redis, rq.Queue], Any]] = {
        "vmpool worker (SimpleWorker)": lambda c, q: build_worker(url, None, [q.name]),
        "rq SimpleWorker": lambda c, q: rq.SimpleWorker([q], connection=c),
    }
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name in workers_by_name}
    with RedisServer(appendonly=False) as server:
        url = server.url
        for _ in range(args.runs):
            for name, make in workers_by_name.items():
                results[name].append(drain(url, args.jobs, make))
    print(machine_line({"jobs": args.jobs, "runs": args.runs}))
    print("| worker | CPU us per job | round trips per job | jobs/s |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        cells = [f"{min(c):.0f} / {statistics.median(c):.0f}" for c in zip(*runs, strict=True)]
        cells[1] = f"{statistics.median(r[1] for r in runs):.2f}"
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

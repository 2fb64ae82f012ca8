"""End to end through the API: the fleet's VMs/s against RQ's no-op jobs/s, each driven
by the same concurrent client, side by side in one run.

    .venv/bin/python bench/e2e.py [--runs 3] [--vms 200] [--connections 8] [--poll 0.05]
        [--configs plain,aof_replica]

The client: ``--connections`` threads, each with its own connection, take their share
of the N units: each starts all of its units back to back, then polls them in the order
it started them, each until it is done (every ``--poll`` seconds while it is not). The
figure is N ÷ the wall time from the first start to the last done seen.

- RQ (the baseline): two stock RQ ``SimpleWorker`` (``rq worker -w
  rq.worker.SimpleWorker``) on a throw-away plain redis-server (no AOF); a unit is one
  no-op job (``Queue.enqueue`` of ``os.getpid``), done when its status reads
  ``finished``.
- the fleet: ``vmpool up --workers 2`` (the API with its access log, two workers, the
  scheduler; bench/_up.py) on a throw-away redis-server; the simulated provider, boot
  0 s, pools of size 0, so every request provisions a VM; otherwise the defaults
  (``--clone-limit`` sets ``ondemand_clone_limit``, 10 by default). A unit
  is a one-VM request (POST /api/v3/ondemandvm), done when GET
  /api/v3/ondemandvm/<id> says ``ready``.

Configurations of the fleet's Redis (``--configs``):

- ``plain``: the RQ baseline's own server (no AOF); durability ``auto`` (nothing to
  wait for).
- ``aof_replica``: ``appendonly yes, appendfsync always`` plus one replica (a second
  redis-server with ``replicaof``, AOF always too) and the safe durability: every write
  acknowledged once the replica holds it (``durability: replicas``, WAIT 1 per unit of
  work: what the default ``auto`` does through Sentinel with one replica).

Each run measures RQ, then each configuration, on fresh data (FLUSHALL); the table
shows min / median over ``--runs`` and each ratio run by run against that run's RQ.
Then, per configuration, where a VM's cost goes (the median run): the primary's Redis
commands and WAITs per VM (INFO commandstats; the client's polls included: each GET
is a confirmed read), and the CPU ms per VM of each part (the API, the workers, the
scheduler, ``vmpool up`` itself, the primary redis-server); and when its VMs got
ready, in seconds from the first POST (each request's ready time from its record): the
last POST answered, the first and the last VM ready, the last ready seen by a poll,
and the VMs/s from the first ready to the last.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import redis
import rq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line, server_version  # noqa: E402
from _up import BIN, Up, cpu_seconds, process_tree, wait_for  # noqa: E402

from vmpool.ids import DEFAULT_PREFIX  # noqa: E402
from vmpool.local.redis_server import RedisServer  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402

POOLS = ("debian", "centos")
CONFIG = """\
:providers:
  :simulated: {boot_seconds: 0}
:pools:
  - {name: debian, template: debian-12, size: 0}
  - {name: centos, template: centos-9, size: 0}
"""
SAFE_DURABILITY = ":redis: {durability: replicas}\n"
RQ_QUEUE = "bench-noop"
# The no-op job: a function with nothing to import (vmpool's workers.jobs.noop would
# cost each stock worker vmpool's whole import, seconds on a loaded machine, in its
# first job).
NOOP = "os.getpid"
ROLES = ("api", "worker", "scheduler")  # the `vmpool up` children, by their command
CONFIGS = {
    "plain": "plain Redis, durability auto (none: no replica)",
    "aof_replica": "AOF always + 1 replica, durability replicas (WAIT 1)",
}


class Session(Protocol):
    """One client connection: starts a unit, tells whether one is done."""

    def start(self, index: int) -> str: ...

    def done(self, unit: str) -> bool: ...


def drive(
    n: int,
    connections: int,
    session: Callable[[], Session],
    poll_s: float,
    seen: dict[str, tuple[float, float]] | None = None,
) -> float:
    """N ÷ (first start -> last done seen), N units over ``connections`` threads.

    ``seen``: filled with each unit's (started, done seen), in ``time.time()`` seconds
    (the clock a Redis server on this host stamps its trails with)."""
    barrier = threading.Barrier(connections)
    starts: list[float] = []
    ends: list[float] = []
    errors: list[BaseException] = []

    def one(first: int) -> None:
        try:
            client = session()
            barrier.wait()
            starts.append(time.perf_counter())
            units = []
            for i in range(first, n, connections):
                units.append((client.start(i), time.time()))
            for unit, started in units:
                while not client.done(unit):
                    time.sleep(poll_s)
                if seen is not None:
                    seen[unit] = (started, time.time())
            ends.append(time.perf_counter())
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if errors or len(ends) < connections:
        raise SystemExit(f"the client failed: {errors[:1] or 'a thread did not finish'}")
    return n / (max(ends) - min(starts))


class ApiSession:
    """POST a one-VM request; done when GET says ready. One HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if data else {}
        self.conn.request(method, f"/api/v3{path}", body=data, headers=headers)
        reply = self.conn.getresponse()
        text = reply.read()
        if reply.status >= 300:
            raise RuntimeError(f"{method} {path}: {reply.status} {text[:200]!r}")
        return dict(json.loads(text))

    def start(self, index: int) -> str:
        return str(self._call("POST", "/ondemandvm", {POOLS[index % 2]: "1"})["request_id"])

    def done(self, unit: str) -> bool:
        body = self._call("GET", f"/ondemandvm/{unit}")
        if body.get("ok") is False and "position" not in body and not body.get("ready"):
            raise RuntimeError(f"request {unit} failed: {body}")
        return bool(body.get("ready"))


class RqSession:
    """Enqueue one no-op job; done when its status reads finished. One Redis connection."""

    def __init__(self, url: str) -> None:
        self.conn = redis.Redis.from_url(url, max_connections=1)
        self.queue = rq.Queue(RQ_QUEUE, connection=self.conn)
        self.jobs: dict[str, rq.job.Job] = {}

    def start(self, index: int) -> str:
        job = self.queue.enqueue(NOOP, result_ttl=600)
        self.jobs[job.id] = job
        return str(job.id)

    def done(self, unit: str) -> bool:
        status = self.jobs[unit].get_status(refresh=True)
        if status == "failed":
            raise RuntimeError(f"job {unit} failed")
        return bool(status == "finished")


@contextmanager
def rq_workers(url: str) -> Iterator[None]:
    """Two stock RQ SimpleWorkers on ``url`` (queue RQ_QUEUE), stopped by pid."""
    command = [str(BIN / "rq"), "worker", "-w", "rq.worker.SimpleWorker", "-u", url, RQ_QUEUE]
    procs = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        client = redis.Redis.from_url(url)
        idle = lambda: [w.get_state() for w in rq.Worker.all(connection=client)]  # noqa: E731
        wait_for(lambda: idle() == ["idle", "idle"], 60, "the RQ workers in their dequeue")
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class ReplicaServer(RedisServer):
    """A redis-server (AOF always) that replicates ``primary``."""

    def __init__(self, primary: RedisServer) -> None:
        super().__init__(appendonly=True)
        self.primary = primary

    def command(self) -> list[str]:
        return [*super().command(), "--replicaof", self.primary.host, str(self.primary.port)]


@contextmanager
def aof_with_replica() -> Iterator[RedisServer]:
    """A primary (AOF always) and its replica, in sync; both stopped at the end."""
    primary = RedisServer(appendonly=True).start()
    replica: ReplicaServer | None = None
    try:
        replica = ReplicaServer(primary)
        replica.start()
        info = redis.Redis.from_url(replica.url).info
        wait_for(lambda: info("replication")["master_link_status"] == "up", 30, "the replica")
        yield primary
    finally:
        if replica is not None:
            replica.stop()
        primary.stop()


def cpu_by_role(pids: list[int]) -> dict[str, float]:
    """CPU seconds of ``pids`` by what each runs: api, worker, scheduler, redis, up."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = {w.decode(errors="replace") for w in argv}
        role = next((r for r in ROLES if r in words), "up")
        if any("redis-server" in w or "valkey-server" in w for w in words):
            role = "redis"
        out[role] = out.get(role, 0.0) + cpu_seconds(stat)
    return out


def fleet_rate(
    server: RedisServer, config: str, args: argparse.Namespace
) -> tuple[float, dict[str, float]]:
    """VMs/s, and the run's profile per VM: Redis commands, WAITs, CPU ms by role."""
    if args.clone_limit is not None:
        config += f":config: {{ondemand_clone_limit: {args.clone_limit}}}\n"
    client = redis.Redis.from_url(server.url)
    client.flushall()
    with Up(config, redis_url=server.url, tag="e2e") as up:
        assert server.process is not None
        pids = [*process_tree(up.pid), server.process.pid]
        client.config_resetstat()
        cpu0 = cpu_by_role(pids)
        seen: dict[str, tuple[float, float]] = {}
        rate = drive(args.vms, args.connections, lambda: ApiSession(up.port), args.poll, seen)
        cpu1 = cpu_by_role(pids)
        stats = client.info("commandstats")
        phases = timeline(client, seen)
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    profile = {f"{role} CPU ms": 1e3 * (cpu1[role] - cpu0.get(role, 0.0)) for role in cpu1}
    profile["commands"] = sum(calls.values())
    profile["WAIT"] = calls.get("wait", 0)
    return rate, {**{k: v / args.vms for k, v in profile.items()}, **phases}


def timeline(client: redis.Redis, seen: dict[str, tuple[float, float]]) -> dict[str, float]:
    """When the run's VMs got ready, from each request's ready time (its hash's
    ``status_since``, the server's clock): seconds from the first POST to the last POST
    answered, the first and the last ready, the last ready seen by the client's poll,
    and VMs/s from the first ready to the last (keys prefixed ``@``: not per VM)."""
    keys = Keys(DEFAULT_PREFIX)
    pipe = client.pipeline(transaction=False)
    for rid in seen:
        pipe.hget(keys.request(rid), "status_since")
    ready = sorted(float(r) for r in pipe.execute())
    t0 = min(started for started, _ in seen.values())
    span = ready[-1] - ready[0]
    return {
        "@last POST answered s": max(started for started, _ in seen.values()) - t0,
        "@first ready s": ready[0] - t0,
        "@last ready s": ready[-1] - t0,
        "@last ready seen s": max(done for _, done in seen.values()) - t0,
        "@VMs/s first to last ready": (len(ready) - 1) / span if span > 0 else 0.0,
    }


def rq_rate(url: str, args: argparse.Namespace) -> float:
    redis.Redis.from_url(url).flushall()
    with rq_workers(url):
        return drive(args.vms, args.connections, lambda: RqSession(url), args.poll)


def one_run(
    plain: RedisServer,
    replicated: RedisServer | None,
    args: argparse.Namespace,
    profiles: dict[str, list[dict[str, float]]],
) -> dict[str, float]:
    """One run's rates: RQ's, then each configuration's (its profile to ``profiles``)."""
    rates = {"rq": rq_rate(plain.url, args)}
    for name in args.configs:
        if name == "plain":
            rates[name], profile = fleet_rate(plain, CONFIG, args)
        else:
            assert replicated is not None
            rates[name], profile = fleet_rate(replicated, CONFIG + SAFE_DURABILITY, args)
        profiles.setdefault(name, []).append(profile)
    return rates


def mm(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(min(values))} / {fmt.format(statistics.median(values))}"


def report(
    runs: list[dict[str, float]],
    profiles: dict[str, list[dict[str, float]]],
    args: argparse.Namespace,
) -> None:
    print("| figure (min / median) | measured | ÷ RQ, run by run (min / median) |")
    print("|---|---|---|")
    rq_rates = [r["rq"] for r in runs]
    print(f"| RQ SimpleWorker no-op jobs/s (2 workers, plain Redis) | {mm(rq_rates)} | - |")
    for name in args.configs:
        rates = [r[name] for r in runs]
        ratios = [r[name] / r["rq"] for r in runs]
        print(
            f"| fleet VMs/s through the API, {CONFIGS[name]} | {mm(rates)} |"
            f" {mm(ratios, '{:.2f}')} |"
        )
    for name in args.configs:
        keys = sorted({k for p in profiles[name] for k in p})
        median = {k: statistics.median([p.get(k, 0.0) for p in profiles[name]]) for k in keys}
        shown = ", ".join(f"{k} {v:.1f}" for k, v in median.items() if k[0] != "@")
        print(f"# per VM, {name} (median of the runs): {shown}")
        phases = ", ".join(
            f"{k[1:]} {v:.0f}" if k.startswith("@VMs") else f"{k[1:].removesuffix(' s')} {v:.3f} s"
            for k, v in ((k, median[k]) for k in profiles[name][0] if k[0] == "@")
        )
        print(f"# from the first POST, {name} (median of the runs): {phases}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vms", type=int, default=200, help="units (VMs, jobs) per run")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between polls")
    parser.add_argument("--configs", default="plain,aof_replica")
    parser.add_argument(
        "--clone-limit", type=int, default=None, help="ondemand_clone_limit (default: vmpool's)"
    )
    args = parser.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    if unknown := set(args.configs) - set(CONFIGS):
        parser.error(f"unknown --configs {sorted(unknown)}; any of {', '.join(CONFIGS)}")
    with RedisServer(appendonly=False) as plain:
        settings = {"runs": args.runs, "vms": args.vms, "connections": args.connections}
        settings |= {"poll": f"{args.poll:g}s", "clone_limit": args.clone_limit or "default"}
        version = server_version(plain.url)
        print(machine_line(settings, server=version, allocator=plain.allocator))
        profiles: dict[str, list[dict[str, float]]] = {}
        if "aof_replica" in args.configs:
            with aof_with_replica() as replicated:
                runs = [one_run(plain, replicated, args, profiles) for _ in range(args.runs)]
        else:
            runs = [one_run(plain, None, args, profiles) for _ in range(args.runs)]
    report(runs, profiles, args)
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

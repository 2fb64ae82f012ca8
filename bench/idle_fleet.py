"""An idle fleet: its Redis commands and CPU beside RQ's own idle stack, and its wake-up.

    .venv/bin/python bench/idle_fleet.py [--runs 3] [--settle 10] [--window 30] [--wakes 5]
    .venv/bin/python bench/idle_fleet.py --only vmpool|rq [--settle 10] [--window 30]

vmpool: ``vmpool up --workers 2`` (its own Redis, the API, two workers, the scheduler),
three pools of size 0 on the simulated provider, the default ``:schedule:``, nothing
requested. RQ: a throw-away redis-server with two ``rq worker`` (their defaults) and
one ``rqscheduler -i 1`` (the one-second tick of ``vmpool scheduler``), nothing queued.
Each stack is started, left to settle for ``--settle`` seconds, then measured over
``--window`` seconds: the Redis commands (INFO commandstats from a CONFIG RESETSTAT, the
Lua scripts' own commands included, the benchmark's two left out) and the CPU time of
the stack's processes (Redis apart, from /proc). The stacks alternate, ``--runs`` times
each; the table shows min / median / max, and vmpool ÷ RQ run by run.

Then the idle fleet is woken ``--wakes`` times: each time, once its pending sweep has
parked (nothing reserved or booting), one one-VM request is posted through the API
(boots of 0.5-1.5 s). The figure is the gap from the VM up at the simulated cloud to the
VM recorded ready (what bench/ready_latency.py measures under load).

``--only`` runs one stack once, measured the same way, for an outside timer of the
whole process tree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import redis
import rq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line  # noqa: E402
from _up import BIN, Up, cpu_seconds, process_tree, wait_for  # noqa: E402

from vmpool.local.redis_server import RedisServer  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.store import Store  # noqa: E402

CONFIG = """\
:providers:
  :simulated: {boot_seconds: [0.5, 1.5], seed: 3}
:pools:
  - {name: debian, template: debian-12, size: 0}
  - {name: centos, template: centos-9, size: 0}
  - {name: ubuntu, template: ubuntu-24, size: 0}
"""
REDIS_NAMES = ("redis-server", "valkey-server")
BENCH_COMMANDS = ("cmdstat_config|resetstat", "cmdstat_info")


def _cpu_s(pids: list[int]) -> tuple[float, float]:
    """CPU seconds of ``pids``: (the stack's processes, its Redis)."""
    stack = server = 0.0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        seconds = cpu_seconds(stat)
        if comm in REDIS_NAMES:
            server += seconds
        else:
            stack += seconds
    return stack, server


def _commands(client: redis.Redis) -> tuple[int, dict[str, int]]:
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    for name in BENCH_COMMANDS:
        calls.pop(name.removeprefix("cmdstat_"), None)
    return sum(calls.values()), calls


def measure(client: redis.Redis, roots: list[int], window: float) -> dict[str, float | str]:
    """Commands/s, the stack's and Redis' CPU % of a core, the busiest commands."""
    pids = [pid for root in roots for pid in process_tree(root)]
    client.config_resetstat()
    cpu0, start = _cpu_s(pids), time.monotonic()
    time.sleep(window)  # the measured window itself
    total, calls = _commands(client)
    cpu1, elapsed = _cpu_s(pids), time.monotonic() - start
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
    return {
        "cmds": total / elapsed,
        "cpu": 100 * (cpu1[0] - cpu0[0]) / elapsed,
        "redis_cpu": 100 * (cpu1[1] - cpu0[1]) / elapsed,
        "top": " ".join(f"{name}={n / elapsed:.1f}" for name, n in top),
    }


class VmpoolStack:
    """``vmpool up --workers 2`` on its own Redis (bench/_up.py)."""

    def __init__(self) -> None:
        self.up = Up(CONFIG, tag="idle")
        self.port = self.up.port
        self.client = redis.Redis.from_url(self.up.redis_url, decode_responses=True)

    @property
    def roots(self) -> list[int]:
        return [self.up.pid]

    def wake_gaps(self, count: int) -> list[float]:
        """Up at the cloud -> ready, for ``count`` requests each posted to a parked sweep."""
        keys, gaps = Keys(), []
        store = Store(self.client, keys)
        for _ in range(count):
            wait_for(lambda: self.client.exists(keys.schedule_parked), 60, "the sweep to park")
            body = json.dumps({"debian": "1"}).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/api/v3/ondemandvm", data=body, method="POST",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(req, timeout=10) as reply:
                rid = str(json.loads(reply.read())["request_id"])
            ready = lambda rid=rid: (store.get_request(rid) or _NONE).status == "ready"  # noqa: E731
            wait_for(ready, 60, "the request to be ready")
            for vm in store.request_vms(rid):
                up_at = float(self.client.hget(keys.sim_vm(vm.provider, vm.name), "ready_at") or 0)
                assert vm.ready_at is not None and up_at
                gaps.append(vm.ready_at - up_at)
        return gaps

    def stop(self) -> None:
        self.client.close()
        self.up.stop()


class _NoRequest:
    status = ""


_NONE = _NoRequest()


class RqStack:
    """Two ``rq worker`` and one ``rqscheduler`` on a throw-away redis-server."""

    def __init__(self) -> None:
        self.server = RedisServer().start()
        url = self.server.url
        self.client = redis.Redis.from_url(url, decode_responses=True)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.procs = [
            *(subprocess.Popen([str(BIN / "rq"), "worker", "-u", url], **quiet) for _ in range(2)),
            subprocess.Popen([str(BIN / "rqscheduler"), "-u", url, "-i", "1"], **quiet),
        ]
        wait_for(lambda: len(rq.Worker.all(connection=redis.Redis.from_url(url))) == 2, 60, "rq")

    @property
    def roots(self) -> list[int]:
        assert self.server.process is not None
        return [self.server.process.pid, *(p.pid for p in self.procs)]

    def stop(self) -> None:
        self.client.close()
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.server.stop()


def run_once(kind: str, settle: float, window: float, wakes: int) -> dict[str, float | str]:
    stack: VmpoolStack | RqStack = VmpoolStack() if kind == "vmpool" else RqStack()
    try:
        time.sleep(settle)  # started, registered, first periodic runs over
        result = measure(stack.client, stack.roots, window)
        if isinstance(stack, VmpoolStack) and wakes:
            result["gaps"] = json.dumps(stack.wake_gaps(wakes))
        return result
    finally:
        stack.stop()


def _mmm(values: list[float], fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def report(runs: list[tuple[dict[str, float | str], dict[str, float | str]]]) -> None:
    def of(i: int, key: str) -> list[float]:
        return [float(pair[i][key]) for pair in runs]

    ratio = [float(v["cmds"]) / max(float(r["cmds"]), 1e-9) for v, r in runs]
    print("| figure (min / median / max) | vmpool | RQ's idle stack | vmpool ÷ RQ |")
    print("|---|---|---|---|")
    print(f"| Redis commands/s | {_mmm(of(0, 'cmds'))} | {_mmm(of(1, 'cmds'))} | {_mmm(ratio)} |")
    print(f"| CPU of its processes, % of a core | {_mmm(of(0, 'cpu'), '{:.2f}')} |"
          f" {_mmm(of(1, 'cpu'), '{:.2f}')} | - |")  # fmt: skip
    print(f"| CPU of Redis, % of a core | {_mmm(of(0, 'redis_cpu'), '{:.2f}')} |"
          f" {_mmm(of(1, 'redis_cpu'), '{:.2f}')} | - |")  # fmt: skip
    gaps = [g for v, _ in runs if "gaps" in v for g in json.loads(str(v["gaps"]))]
    if gaps:
        print(f"| parked sweep woken by a request: VM up → ready (s), {len(gaps)} VMs |"
              f" {_mmm(gaps, '{:.3f}')} | - | - |")  # fmt: skip
    middle = sorted(runs, key=lambda pair: float(pair[0]["cmds"]))[len(runs) // 2]
    print(f"\nvmpool's busiest commands/s (its median run): {middle[0]['top']}")
    print(f"RQ's: {middle[1]['top']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--wakes", type=int, default=5, help="wake-ups per vmpool run")
    parser.add_argument("--only", choices=("vmpool", "rq"), help="one stack, once")
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_once(args.only, args.settle, args.window, 0)))
        return
    settings = {"runs": args.runs, "window": f"{args.window:g}s", "settle": f"{args.settle:g}s"}
    print(machine_line(settings))
    print()
    runs = []
    for _ in range(args.runs):
        ours = run_once("vmpool", args.settle, args.window, args.wakes)
        theirs = run_once("rq", args.settle, args.window, 0)
        runs.append((ours, theirs))
    report(runs)
    print(f"\n# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

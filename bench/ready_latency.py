"""Ready latency: from a VM being up at its provider to its request answering ready.

    .venv/bin/python bench/ready_latency.py [--requests 100] [--rate 10]
        [--modes 2:vm,0.25:vm,0.25:list]

For each mode given (``check_pending_sweep`` interval ``:`` ``vm`` for a simulated
provider checked VM by VM (no list call), or ``list`` for the default
one, which answers the sweep for all booting VMs at once), runs the whole fleet with ``vmpool up``
(its Redis, API, 2 workers and schedulers; the simulated provider, boots of 0.5-1.5 s)
and posts one-VM requests through the API at ``--rate`` per second. Once all are ready it
reads, per VM, the server time the simulated cloud had it up (``ready_at`` of its record
at the provider) and the server time vmpool recorded it ready (``ready_at`` of the VM
record: the same transition turns its request ready, so a GET from then on answers
ready). The figure is the gap, p50 / p99 / max, as a ratio of the interval (the
baseline: a request is found ready by the next pending check), with the Redis commands
per second the whole fleet spent meanwhile (INFO commandstats) for the cost: measured
idle for ``--idle`` seconds first (workers, schedulers and sweeps with nothing to do),
then per VM above that idle rate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line  # noqa: E402

from vmpool.local.redis_server import free_port  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.store import Store  # noqa: E402

CONFIG = """\
:providers:
  :simulated: {{boot_seconds: [0.5, 1.5], seed: 3, batch_status: {listing}}}
:config: {{ondemand_request_ttl: 10, max_ondemand_instances_per_request: 5}}
:schedule: {{check_pending_sweep: {interval}}}
:pools:
  - {{name: debian, template: debian-12, size: 0}}
"""


def _post(port: int) -> str:
    body = json.dumps({"debian": "1"}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v3/ondemandvm", data=body, method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as reply:
        return str(json.loads(reply.read())["request_id"])


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    interval: float, listing: bool, requests: int, rate: float, idle_s: float
) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="vmpool-ready-"))
    cfg = work / "vmpool.yaml"
    cfg.write_text(CONFIG.format(interval=interval, listing=str(listing).lower()))
    port = free_port()
    log = (work / "up.log").open("wb")
    up = subprocess.Popen(
        [str(Path(sys.executable).parent / "vmpool"), "up", "--config", str(cfg),
         "--port", str(port), "--workers", "2"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        text = lambda: (work / "up.log").read_text(errors="replace")  # noqa: E731
        _wait(lambda: "redis://" in text(), 60, "vmpool up")
        match = re.search(r"redis://[^\s]+", text())
        assert match is not None
        client = redis.Redis.from_url(match.group(0), decode_responses=True)
        keys = Keys()
        store = Store(client, keys)
        _wait(lambda: _answers(port), 60, "the API")
        client.config_resetstat()
        time.sleep(idle_s)  # the fixed cost: a fleet with nothing to do
        idle_rate = _calls(client) / idle_s
        client.config_resetstat()
        start = time.monotonic()
        rids = []
        for i in range(requests):
            rids.append(_post(port))
            time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
        _wait(lambda: all(_status(store, r) == "ready" for r in rids), 120, "every request")
        elapsed = time.monotonic() - start
        calls = _calls(client)
        gaps = []
        for rid in rids:
            for vm in store.request_vms(rid):
                up_at = float(client.hget(keys.sim_vm(vm.provider, vm.name), "ready_at") or 0)
                assert vm.ready_at is not None and up_at
                gaps.append(vm.ready_at - up_at)
        client.close()
    finally:
        os.killpg(up.pid, 2)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, 9)
        log.close()
    return {
        "p50": _percentile(gaps, 0.5), "p99": _percentile(gaps, 0.99), "max": max(gaps),
        "cmds_per_s": calls / elapsed, "idle_per_s": idle_rate,
        "cmds_per_vm": (calls - idle_rate * elapsed) / len(gaps),
    }  # fmt: skip


def _calls(client: redis.Redis) -> int:
    return sum(int(v["calls"]) for v in client.info("commandstats").values())


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def _status(store: Store, rid: str) -> str:
    record = store.get_request(rid)
    return "" if record is None else record.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--modes", default="2:vm,0.25:vm,0.25:list")
    parser.add_argument("--idle", type=float, default=5.0)
    args = parser.parse_args()
    print(machine_line({"requests": args.requests, "rate": args.rate}))
    print()
    print(
        "| check_pending_sweep interval, provider | last VM up → ready: p50 / p99 / max (s)"
        " | p99 ÷ interval | Redis commands/s idle | commands per VM above idle |"
    )
    print("|---|---|---|---|---|")
    for mode in args.modes.split(","):
        interval_text, _, how = mode.partition(":")
        interval, listing = float(interval_text), how == "list"
        m = measure(interval, listing, args.requests, args.rate, args.idle)
        what = "one list call per sweep" if listing else "checked VM by VM"
        print(
            f"| {interval:g} s, {what} | {m['p50']:.3f} / {m['p99']:.3f} / {m['max']:.3f} |"
            f" {m['p99'] / interval:.2f} | {m['idle_per_s']:.0f} | {m['cmds_per_vm']:.0f} |"
        )
    print(f"\n# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""An idle `vmpool up --workers 2` does not poll Redis, and still takes new work at once.

The fleet is a real `vmpool up` (its own Redis, the API, two workers, the scheduler) with
three pools of size 0, the default ``:schedule:`` and nothing requested, as
bench/idle_fleet.py runs it. What this proves:
- idle, the fleet sends at most IDLE_COMMANDS_PER_S Redis commands a second, counted by
  the server (INFO commandstats, a script's own commands included) over a window once
  the pending sweep has parked. A polling dequeue (a pop of every queue each 5-50 ms per
  worker) or a pending sweep run at its 0.25 s interval alone exceeds it several times;
  an idle worker blocks on its queues' wake-up lists (a BLPOP of up to WAKE_WAIT_S,
  then one pop);
- a request posted to that idle fleet is taken at once: the request's job wakes a
  blocked worker, the reservation wakes the parked pending sweep, and the VM is recorded
  ready within WOKEN_S of being up at the simulated cloud, where the parked sweep's
  safety tick alone would take up to PARK_S.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from rq import Worker

from vmpool.state.keys import Keys
from vmpool.state.store import Store
from workers.schedule_park import PARK_S

from processhelp import Output
from storehelp import wait_until

pytestmark = pytest.mark.slow

CONFIG = """\
:providers:
  :simulated: {boot_seconds: [0.5, 1.5], seed: 3}
:pools:
  - {name: debian, template: debian-12, size: 0}
  - {name: centos, template: centos-9, size: 0}
  - {name: ubuntu, template: ubuntu-24, size: 0}
"""
WINDOW_S = 10.0
IDLE_COMMANDS_PER_S = 100.0  # the idle fleet's budget (a polling fleet sent about 690)
WOKEN_S = PARK_S / 6  # far below the safety tick: the reservation woke the sweep
WORKERS = 2


@dataclass
class UpFleet:
    api: str
    redis_url: str
    client: redis.Redis
    keys: Keys

    def workers(self) -> int:
        with redis.Redis.from_url(self.redis_url) as conn:  # RQ's own reads want bytes
            return len(Worker.all(connection=conn))

    def post(self, body: dict[str, str]) -> str:
        req = urllib.request.Request(
            f"{self.api}/api/v3/ondemandvm",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as reply:
            return str(json.loads(reply.read())["request_id"])


@pytest.fixture
def up_fleet(tmp_path: Path) -> Iterator[UpFleet]:
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "up", "--workers", str(WORKERS),
         "--port", "0", "--config", str(config), "--log-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
    )  # fmt: skip
    out = Output(proc.stdout)
    client: redis.Redis | None = None
    try:
        wait_until(lambda: "Ctrl-C stops everything" in out.text(), timeout=90, step=0.1)
        up = re.search(r"API (http://\S+)\s+Redis (redis://\S+)", out.text())
        assert up, out.text()
        client = redis.Redis.from_url(up.group(2), decode_responses=True)
        yield UpFleet(up.group(1), up.group(2), client, Keys())
    finally:
        if client is not None:
            client.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the supervisor, its children, its Redis
            proc.wait(10)


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT, this test's own left out."""
    stats = client.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    for own in ("config|resetstat", "info"):
        calls.pop(own, None)
    return calls


def test_an_idle_fleet_does_not_poll_and_wakes_for_a_request(up_fleet: UpFleet) -> None:
    client, keys = up_fleet.client, up_fleet.keys
    wait_until(lambda: up_fleet.workers() == WORKERS, timeout=60, step=0.2)
    wait_until(lambda: bool(client.exists(keys.schedule_parked)), timeout=60, step=0.2)
    client.config_resetstat()
    started = time.monotonic()
    time.sleep(WINDOW_S)  # the measured window of the idle fleet, not a synchronisation
    calls, elapsed = _commands(client), time.monotonic() - started
    rate = sum(calls.values()) / elapsed
    busiest = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
    assert rate <= IDLE_COMMANDS_PER_S, f"{rate:.0f} commands/s idle: {busiest}"
    assert calls.get("blpop", 0) > 0, busiest  # the workers' waits are blocks
    assert client.exists(keys.schedule_parked), "the pending sweep ran while idle"

    rid = up_fleet.post({"debian": "1"})
    store = Store(client, keys)
    wait_until(
        lambda: (record := store.get_request(rid)) is not None and record.status == "ready",
        timeout=60,
        step=0.1,
    )
    (vm,) = store.request_vms(rid)
    up_at = float(client.hget(keys.sim_vm(vm.provider, vm.name), "ready_at") or 0)
    assert up_at and vm.ready_at is not None
    assert vm.ready_at - up_at < WOKEN_S, f"ready {vm.ready_at - up_at:.2f} s after up"

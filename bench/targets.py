"""The target table of the batching work: each figure as a ratio against a baseline of the same run.

    .venv/bin/python bench/targets.py [--runs 3] [--vms 300] [--pending 1000,10000]
        [--open 100000] [--small-open 1000] [--aof]

Runs against a throw-away redis-server (``RedisServer``; no AOF unless ``--aof``, which
turns on ``appendonly yes, appendfsync always`` as ``vmpool up`` runs it). Every figure
is taken ``--runs`` times; the table shows min / median. Figures:

- fleet: 2 worker processes (vmpool's SimpleWorker) deliver N one-VM requests
  (simulated provider, boot 0 s) to ready, each request dispatched as POST
  /ondemandvm dispatches it; baseline: the same 2 workers running N RQ no-op jobs.
  Work is put on the queues before the workers start and released to them
  at once (RENAME) when both are listening. Also: Redis commands and server µs per VM.
- sweep: Redis server ms (INFO commandstats) of one check_pending_sweep with N pending
  VMs, cold (no job queued) and warm (every job still queued); baseline: a 1 s tick.
  For the listing sweep also its own worker wall ms, the list call apart (``TimedListing``:
  the call and the freeing of its answer, one ProviderVM per VM, are the listing's).
- transitions: create_request/s from one client; baseline: trivial EVALSHA/s.
- expiry: one sweep_expired expiring 100 requests among ``--small-open`` open (1,000)
  vs among ``--open`` (100,000), measured alternately.
- memory: Redis bytes per finished (ready) one-VM request, records + trail + indexes;
  baseline: bytes per open request.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import rq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line, server_version  # noqa: E402

from vmpool import lifecycle  # noqa: E402
from vmpool.config import Config, parse_config  # noqa: E402
from vmpool.ids import Job  # noqa: E402
from vmpool.lifecycle import Fleet, RecordingDispatcher  # noqa: E402
from vmpool.local.redis_server import RedisServer  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.records import RequestSettings, Slot  # noqa: E402
from vmpool.state.store import Store  # noqa: E402
from vmpool.state.workset import WorkSet  # noqa: E402
from workers.batching import BatchDispatcher  # noqa: E402
from workers.queues import RQDispatcher, wake_workers  # noqa: E402
from workers.table import queue_names  # noqa: E402

POOLS = ("debian", "centos")
WORKER_CODE = (
    "import sys; from vmpool.config import load_config; from workers.worker import build_worker;"
    "cfg = load_config(sys.argv[2]) if sys.argv[2] != '-' else None;"
    "build_worker(sys.argv[1], cfg).work(logging_level='WARNING')"
)


def config_data() -> dict[str, Any]:
    return {
        ":providers": {"sim": {"provider_class": "simulated", "boot_seconds": 0}},
        ":config": {"ondemand_request_ttl": 3600, "ondemand_clone_limit": 1000000},
        ":pools": [{"name": p, "template": p, "size": 0, "provider": "sim"} for p in POOLS],
    }


def make_config() -> Config:
    return parse_config(config_data(), source="bench", env={})


def server_stats(conn: redis.Redis) -> tuple[int, float]:
    """(commands, server µs) since the last CONFIG RESETSTAT."""
    stats = conn.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
    usec = sum(float(v["usec"]) for k, v in stats.items() if k != "cmdstat_config")
    return calls, usec


# -- fleet ------------------------------------------------------------------------------
def _hold_queues(conn: redis.Redis, keys: Keys) -> None:
    for q in queue_names(keys):
        if conn.exists(f"rq:queue:{q}"):
            conn.rename(f"rq:queue:{q}", f"bench:held:{q}")


def _release_queues(conn: redis.Redis, keys: Keys) -> None:
    with conn.pipeline(transaction=True) as pipe:
        for q in queue_names(keys):
            pipe.renamenx(f"bench:held:{q}", f"rq:queue:{q}")
            wake_workers(pipe, f"rq:queue:{q}")  # the workers block until a push wakes them
        pipe.execute(raise_on_error=False)


def _run_workers(url: str, cfg: str, done: Callable[[], bool], conn: redis.Redis) -> float:
    """Start 2 workers, release the held queues once both listen, time until ``done``."""
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER_CODE, url, cfg], cwd=ROOT) for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 60
        while conn.scard("rq:workers") < 2:
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        time.sleep(0.3)  # both in their dequeue
        conn.config_resetstat()
        start = time.perf_counter()
        _release_queues(conn, Keys())
        deadline = time.monotonic() + 600
        while not done():
            assert time.monotonic() < deadline, "fleet did not finish"
            time.sleep(0.01)
        return time.perf_counter() - start
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def fleet_noop(url: str, n: int) -> float:
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    keys = Keys()
    queue = rq.Queue(keys.queue("vms"), connection=conn)
    with conn.pipeline() as pipe:
        for _ in range(n):
            queue.enqueue("workers.jobs.noop", result_ttl=0, pipeline=pipe)
        pipe.execute()
    _hold_queues(conn, keys)

    def done() -> bool:
        return (
            conn.llen(f"bench:held:{keys.queue('vms')}") == 0
            and not any(conn.llen(f"rq:queue:{q}") for q in queue_names(keys))
            and _jobs_done(conn) >= n
        )

    return n / _run_workers(url, "-", done, conn)


def _jobs_done(conn: redis.Redis) -> int:
    total = 0
    for w in conn.smembers("rq:workers"):
        vals = conn.hmget(w, ["successful_job_count", "failed_job_count"])
        total += sum(int(v or 0) for v in vals)
    return total


def command_breakdown(conn: redis.Redis, per: int) -> str:
    """The commands since the last CONFIG RESETSTAT by kind, per ``per`` (most first)."""
    stats = conn.info("commandstats")
    rows = sorted(
        (
            (int(v["calls"]) / per, k.removeprefix("cmdstat_"))
            for k, v in stats.items()
            if k != "cmdstat_config"
        ),
        reverse=True,
    )
    return " ".join(f"{name}={calls:.1f}" for calls, name in rows if calls >= 0.05)


def fleet_real(
    url: str, n: int, cfg_path: str, breakdown: list[str] | None = None
) -> tuple[float, float, float]:
    """(VMs/s, commands per VM, server µs per VM); ``breakdown`` gets the commands per
    VM by kind."""
    conn = redis.Redis.from_url(url)
    conn.flushdb()
    config = make_config()
    keys = Keys(config.key_prefix)
    store = Store(redis.Redis.from_url(url, decode_responses=True), keys)
    settings = RequestSettings.from_config(config)
    rids = [f"bench-{i}" for i in range(n)]
    for i, rid in enumerate(rids):
        pool = POOLS[i % 2]
        assert store.create_request(rid, [Slot(pool, pool, 1)], settings, actor="bench").ok
    dispatch = BatchDispatcher(conn, keys)  # what POST /ondemandvm does, once per request
    for rid in rids:
        dispatch.send(Job.PROVISION_REQUEST, [rid])
    _hold_queues(conn, keys)
    finished = keys.requests_finished
    done = lambda: int(conn.hget(finished, "ready") or 0) >= n  # noqa: E731
    elapsed = _run_workers(url, cfg_path, done, conn)
    calls, usec = server_stats(conn)
    if breakdown is not None:
        breakdown.append(command_breakdown(conn, n))
    return n / elapsed, calls / n, usec / n


# -- sweep ------------------------------------------------------------------------------
# How a sweep meets its pending VMs: (dispatcher, provider lists?, row label).
SWEEP_MODES: dict[str, tuple[bool, bool, str]] = {
    "vm_rq": (False, False, "checked VM by VM, one RQ job per VM"),
    "vm_batch": (True, False, "checked VM by VM, work set + batch job"),
    "list": (True, True, "one list call (the default)"),
}


def sweep_config(listing: bool) -> Config:
    data = config_data()
    data[":providers"]["sim"].update(boot_seconds=3600, batch_status=listing)
    return parse_config(data, source="bench", env={})


def make_pending(url: str, config: Config, n: int) -> None:
    """``n`` VMs pending in the records and booting at the simulated cloud (an hour's
    boot), made by 4 client threads (the setup is not measured)."""
    keys = Keys(config.key_prefix)
    settings = RequestSettings.from_config(config)
    client = redis.Redis.from_url(url, decode_responses=True, max_connections=8)
    store = Store(client, keys)
    sim = Fleet.build(client, config, RecordingDispatcher(), "b").providers["sim"]
    work: list[tuple[str, str]] = []
    for p, pool in enumerate(POOLS):
        want = n // len(POOLS) + (1 if p < n % len(POOLS) else 0)
        rid = f"bench-{pool}"
        assert store.create_request(rid, [Slot(pool, pool, want)], settings, actor="b").ok
        work += [(pool, f"b-{pool}-{i:06d}") for i in range(want)]

    def make(item: tuple[str, str]) -> None:
        pool, name = item
        assert store.reserve_vm(
            f"bench-{pool}", name=name, alias=pool, pool=pool, template=pool, provider="sim",
            domain=None, actor="b",
        ).ok  # fmt: skip
        sim.create_vm(pool, pool, name)
        assert store.vm_created(name, actor="b").ok

    with ThreadPoolExecutor(4) as pool_:
        list(pool_.map(make, work))


def server_cpu_ms(conn: redis.Redis) -> float:
    """The Redis server process's CPU ms so far (INFO cpu: user + system).

    Unlike commandstats' µs, a script's commands are not counted twice (once in their
    own stats, once in the EVALSHA's)."""
    cpu = conn.info("cpu")
    return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e3


class TimedListing:
    """A provider's ``statuses`` (its list call) timed apart from the sweep that calls it.

    So that the sweep's own cost can be told from the simulated cloud's: per sweep, the
    list call's client wall ms and Redis server CPU ms, and the ms of this probe's own
    INFO reads (bench overhead, counted in neither). The answers are kept and freed
    after the sweep (:meth:`free`, timed as the list call's): the ProviderVM per VM
    the provider built is the listing's cost, not the sweep's."""

    def __init__(self, provider: Any, conn: redis.Redis) -> None:
        self.statuses = provider.statuses
        self.conn = conn
        self.wall_ms = self.server_ms = self.probe_ms = 0.0
        self.answers: list[Any] = []
        provider.statuses = self  # the instance's attribute: the sweep calls this

    def __call__(self, names: Any) -> Any:
        probe = time.perf_counter()
        before = server_cpu_ms(self.conn)
        start = time.perf_counter()
        try:
            answer = self.statuses(names)
            self.answers.append(answer)
            return answer
        finally:
            end = time.perf_counter()
            self.server_ms += server_cpu_ms(self.conn) - before
            self.wall_ms += (end - start) * 1e3
            self.probe_ms += (start - probe + time.perf_counter() - end) * 1e3

    def free(self) -> None:
        """Free the answers kept, timed as the list call's."""
        start = time.perf_counter()
        self.answers.clear()
        self.wall_ms += (time.perf_counter() - start) * 1e3

    def reset(self) -> None:
        self.answers.clear()
        self.wall_ms = self.server_ms = self.probe_ms = 0.0


def sweep_ms(url: str, n: int, runs: int) -> dict[str, dict[str, list[float]]]:
    """Per mode (:data:`SWEEP_MODES`): Redis server ms of one cold and one warm
    check_pending_sweep at ``n`` pending, per run, and the cold one's client wall ms.
    Cold: no job queued; warm: again at once (the per-VM modes' jobs still queued). For
    the listing mode, also the cold sweep's listing: its client wall and server ms."""
    plain = redis.Redis.from_url(url)
    plain.flushdb()
    make_pending(url, sweep_config(True), n)
    text = redis.Redis.from_url(url, decode_responses=True)
    out: dict[str, dict[str, list[float]]] = {}
    for mode, (batched, listing, _) in SWEEP_MODES.items():
        config = sweep_config(listing)
        keys = Keys(config.key_prefix)
        dispatcher = BatchDispatcher(plain, keys) if batched else RQDispatcher(plain, keys)
        fleet = Fleet.build(text, config, dispatcher, "bench")
        timed = TimedListing(fleet.providers["sim"], plain) if listing else None
        got: dict[str, list[float]] = {"cold": [], "warm": [], "cold_wall": []}
        for _ in range(runs):
            for rq_key in list(plain.scan_iter(match="rq:*", count=1000)):
                plain.unlink(rq_key)
            WorkSet(plain, keys).clear("check_pending_vm")
            for phase in ("cold", "warm"):
                if timed is not None:
                    timed.reset()
                plain.config_resetstat()
                start = time.perf_counter()
                assert lifecycle.check_pending_sweep(fleet) == (0 if listing else n)
                wall = time.perf_counter() - start
                got[phase].append(server_stats(plain)[1] / 1e3)
                if phase == "cold":
                    got["cold_wall"].append(wall * 1e3)
                if phase == "cold" and timed is not None:
                    got.setdefault("own", []).append(wall * 1e3 - timed.wall_ms - timed.probe_ms)
                    timed.free()
                    got.setdefault("list_wall", []).append(timed.wall_ms)
                    got.setdefault("list_server", []).append(timed.server_ms)
        out[mode] = got
    return out


# -- transitions ------------------------------------------------------------------------
def transitions(url: str, n: int, rounds: int = 10) -> tuple[float, float]:
    """(create_request/s, trivial EVALSHA/s) from one client, side by side: ``rounds``
    alternating slices of ``n / rounds`` calls each, so that both see the same load on a
    shared machine (one block after the other let a burst of load land on one alone)."""
    text = redis.Redis.from_url(url, decode_responses=True)
    text.flushdb()
    store = Store(text, Keys())
    settings = RequestSettings(ttl_s=3600)
    trivial = text.register_script("return 1")
    trivial()
    assert store.create_request("warm", [Slot("a", "a", 1)], settings, actor="b").ok
    per = max(1, n // rounds)
    t_trivial = t_create = 0.0
    for r in range(rounds):
        start = time.perf_counter()
        for _ in range(per):
            trivial()
        t_trivial += time.perf_counter() - start
        start = time.perf_counter()
        for i in range(per):
            store.create_request(f"t-{r}-{i}", [Slot("a", "a", 1)], settings, actor="b")
        t_create += time.perf_counter() - start
    return per * rounds / t_create, per * rounds / t_trivial


# -- expiry -----------------------------------------------------------------------------
def _open_requests(store: Store, n: int, tag: str, ttl: float) -> None:
    settings = RequestSettings(ttl_s=ttl)

    def one(i: int) -> None:
        assert store.create_request(f"{tag}-{i}", [Slot("a", "a", 1)], settings, actor="b").ok

    with ThreadPoolExecutor(4) as threads:  # setup, not measured
        list(threads.map(one, range(n)))


def expiry_ms(url: str, sizes: tuple[int, int], runs: int) -> dict[int, list[tuple[float, float]]]:
    """Per open count: (wall ms, Redis server ms) of sweep_expired expiring 100 due
    requests among that many open, per run. The two sizes live in two databases of one
    server and are measured alternately (small, big, small, ...), after a GC, so neither
    gets the quieter half of the run."""
    fleets: dict[int, tuple[Store, Fleet]] = {}
    for db, total in enumerate(sizes):
        text = redis.Redis.from_url(_db_url(url, db), decode_responses=True)
        text.flushdb()
        store = Store(text, Keys())
        _open_requests(store, total - 100, "open", 3600)
        fleets[total] = (store, Fleet.build(text, make_config(), RecordingDispatcher(), "bench"))
    out: dict[int, list[tuple[float, float]]] = {total: [] for total in sizes}
    for run in range(runs + 1):  # run 0 warms up (script loads), unrecorded
        for total, (store, fleet) in fleets.items():
            _open_requests(store, 100, f"due{run}", 0.001)
            time.sleep(0.01)
            gc.collect()
            store.redis.config_resetstat()
            start = time.perf_counter()
            counts = lifecycle.sweep_expired(fleet)
            wall = (time.perf_counter() - start) * 1e3
            assert counts.get("failed") == 100, counts
            if run:
                out[total].append((wall, server_stats(store.redis)[1] / 1e3))
    for db in range(len(sizes)):
        redis.Redis.from_url(_db_url(url, db)).flushdb()
    return out


def _db_url(url: str, db: int) -> str:
    """``url`` with database ``db`` (a URL's own path wins over ``from_url(db=)``)."""
    base, _, last = url.rpartition("/")
    return f"{base}/{db}" if last.isdigit() and base.count("/") >= 2 else f"{url}/{db}"


# -- memory -----------------------------------------------------------------------------
def _bytes(conn: redis.Redis) -> int:
    """MEMORY USAGE summed over every key (the bench's database holds only its own)."""
    total = 0
    for key in conn.scan_iter(count=1000):
        total += int(conn.memory_usage(key, samples=0) or 0)
    return total


def memory_per_request(url: str, n: int) -> tuple[float, float]:
    """(bytes per open request, bytes per finished one), one VM each."""
    text = redis.Redis.from_url(url, decode_responses=True)
    text.flushdb()
    store = Store(text, Keys())
    settings = RequestSettings(ttl_s=3600)
    for i in range(n):
        assert store.create_request(f"m-{i}", [Slot("a", "a", 1)], settings, actor="api").ok
    opened = _bytes(text)
    who = "worker:bench-host-1234-abcdef/"
    for i in range(n):
        rid, name = f"m-{i}", f"vm-{i:06d}"
        assert store.reserve_vm(
            rid, name=name, alias="a", pool="a", template="a", provider="sim", domain=None,
            actor=who + "provision_request", fence=1,
        ).ok  # fmt: skip
        assert store.vm_created(name, actor=who + "create_vm", fence=1).ok
        assert store.vm_ready(name, actor=who + "check_pending_vm", fence=1).ok
    done = _bytes(text)
    return opened / n, done / n


# -- report -----------------------------------------------------------------------------
def mm(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(min(values))} / {fmt.format(statistics.median(values))}"


def measure(url: str, args: argparse.Namespace, cfg_path: str) -> list[str]:
    rows: list[str] = []
    if _wanted(args, "fleet"):
        rows += _fleet_rows(url, args, cfg_path)
    if _wanted(args, "sweep"):
        rows += _sweep_rows(url, args)
    if _wanted(args, "transitions"):
        tr = [transitions(url, args.transitions) for _ in range(args.runs)]
        rows.append(
            f"| transitions/s ÷ trivial EVALSHA/s (create_request, one client) |"
            f" {mm([t for t, _ in tr])} ÷ {mm([e for _, e in tr])} |"
            f" {mm([t / e for t, e in tr], '{:.2f}')} |"
        )
    if _wanted(args, "expiry"):
        rows.append(_expiry_row(url, args))
    if _wanted(args, "memory"):
        mem = [memory_per_request(url, 1000) for _ in range(args.runs)]
        rows.append(
            "| Redis bytes per finished one-VM request ÷ per open request |"
            f" {mm([d for _, d in mem])} ÷ {mm([o for o, _ in mem])} |"
            f" {mm([d / o for o, d in mem], '{:.2f}')} |"
        )
    return rows


def _wanted(args: argparse.Namespace, part: str) -> bool:
    """Whether ``--only`` (None: every part) asks for ``part``."""
    return args.only is None or args.only == part


def _expiry_row(url: str, args: argparse.Namespace) -> str:
    exp = expiry_ms(url, (args.small_open, args.open), args.runs)
    small, big = exp[args.small_open], exp[args.open]
    return (
        f"| expiry sweep of 100 due, {args.open} open ÷ {args.small_open} open: wall ms"
        f" (Redis server ms) | {mm([w for w, _ in big], '{:.1f}')}"
        f" ({mm([r for _, r in big], '{:.1f}')}) ÷ {mm([w for w, _ in small], '{:.1f}')}"
        f" ({mm([r for _, r in small], '{:.1f}')}) |"
        f" {mm([b[0] / s[0] for b, s in zip(big, small, strict=True)], '{:.2f}')}"
        f" (server {mm([b[1] / s[1] for b, s in zip(big, small, strict=True)], '{:.2f}')}) |"
    )


def _fleet_rows(url: str, args: argparse.Namespace, cfg_path: str) -> list[str]:
    noop, real, cmds, usec = [], [], [], []
    kinds: list[str] = []
    for _ in range(args.runs):
        noop.append(fleet_noop(url, args.vms))
        vms, c, u = fleet_real(url, args.vms, cfg_path, kinds)
        real.append(vms)
        cmds.append(c)
        usec.append(u)
    if args.breakdown:
        for line in kinds:
            print(f"# commands per VM: {line}")
    ratios = [r / b for r, b in zip(real, noop, strict=True)]
    return [
        f"| fleet VMs/s ÷ RQ no-op jobs/s (2 workers, {args.vms} one-VM requests) |"
        f" {mm(real)} VMs/s ÷ {mm(noop)} jobs/s | {mm(ratios, '{:.2f}')} |",
        f"| Redis commands / server µs per VM end to end | {mm(cmds)} cmds,"
        f" {mm(usec)} µs | {3600e6 / statistics.median(usec):,.0f} VMs/hour of server time |",
    ]


def _sweep_rows(url: str, args: argparse.Namespace) -> list[str]:
    rows = []
    for n in args.pending:
        modes = sweep_ms(url, n, args.runs)
        for mode, sw in modes.items():
            how = SWEEP_MODES[mode][2]
            rows.append(
                f"| check-pending sweep, {n} pending, {how}: Redis server ms (cold / warm)"
                f" ÷ 1 s tick | cold {mm(sw['cold'], '{:.1f}')}, warm {mm(sw['warm'], '{:.1f}')}"
                f" (cold client wall {mm(sw['cold_wall'])} ms) |"
                f" {mm([w / 1e3 for w in sw['warm']], '{:.3f}')} |"
            )
            if "list_wall" in sw:
                rows.append(_listing_row(n, sw))
    return rows


def _listing_row(n: int, sw: dict[str, list[float]]) -> str:
    """The cold listing sweep split: the simulated cloud's list call apart, and the rest."""
    own = sw["own"]
    return (
        f"| the same, cold, {n} pending: the sweep's own worker wall ms (the list call's"
        f" apart, its answer's freeing included: its client wall ms, Redis CPU ms) ÷ 1 s"
        f" | sweep {mm(own)}"
        f" (list call {mm(sw['list_wall'])}, Redis CPU {mm(sw['list_server'])}) |"
        f" {mm([o / 1e3 for o in own], '{:.2f}')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vms", type=int, default=300)
    parser.add_argument("--pending", default="1000,10000")
    parser.add_argument("--transitions", type=int, default=3000)
    parser.add_argument("--open", type=int, default=100000)
    parser.add_argument("--small-open", type=int, default=1000)
    parser.add_argument("--aof", action="store_true", help="appendonly yes, appendfsync always")
    parser.add_argument(
        "--only",
        choices=("fleet", "sweep", "transitions", "expiry", "memory"),
        help="measure this part of the table alone (while iterating)",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="print each fleet run's commands per VM by kind"
    )
    args = parser.parse_args()
    args.pending = [int(s) for s in args.pending.split(",") if s]
    server = RedisServer(appendonly=args.aof).start()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        import yaml

        yaml.safe_dump(config_data(), f)
    try:
        settings = {"aof": args.aof, "runs": args.runs}
        version = server_version(server.url)
        print(machine_line(settings, server=version, allocator=server.allocator))
        rows = measure(server.url, args, f.name)
    finally:
        server.stop()
        os.unlink(f.name)
    print("| figure | measured (min / median) | ratio (min / median) |")
    print("|---|---|---|")
    for row in rows:
        print(row)
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

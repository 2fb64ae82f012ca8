"""The soak's warm-pool client: checkouts and give-backs, with their own history.

Beside the on-demand client (``history.py``), whose requests take ready VMs of the warm
pools first, this client checks VMs out of the warm pools (``POST /vm/<pool>`` and,
all or nothing, ``POST /vm/<pool>+<pool>``), reads each one while it holds it (``GET
/vm/<host>``), holds it a moment, and gives it back (``DELETE /vm/<host>``); an
indeterminate give-back is tried again. Every operation is a :class:`WarmOp` with its
invoke and completion times (monotonic) and its type (``ok``, ``fail``, ``info``), as
in ``history.py``.

The checker (:func:`check_warm_history`), with the hostnames the on-demand client was
handed:

- ``hostname_shared``: a VM handed out twice (two checkouts, or a checkout and a
  request): names are never reused, so any repeat is a VM with two holders;
- ``checkout_wrong_vms``: a checkout answered 200 with another number of VMs than asked;
- ``held_not_running``: a read, while the client held the VM (after its checkout was
  acknowledged, before its give-back was sent, within its lifetime), that did not show
  it running;
- ``checkout_lost``: a give-back of a VM the client held answered 404 (nobody holds it:
  it was taken from its holder) with no earlier attempt that may have given it back.

A checkout whose answer was lost (a timeout, a 5xx) left a VM checked out to nobody the
client knows; its lifetime ends it (``vm_lifetime``: the soak sets a short one) and the
reap pass destroys it, as it would for a client that vanished.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from history import TRANSPORT_ERRORS, Api, HistoryViolation, Op

from vmpool.state.records import decode_trail


@dataclass
class WarmOp:
    f: str  # checkout | read | giveback
    subject: str  # the pools asked (checkout) or the hostname
    api: int
    t0: float
    t1: float
    type: str  # ok | fail | info
    value: str = ""  # checkout: 'checked_out' | 'short' | ...; read: the VM's state
    status: int = 0
    hostnames: list[str] = field(default_factory=list)
    asked: int = 0


@dataclass
class WarmOptions:
    ports: Sequence[int]
    pools: Sequence[str]  # warm pools (names or aliases)
    seed: int
    rate_per_s: float = 1.5  # checkouts tried per second
    hold_s: tuple[float, float] = (0.5, 4.0)
    pair_share: float = 0.2  # checkouts of two pools at once (all or nothing)
    lifetime_s: float = 90.0  # the fleet's vm_lifetime (a held VM's reads are judged within it)
    http_timeout_s: float = 5.0
    threads: int = 2


@dataclass
class Held:
    host: str
    since: float  # checkout acknowledged (monotonic)
    attempts: int = 0  # give-backs sent


class WarmClient:
    """``threads`` threads, each checking out, reading, holding and giving back."""

    def __init__(self, opts: WarmOptions) -> None:
        self.opts = opts
        self.ops: list[WarmOp] = []
        self._lock = threading.Lock()
        self.stop_checkouts = threading.Event()
        self._threads: list[threading.Thread] = []
        self.left: list[str] = []  # held at the end and never given back (a finding)

    def record(self, op: WarmOp) -> None:
        with self._lock:
            self.ops.append(op)

    def start(self) -> None:
        for i in range(self.opts.threads):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def join(self, timeout_s: float = 120.0) -> None:
        """Stop checking out; every thread gives back what it holds, then ends."""
        self.stop_checkouts.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def _run(self, index: int) -> None:
        rng = random.Random(f"{self.opts.seed}:warm:{index}")
        apis = [Api(p, self.opts.http_timeout_s) for p in self.opts.ports]
        period = self.opts.threads / max(self.opts.rate_per_s, 0.01)
        due: list[tuple[float, int, Held]] = []  # (give back at, seq, VM)
        seq = 0
        next_checkout = time.monotonic()
        try:
            while not self.stop_checkouts.is_set() or due:
                now = time.monotonic()
                if due and due[0][0] <= now:
                    _, _, held = heapq.heappop(due)
                    if not self._give_back(held, rng, apis):
                        seq += 1  # indeterminate: try again in a moment
                        heapq.heappush(due, (now + 0.5, seq, held))
                    continue
                if not self.stop_checkouts.is_set() and now >= next_checkout:
                    next_checkout = now + rng.uniform(0.5, 1.5) * period
                    for host in self._checkout(rng, apis):
                        held = Held(host, time.monotonic())
                        self._read(held, rng, apis)
                        seq += 1
                        heapq.heappush(due, (time.monotonic() + rng.uniform(*self.opts.hold_s),
                                             seq, held))  # fmt: skip
                    continue
                wake = min([next_checkout, *(d for d, _, _ in due[:1])])
                self.stop_checkouts.wait(max(0.01, min(0.5, wake - time.monotonic())))
        finally:
            with self._lock:
                self.left += [held.host for _, _, held in due]
            for api in apis:
                api.close()

    def _checkout(self, rng: random.Random, apis: list[Api]) -> list[str]:
        pools = list(self.opts.pools)
        asked = rng.sample(pools, 2) if len(pools) > 1 and rng.random() < self.opts.pair_share \
            else [rng.choice(pools)]  # fmt: skip
        which = rng.randrange(len(apis))
        subject = "+".join(asked)
        t0 = time.monotonic()
        try:
            status, body = apis[which].call("POST", f"/vm/{subject}")
        except TRANSPORT_ERRORS:
            self.record(WarmOp("checkout", subject, which, t0, time.monotonic(), "info",
                               asked=len(asked)))  # fmt: skip
            return []
        hosts: list[str] = []
        if status == 200 and body.get("ok"):
            for name in asked:
                got = (body.get(name) or {}).get("hostname", [])
                hosts += [got] if isinstance(got, str) else list(got)
            kind, value = "ok", "checked_out"
        elif status == 503:
            kind, value = "fail", "short"
        elif 400 <= status < 500:
            kind, value = "fail", f"http_{status}"
        else:
            kind, value = "info", f"http_{status}"  # a 5xx on a write: indeterminate
        self.record(WarmOp("checkout", subject, which, t0, time.monotonic(), kind, value,
                           status, hosts, len(asked)))  # fmt: skip
        return hosts

    def _read(self, held: Held, rng: random.Random, apis: list[Api]) -> None:
        which = rng.randrange(len(apis))
        t0 = time.monotonic()
        try:
            status, body = apis[which].call("GET", f"/vm/{held.host}")
        except TRANSPORT_ERRORS:
            self.record(WarmOp("read", held.host, which, t0, time.monotonic(), "info"))
            return
        if status == 200:
            entry = next((v for v in body.values() if isinstance(v, dict)), {})
            kind, value = "ok", str(entry.get("state", ""))
        elif status == 404:
            kind, value = "ok", "missing"
        else:
            kind, value = "fail", f"http_{status}"
        self.record(WarmOp("read", held.host, which, t0, time.monotonic(), kind, value, status))

    def _give_back(self, held: Held, rng: random.Random, apis: list[Api]) -> bool:
        """True when the give-back is settled (acknowledged, or refused for good)."""
        which = rng.randrange(len(apis))
        held.attempts += 1
        t0 = time.monotonic()
        try:
            status, body = apis[which].call("DELETE", f"/vm/{held.host}")
        except TRANSPORT_ERRORS:
            self.record(WarmOp("giveback", held.host, which, t0, time.monotonic(), "info",
                               asked=held.attempts))  # fmt: skip
            return False
        if status == 200 and body.get("ok"):
            kind, value = "ok", "given_back"
        elif status == 404:
            kind, value = "ok", "missing"
        elif 400 <= status < 500:
            kind, value = "fail", f"http_{status}"
        else:
            self.record(WarmOp("giveback", held.host, which, t0, time.monotonic(), "info",
                               f"http_{status}", status, asked=held.attempts))  # fmt: skip
            return False
        self.record(WarmOp("giveback", held.host, which, t0, time.monotonic(), kind, value,
                           status, asked=held.attempts))  # fmt: skip
        return True


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def check_warm_history(
    ops: Sequence[WarmOp], requests: Iterable[Op], lifetime_s: float
) -> list[HistoryViolation]:
    """The warm client's violations (the module docstring), given the on-demand
    client's operations (for the hostnames it was handed)."""
    out: list[HistoryViolation] = []
    holder: dict[str, str] = {}  # short name -> who was handed it first
    for op in requests:
        if op.f == "read" and op.type == "ok" and op.value == "ready":
            for hosts in op.hostnames.values():
                for host in hosts:
                    holder.setdefault(_short(host), f"request {op.rid}")
    checked_out: dict[str, WarmOp] = {}
    for op in sorted(ops, key=lambda o: o.t0):
        if op.f != "checkout" or op.type != "ok":
            continue
        if len(op.hostnames) != op.asked:
            out.append(HistoryViolation("checkout_wrong_vms", op.subject,
                                        f"asked {op.asked}, got {op.hostnames}"))  # fmt: skip
        for host in op.hostnames:
            first = holder.get(_short(host))
            if first is not None:
                out.append(HistoryViolation("hostname_shared", host, f"checked out, and {first}"))
            holder[_short(host)] = f"a checkout at {op.t1:.3f}"
            checked_out[host] = op
    out += _while_held(ops, checked_out, lifetime_s)
    return list(dict.fromkeys(out))


def _while_held(
    ops: Sequence[WarmOp], checked_out: dict[str, WarmOp], lifetime_s: float
) -> list[HistoryViolation]:
    out: list[HistoryViolation] = []
    first_giveback: dict[str, float] = {}
    for op in ops:
        if op.f == "giveback":
            first_giveback[op.subject] = min(first_giveback.get(op.subject, op.t0), op.t0)
    for op in ops:
        got = checked_out.get(op.subject)
        if got is None or op.type != "ok":
            continue
        within = op.t0 < got.t0 + lifetime_s  # the lifetime runs from the server's checkout
        held = got.t1 < op.t0 and op.t1 < first_giveback.get(op.subject, float("inf"))
        if op.f == "read" and held and within and op.value != "running":
            out.append(HistoryViolation("held_not_running", op.subject, f"read {op.value}"))
        if op.f == "giveback" and op.value == "missing" and op.asked == 1 and within:
            out.append(HistoryViolation("checkout_lost", op.subject,
                                        "given back, answered 404 (nobody held it)"))  # fmt: skip
    return out


def warm_ops_summary(ops: Iterable[WarmOp]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in ops:
        key = f"{op.f}:{op.value or op.type}"
        counts[key] = counts.get(key, 0) + 1
    return counts


__all__ = [
    "WarmClient",
    "WarmOp",
    "WarmOptions",
    "check_warm_history",
    "claimed_from_warm",
    "warm_ops_summary",
    "warm_stock",
]


# -- the server side at the end -----------------------------------------------------------

# What a warm pool may keep after the load: its ready VMs, and its own reserved and
# booting ones (a top-up refilling it).
STOCK_STATES = ("ready", "reserved", "pending")


def warm_stock(store: Any, pools: Sequence[str]) -> set[str]:
    """The warm pools' VMs that may stay when the fleet is at rest (no request and no
    holder: :data:`STOCK_STATES`, ``request_id`` '')."""
    names = [n for s in STOCK_STATES for ns in store.pools_vms(pools, s).values() for n in ns]
    return {vm.name for vm in store.get_vms(names)
            if not vm.request_id and vm.state in STOCK_STATES}  # fmt: skip


def claimed_from_warm(store: Any, rids: Sequence[str]) -> int:
    """How many VMs the requests took from a warm pool (their trails' "claimed from the
    pool" entries): the on-demand claims the soak exercised."""
    total = 0
    for start in range(0, len(rids), 500):
        pipe = store.redis.pipeline(transaction=False)
        for rid in rids[start : start + 500]:
            pipe.lrange(store.keys.request_audit(rid), 0, -1)
        for raw in pipe.execute(raise_on_error=False):
            if isinstance(raw, list):
                total += sum(1 for e in decode_trail(raw) if e.reason == "claimed from the pool")
    return total

"""The soak's client: load against the HTTP API, and its own Jepsen-style history.

Every operation is recorded as an :class:`Op`: the request it concerns, what it was
(``create``, ``read``, ``delete``), which API served it, when it was invoked and when it
completed (``time.monotonic``), and its type:

- ``ok``: the operation took effect (or, for a read, observed ``value``);
- ``fail``: it certainly did not take effect (a 4xx refusal, a read that got no answer
  worth reading, such as a 503);
- ``info``: indeterminate: a timeout, a connection error, a 5xx on a write. The write
  may or may not have happened; a read of that kind observed nothing.

The checker (:func:`check_history`) needs only real-time order: if operation A completed
before operation B was invoked, B must see the effect of A. Per request (histories of
different requests are independent, so each is checked alone):

- an acknowledged delete is never followed by a read of ``pending`` or ``ready``
  (``deleted_then_live``);
- a read of ``ready`` is never followed by ``failed`` (``ready_then_failed``) nor by
  ``pending`` (``ready_then_pending``);
- a terminal state (``failed``, ``deleted``) is never followed by another state
  (``terminal_changed``: includes failed -> deleted, which vmpool's DELETE must refuse);
- a request acknowledged as created, or seen, is never later missing (``lost_request``);
- a ``ready`` answer lists as many hostnames per alias as were asked (``ready_wrong_vms``);
- no hostname is handed to two requests (``hostname_shared``);
- every acknowledged create and delete is followed by a read that answered
  (``unchecked_ack`` otherwise): the checks above hold for every acknowledged
  operation, not for the ones a poll happened to follow (:func:`acknowledged_checked`
  counts them for the report).
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import json
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

API = "/api/v3"
STATES = ("pending", "ready", "failed", "deleted")
# The states a request may be observed in after it was observed in each state.
SUCCESSORS: dict[str, frozenset[str]] = {
    "pending": frozenset({"pending", "ready", "failed", "deleted"}),
    "ready": frozenset({"ready", "deleted"}),
    "failed": frozenset({"failed"}),
    "deleted": frozenset({"deleted"}),
}


@dataclass
class Op:
    rid: str
    f: str  # create | read | delete
    api: int
    t0: float  # invoked (monotonic)
    t1: float  # completed (monotonic)
    type: str  # ok | fail | info
    value: str = ""  # read: a state or "missing"; delete: "deleted" | "already_deleted" ...
    status: int = 0  # HTTP status (0: none)
    hostnames: dict[str, list[str]] = field(default_factory=dict)
    note: str = ""
    position: int | None = None  # read of a pending request: where it stood (vmpool's)


@dataclass(frozen=True)
class HistoryViolation:
    kind: str
    rid: str
    message: str

    def line(self) -> str:
        return f"{self.kind}: request {self.rid}: {self.message}"


# -- HTTP --------------------------------------------------------------------------------


class Api:
    """One keep-alive HTTP connection to one API process (one per thread and API)."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def call(
        self, method: str, path: str, body: Any = None, token: str = ""
    ) -> tuple[int, dict[str, Any]]:
        """(status, JSON body); raises OSError / HTTPException on transport trouble.

        ``token``: sent as X-AUTH-TOKEN ('' for none)."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if token:
            headers["X-AUTH-TOKEN"] = token
        try:
            self._conn.request(method, API + path, body=data, headers=headers)
            resp = self._conn.getresponse()
            raw = resp.read()
        except BaseException:
            self.close()
            raise
        try:
            parsed = json.loads(raw or b"{}")
        except ValueError:
            parsed = {"unparsed": raw[:200].decode(errors="replace")}
        return resp.status, parsed if isinstance(parsed, dict) else {"body": parsed}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


TRANSPORT_ERRORS = (OSError, http.client.HTTPException, socket.timeout)


def classify_read(status: int, body: dict[str, Any]) -> tuple[str, str]:
    """(type, value) of a GET /ondemandvm/<id> answer."""
    if status == 202 and body.get("ok"):
        return "ok", "pending"
    if status == 200 and body.get("ready") is True:
        return "ok", "ready"
    if status == 200 and body.get("ok"):
        message = str(body.get("message", "")).lower()
        if "deleted" in message:
            return "ok", "deleted"
        if "failed" in message:
            return "ok", "failed"
        return "fail", "unknown_body"
    if status == 404:
        return "ok", "missing"
    return "fail", f"http_{status}"


def ready_hostnames(body: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in body.items():
        if isinstance(value, dict) and isinstance(value.get("hostname"), list):
            out[key] = [str(h) for h in value["hostname"]]
    return out


# -- the load generator -------------------------------------------------------------------


@dataclass
class Tracked:
    rid: str
    counts: dict[str, int]
    created_t: float
    create_type: str = ""  # ok | fail | info
    delete_at: float | None = None
    delete_acked: bool = False
    token: str = ""  # its user's (the one who may delete it)
    priority: int | None = None
    last_seen: str = ""
    reads_after_end: int = 0
    misses: int = 0
    done: bool = False


@dataclass
class ClientOptions:
    ports: Sequence[int]
    pools: Sequence[str]  # healthy pools (names or aliases)
    flaky_pools: Sequence[str]
    seed: int
    rate_per_s: float = 5.0
    max_requests: int | None = None
    max_open: int = 100
    delete_share: float = 0.3
    delete_within_s: float = 8.0
    flaky_share: float = 0.2
    poll_s: float = 1.0
    hold_ready_s: float = 2.0
    creators: int = 2
    pollers: int = 3
    http_timeout_s: float = 5.0
    tokens: Sequence[str] = ()  # users' tokens, one taken at random per request
    priorities: bool = False  # a random priority 1-3 in each POST (ABS's)


class Client:
    """Creates requests against the APIs at random, deletes a share of them at random
    moments, polls all of them, deletes the ready ones after a short hold, and records
    every operation. Threads: ``creators`` that create, ``pollers`` that read and delete.
    """

    def __init__(self, opts: ClientOptions) -> None:
        self.opts = opts
        self.ops: list[Op] = []
        self.tracked: dict[str, Tracked] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._due: list[tuple[float, int, str]] = []  # (due, seq, rid)
        self._seq = 0
        self.stop_creating = threading.Event()
        self.stop_all = threading.Event()
        self._threads: list[threading.Thread] = []
        self.created = 0  # POSTs sent
        self.errors: Counter[str] = Counter()

    # -- bookkeeping ----------------------------------------------------------------------
    def record(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def _schedule(self, rid: str, due: float) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._due, (due, self._seq, rid))
            self._cond.notify()

    def _open_locked(self) -> int:
        return sum(1 for t in self.tracked.values() if not t.done)

    def open_count(self) -> int:
        with self._lock:
            return self._open_locked()

    def all_done(self) -> bool:
        with self._lock:
            return all(t.done for t in self.tracked.values())

    # -- threads --------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self.opts.creators):
            self._threads.append(threading.Thread(target=self._creator, args=(i,), daemon=True))
        for i in range(self.opts.pollers):
            self._threads.append(threading.Thread(target=self._poller, args=(i,), daemon=True))
        for t in self._threads:
            t.start()

    def join(self, timeout_s: float = 30.0) -> None:
        self.stop_creating.set()
        self.stop_all.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _apis(self) -> list[Api]:
        return [Api(p, self.opts.http_timeout_s) for p in self.opts.ports]

    def _counts(self, rng: random.Random) -> dict[str, int]:
        total = rng.randint(1, 3)
        pools = (
            list(self.opts.flaky_pools)
            if (self.opts.flaky_pools and rng.random() < self.opts.flaky_share)
            else list(self.opts.pools)
        )
        counts: dict[str, int] = {}
        for _ in range(total):
            name = rng.choice(pools)
            counts[name] = counts.get(name, 0) + 1
        return counts

    def _creator(self, index: int) -> None:
        rng = random.Random(f"{self.opts.seed}:creator:{index}")
        apis = self._apis()
        period = self.opts.creators / max(self.opts.rate_per_s, 0.01)
        next_at = time.monotonic()
        try:
            while not self.stop_creating.is_set():
                with self._lock:
                    cap = self.opts.max_requests
                    if cap is not None and self.created >= cap:
                        break
                    full = self._open_locked() >= self.opts.max_open
                    if not full:
                        self.created += 1
                if full:
                    self.stop_creating.wait(0.1)  # back-pressure: the client's pacing
                    continue
                self._create_one(rng, apis)
                next_at = max(next_at + period, time.monotonic() - period)
                self.stop_creating.wait(max(0.0, next_at - time.monotonic()))
        finally:
            for api in apis:
                api.close()

    def _create_one(self, rng: random.Random, apis: list[Api]) -> None:
        rid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        counts = self._counts(rng)
        which = rng.randrange(len(apis))
        tr = Tracked(rid, counts, time.monotonic())
        tr.token = rng.choice(list(self.opts.tokens)) if self.opts.tokens else ""
        tr.priority = rng.choice((1, 2, 3)) if self.opts.priorities else None
        if rng.random() < self.opts.delete_share:
            tr.delete_at = tr.created_t + rng.uniform(0, self.opts.delete_within_s)
        with self._lock:
            self.tracked[rid] = tr
        body: dict[str, Any] = {k: str(v) for k, v in counts.items()}
        body["request_id"] = rid
        if tr.priority is not None:
            body["priority"] = tr.priority
        t0 = time.monotonic()
        try:
            status, answer = apis[which].call("POST", "/ondemandvm", body, tr.token)
        except TRANSPORT_ERRORS as exc:
            kind, value, status, note = "info", "", 0, type(exc).__name__
        else:
            note = ""
            if status == 201 and answer.get("ok"):
                kind, value = "ok", "created"
            elif status == 409:
                # our own id exists: a create that took effect but whose answer was lost
                # (a retried script), so indeterminate rather than refused
                kind, value = "info", "exists"
            elif 400 <= status < 500:
                kind, value = "fail", f"http_{status}"
            else:
                kind, value = "info", f"http_{status}"
        t1 = time.monotonic()
        self.record(Op(rid, "create", which, t0, t1, kind, value, status, note=note))
        with self._lock:
            tr.create_type = kind
            if kind == "fail":
                tr.done = True
                return
        self._schedule(rid, t1 + self.opts.poll_s)

    def _poller(self, index: int) -> None:
        rng = random.Random(f"{self.opts.seed}:poller:{index}")
        apis = self._apis()
        try:
            while not self.stop_all.is_set():
                with self._cond:
                    while not self.stop_all.is_set():
                        now = time.monotonic()
                        if self._due and self._due[0][0] <= now:
                            _, _, rid = heapq.heappop(self._due)
                            break
                        wait = self._due[0][0] - now if self._due else 0.5
                        self._cond.wait(min(0.5, wait))
                    else:
                        return
                    tr = self.tracked[rid]
                self._step(tr, rng, apis)
        finally:
            for api in apis:
                api.close()

    def read(self, rid: str, api: Api, which: int) -> Op:
        t0 = time.monotonic()
        try:
            status, body = api.call("GET", f"/ondemandvm/{rid}")
        except TRANSPORT_ERRORS as exc:
            op = Op(rid, "read", which, t0, time.monotonic(), "info", note=type(exc).__name__)
        else:
            kind, value = classify_read(status, body)
            hostnames = ready_hostnames(body) if value == "ready" else {}
            op = Op(rid, "read", which, t0, time.monotonic(), kind, value, status, hostnames)
            if isinstance(body.get("position"), int):
                op.position = int(body["position"])
        self.record(op)
        return op

    def delete(self, rid: str, api: Api, which: int) -> Op:
        t0 = time.monotonic()
        token = self.tracked[rid].token if rid in self.tracked else ""
        try:
            status, body = api.call("DELETE", f"/ondemandvm/{rid}", token=token)
        except TRANSPORT_ERRORS as exc:
            op = Op(rid, "delete", which, t0, time.monotonic(), "info", note=type(exc).__name__)
        else:
            if status == 200 and body.get("ok"):
                already = "already" in str(body.get("message", ""))
                kind, value = "ok", "already_deleted" if already else "deleted"
            elif status == 404:
                kind, value = "ok", "missing"
            elif 400 <= status < 500:
                kind, value = "fail", f"http_{status}"
            else:
                kind, value = "info", f"http_{status}"
            op = Op(rid, "delete", which, t0, time.monotonic(), kind, value, status)
        self.record(op)
        return op

    def _step(self, tr: Tracked, rng: random.Random, apis: list[Api]) -> None:
        which = rng.randrange(len(apis))
        api = apis[which]
        now = time.monotonic()
        if tr.delete_at is not None and now >= tr.delete_at and not tr.delete_acked:
            op = self.delete(tr.rid, api, which)
            if op.type == "ok":
                tr.delete_acked = True
            self._schedule(tr.rid, time.monotonic() + 0.2)
            return
        op = self.read(tr.rid, api, which)
        if op.type != "ok":
            self._schedule(tr.rid, time.monotonic() + self.opts.poll_s)
            return
        tr.last_seen = op.value
        finish = False
        if op.value == "ready" and tr.delete_at is None:
            tr.delete_at = time.monotonic() + rng.uniform(0, self.opts.hold_ready_s)
        elif op.value in ("failed", "deleted") or (op.value == "ready" and tr.delete_acked):
            # watch a terminal request twice more: a resurrection shows up here
            tr.reads_after_end += 1
            if tr.delete_at is None:
                tr.delete_at = time.monotonic()  # a client also deletes what failed
            finish = tr.reads_after_end >= 3 and (tr.delete_acked or op.value == "failed")
        elif op.value == "missing":
            tr.misses += 1
            # an acknowledged create that is missing is a finding (the checker reports it);
            # an indeterminate one that stays missing never happened
            finish = tr.create_type == "ok" or tr.misses >= 4
        if finish:
            with self._lock:
                tr.done = True
            return
        self._schedule(tr.rid, time.monotonic() + self.opts.poll_s)

    def final_reads(self, rids: Iterable[str], threads: int = 4) -> None:
        """One more read of every request, from both APIs in turn (after settling)."""
        todo = list(rids)
        cursor = {"i": 0}
        lock = threading.Lock()

        def run(k: int) -> None:
            apis = self._apis()
            try:
                while True:
                    with lock:
                        i = cursor["i"]
                        cursor["i"] += 1
                    if i >= len(todo):
                        return
                    which = (i + k) % len(apis)
                    self.read(todo[i], apis[which], which)
            finally:
                for api in apis:
                    api.close()

        workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(600)


# -- the checker ------------------------------------------------------------------------


def check_history(
    ops: Sequence[Op], requested: Callable[[str], dict[str, int] | None] = lambda rid: None
) -> list[HistoryViolation]:
    """Every violation of the client's history (see the module docstring)."""
    by_rid: dict[str, list[Op]] = {}
    for op in ops:
        by_rid.setdefault(op.rid, []).append(op)
    out: list[HistoryViolation] = []
    owner: dict[str, str] = {}
    for rid, rops in by_rid.items():
        out += _check_one(rid, rops, requested(rid))
        for op in rops:
            if op.f == "read" and op.type == "ok" and op.value == "ready":
                for names in op.hostnames.values():
                    for host in names:
                        first = owner.setdefault(host, rid)
                        if first != rid:
                            out.append(
                                HistoryViolation(
                                    "hostname_shared", rid, f"{host} was also given to {first}"
                                )
                            )
    # one line per (kind, rid, message)
    return list(dict.fromkeys(out))


def _check_one(rid: str, ops: list[Op], asked: dict[str, int] | None) -> list[HistoryViolation]:
    out: list[HistoryViolation] = []
    reads = sorted((o for o in ops if o.f == "read" and o.type == "ok"), key=lambda o: o.t0)
    acks = [o for o in ops if o.f in ("create", "delete") and o.type == "ok"]
    for b in reads:
        for a in reads:
            if a.t1 >= b.t0 or a is b:
                continue  # concurrent or later: no order between them
            if a.value == "missing":
                continue
            if b.value == "missing":
                out.append(HistoryViolation("lost_request", rid, f"seen {a.value}, then missing"))
            elif b.value not in SUCCESSORS[a.value]:
                out.append(
                    HistoryViolation(
                        _kind(a.value, b.value), rid, f"seen {a.value}, then {b.value}"
                    )
                )
        for a in acks:
            if a.t1 >= b.t0:
                continue
            if a.f == "create" and b.value == "missing":
                out.append(HistoryViolation("lost_request", rid, "created (201), then missing"))
            if a.f == "delete" and a.value in ("deleted", "already_deleted"):
                if b.value in ("pending", "ready"):
                    out.append(
                        HistoryViolation(
                            "deleted_then_live", rid, f"delete acknowledged, then {b.value}"
                        )
                    )
                elif b.value == "missing":
                    out.append(HistoryViolation("lost_request", rid, "deleted, then missing"))
                elif a.value == "already_deleted" and b.value == "failed":
                    out.append(
                        HistoryViolation("terminal_changed", rid, "already deleted, then failed")
                    )
    for a in acks:
        if not any(b.t0 > a.t1 for b in reads):
            out.append(HistoryViolation("unchecked_ack", rid, f"{a.f} acknowledged, never read"))
    if asked is not None:
        for b in reads:
            if b.value != "ready":
                continue
            got = {alias: len(names) for alias, names in b.hostnames.items()}
            if got != asked:
                out.append(HistoryViolation("ready_wrong_vms", rid, f"asked {asked}, got {got}"))
    return out


def acknowledged_checked(ops: Sequence[Op]) -> dict[str, int]:
    """How many creates and deletes were acknowledged, and how many a later read checked."""
    last_read: dict[str, float] = {}
    for op in ops:
        if op.f == "read" and op.type == "ok":
            last_read[op.rid] = max(last_read.get(op.rid, 0.0), op.t0)
    out: Counter[str] = Counter()
    for op in ops:
        if op.f in ("create", "delete") and op.type == "ok":
            out[f"{op.f}_acknowledged"] += 1
            out[f"{op.f}_checked"] += int(last_read.get(op.rid, 0.0) > op.t1)
    return dict(out)


def _kind(before: str, after: str) -> str:
    if before == "deleted" and after in ("pending", "ready"):
        return "deleted_then_live"
    if before == "ready" and after == "failed":
        return "ready_then_failed"
    if before == "ready" and after == "pending":
        return "ready_then_pending"
    return "terminal_changed"


def ops_to_jsonl(ops: Iterable[Op]) -> str:
    return "".join(json.dumps(asdict(o), sort_keys=True) + "\n" for o in ops)


def position_summary(ops: Sequence[Op]) -> dict[str, int]:
    """What the pending reads said of where requests stood (GET's ``position``).

    ``reads``: pending reads with a position; ``negative``: impossible positions;
    ``rises``: a request's position higher than at its previous read (a request placed
    ahead arrived: higher priority, fair share, or one ahead lost a VM; or its own VM
    was lost: from 0); ``rises_beyond_creates``: rises larger than the requests this
    client created between the two reads (then only VMs lost ahead explain them). The
    strict check of positions is the model test's (tests/model_fleet.py)."""
    creates = sorted(op.t0 for op in ops if op.f == "create")
    by_rid: dict[str, list[Op]] = {}
    for op in ops:
        if op.f == "read" and op.position is not None:
            by_rid.setdefault(op.rid, []).append(op)
    out: Counter[str] = Counter()
    for reads in by_rid.values():
        reads.sort(key=lambda o: o.t0)
        for before, after in itertools.pairwise(reads):
            pos0, pos1 = before.position or 0, after.position or 0
            out["negative"] += int(pos1 < 0)
            if pos1 > pos0 and before.t1 < after.t0:
                out["rises"] += 1
                between = sum(1 for t in creates if before.t1 <= t <= after.t0)
                out["rises_beyond_creates"] += int(pos0 > 0 and pos1 - pos0 > between)
        out["reads"] += len(reads)
    return dict(out)

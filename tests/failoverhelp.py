"""A client's history across a Redis switch: creates and deletes through the store at full
speed, every acknowledged one recorded, and the verdict over what the group kept.

Used by the tests of planned switches and partitions (tests/test_failover_safety.py) and
by tests/chaos/failover_runs.py, which repeats them and prints the figures. The
group is a :class:`sentinelhelp.SentinelGroup`; the store is vmpool's own, made through
the connection factory with the options given, so a write is acknowledged exactly when
vmpool would acknowledge it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from vmpool.config import default_redis_options
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.durability import confirmed
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.redis_health import classify
from vmpool.state.store import Store
from vmpool.state.transitions import RequestStatus

from sentinelhelp import SentinelGroup

SETTINGS = RequestSettings(ttl_s=3600, grace_s=0, max_vm_retries=1, vm_lifetime_s=3600,
                           data_ttl_s=3600)  # fmt: skip
SLOTS = [Slot("p", "p", 1)]
PREFIX = "switch"


def options(replicas: int | None = None, mode: str = "auto") -> RedisOptions:
    """vmpool's default options; ``replicas`` sets ``durability_replicas`` explicitly."""
    setting = dataclasses.replace(default_redis_options().durability, replicas=replicas,
                                  mode=mode)  # type: ignore[arg-type]  # fmt: skip
    return dataclasses.replace(default_redis_options(), durability=setting)


def store(url: str, redis_options: RedisOptions | None = None) -> Store:
    client = connect(url, redis_options or options(), decode_responses=True)
    return Store(client, Keys(PREFIX))


class OpWriter(threading.Thread):
    """Creates a request, deletes the one created ``lag`` creates before, and again, as
    fast as the store answers (a delete of a request older than the switch can be
    undone by it: the record comes back).

    Keeps every create and delete the store acknowledged, with when (monotonic), and
    counts what it was refused, by condition. A refused write is not retried: its id is
    dropped (it may exist: it was not acknowledged, so nothing is promised of it).
    ``unit`` > 1: that many creates in one unit of work (``confirmed``), acknowledged
    together when it ends.
    """

    def __init__(self, target: Store, name: str = "writer", lag: int = 100, unit: int = 1) -> None:
        super().__init__(daemon=True, name=name)
        self.store = target
        self.lag = lag
        self.unit = unit
        self.creates: list[tuple[float, str]] = []
        self.deletes: list[tuple[float, str]] = []
        self.refusals: Counter[str] = Counter()
        self.seen: dict[str, str] = {}  # the first message of each condition
        self.unexpected: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        live: deque[str] = deque()
        while not self.halt.is_set():
            rids = [str(uuid.uuid4()) for _ in range(self.unit)]
            if not self._acknowledged(self._create_unit, rids):
                continue
            now = time.monotonic()
            self.creates.extend((now, rid) for rid in rids)
            live.extend(rids)
            while len(live) > self.lag:
                old = live.popleft()
                if self._acknowledged(self._delete_one, old):
                    self.deletes.append((time.monotonic(), old))

    def _create_unit(self, rids: list[str]) -> bool:
        if len(rids) == 1:
            return self.store.create_request(rids[0], SLOTS, SETTINGS, actor="test").ok
        with confirmed(self.store.redis):
            outcomes = [
                self.store.create_request(rid, SLOTS, SETTINGS, actor="test") for rid in rids
            ]
        return all(o.ok for o in outcomes)

    def _delete_one(self, rid: str) -> bool:
        return self.store.delete_request(rid, actor="test").ok

    def _acknowledged(self, op: Callable[[Any], bool], rid: Any) -> bool:
        try:
            ok = op(rid)
        except redis.RedisError as exc:
            condition = classify(exc)
            self.refusals[str(condition)] += 1
            self.seen.setdefault(str(condition), f"{type(exc).__name__}: {exc}")
            if condition is None:
                self.unexpected.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.01)
            return False
        if not ok:
            self.unexpected.append(f"{op.__name__} {rid}: refused by its precondition")
        return ok

    def acknowledged_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first operation acknowledged after it."""
        times = [t for t, _ in self.creates + self.deletes if t > moment]
        return min(times) - moment if times else None

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


@dataclass
class Verdict:
    """What the group kept of what a writer was told."""

    creates: int
    deletes: int
    lost_creates: list[str] = field(default_factory=list)
    undone_deletes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost_creates and not self.undone_deletes

    def line(self) -> str:
        return (
            f"{len(self.lost_creates)} of {self.creates} acknowledged creates lost,"
            f" {len(self.undone_deletes)} of {self.deletes} acknowledged deletes undone"
        )


def verdict(group: SentinelGroup, writer: OpWriter) -> Verdict:
    """Read every request the writer was told of on the primary the sentinels name.

    Call it once the group has settled (:meth:`SentinelGroup.wait_settled`) and the
    writer has stopped: the replicas catch up first.
    """
    group.wait_replicated()
    with group.current_primary().client(decode_responses=True, socket_timeout=5) as client:
        reader = Store(client, Keys(PREFIX))
        out = Verdict(creates=len(writer.creates), deletes=len(writer.deletes))
        for _, rid in writer.creates:
            if reader.get_request(rid) is None:
                out.lost_creates.append(rid)
        for _, rid in writer.deletes:
            record = reader.get_request(rid)
            if record is not None and record.status != RequestStatus.DELETED:
                out.undone_deletes.append(rid)
    return out


def wait_acknowledged(writer: OpWriter, count: int, timeout: float) -> None:
    """Until ``writer`` has ``count`` more acknowledged creates than now."""
    target = len(writer.creates) + count
    deadline = time.monotonic() + timeout
    while len(writer.creates) < target:
        if time.monotonic() > deadline or not writer.is_alive():
            raise AssertionError(f"no {count} acknowledged creates within {timeout} s:"
                                 f" refused {dict(writer.refusals)}")  # fmt: skip
        time.sleep(0.02)


def wait_served(writer: OpWriter, since: float, timeout: float) -> float:
    """Seconds from ``since`` (monotonic) to ``writer``'s first acknowledgement after it.

    Fails after ``timeout`` seconds without one.
    """
    deadline = since + timeout
    while (took := writer.acknowledged_after(since)) is None:
        if time.monotonic() > deadline or not writer.is_alive():
            raise AssertionError(f"not served within {timeout} s: refused {dict(writer.refusals)}"
                                 f" {writer.seen}")  # fmt: skip
        time.sleep(0.02)
    return took


def longest_gap(writer: OpWriter, since: float, until: float) -> float:
    """The longest time without an acknowledgement between ``since`` and ``until``."""
    times = sorted(t for t, _ in writer.creates + writer.deletes if since <= t <= until)
    edges = [since, *times, until]
    return max(b - a for a, b in itertools.pairwise(edges))

"""The fleet-wide on-demand clone limit: a Redis semaphore of leases.

vmpooler counts clones in progress in one process. vmpool has many worker processes on
many machines, so the count lives in Redis. It is a zset whose members are VM names and
whose scores are the leases' expiry times (Redis server time). Beside it sits each
lease's holder token. ``vmpool/state/scripts/_slots.lua`` drops expired leases,
checks the limit and adds the lease in one atomic unit: in ``clone_semaphore.lua``
(this module's script) and in the store scripts that take or give back a VM's slot in
their own unit.

A lease's life:

- Taken in the VM's reservation (``reserve_vm.lua`` in its request's turn,
  ``pool_reserve.lua`` for a warm pool; the terms: :class:`SlotTerms`), with token 0:
  no lock of the VM exists yet.
- Taken over by the VM's create (``lifecycle.create_vm``), under the VM's lock: its
  token is that lock's fencing token. The create gives it back when it is over,
  however it ends: in ``vm_created``'s unit, else ``release_to_line``; either answers
  the requests whose turn it is then, which are dispatched their provision at once.
- Renewed by acquiring again with a token not older than the lease's. A create job
  that runs twice holds one slot, not two.
- Kept alive while the provider call runs: ``renewing`` renews it every third of
  ``lease_s``, so two renewals may be missed before it lapses. One thread per
  semaphore (per Fleet, per process) renews for every create.
- Expired when its worker was killed mid-create: after ``lease_s`` (twice the lock
  expiry) the slot comes back by itself.

Invariant: **a lease is released or renewed only by its holder.** A token older than the
lease's is refused. A creator paused past its lease (and its lock), whose VM another
creator took over with a newer token, cannot drop that creator's slot when it wakes. So
the fleet never runs more clones than the limit because of it.

Overruns: a renewal that finds its lease gone and no slot free re-registers it over the
limit and counts an **overrun** (the clone is under way). The count stays true.
:meth:`stats` (the audit, /metrics) shows the fleet's peak and overruns: an exceeded
limit is seen, never silent.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, read_script
from vmpool.state.renewer_sleep import RenewerSleep

__all__ = ["CloneSemaphore", "SlotStats", "SlotTerms"]

log = logging.getLogger(__name__)


# An idle lease keeper thread ends after this long without a lease to renew.
KEEPER_LINGER_S = 30.0
# renew's answers (clone_semaphore.lua)
_RENEWED, _TAKEN_OVER, _OVERRUN = 1, 2, 3


# clone_semaphore.lua's keys, bound for _slots.lua's functions (the store's scripts
# have them rendered in: vmpool.state.counters.lua_quota_keys).
_SLOT_KEYS_FROM_KEYS = (
    "local CLONE_SLOTS, SLOT_HOLDERS, SLOT_STATS, SLOT_LINE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n"
)


def _script_text() -> str:
    """The semaphore's script: its keys bound, the leases' functions, its operations."""
    return (
        _SLOT_KEYS_FROM_KEYS
        + read_script("vmpool.state.scripts", "_slots.lua")
        + read_script("vmpool.state.scripts", "clone_semaphore.lua")
    )


@dataclass(frozen=True)
class SlotTerms:
    """What a store script taking a VM's clone slot in its own unit is told.

    The fleet's ``limit`` and the lease's length (``lease_s``); for a request's VM, the
    request's place in line (``place``: its slot comes in its turn), None for a warm
    pool's. The script's ARGV for them: :meth:`argv`.
    """

    limit: int
    lease_s: float
    place: float | None = None

    def argv(self) -> list[str]:
        """The limit, the lease seconds and the place ('' for none)."""
        place = "" if self.place is None else repr(float(self.place))
        return [str(self.limit), repr(float(self.lease_s)), place]


@dataclass(frozen=True)
class SlotStats:
    """The semaphore's record: live leases now, the peak, and the overruns.

    The peak is the most leases ever live at once. An overrun is a renewal that went on
    over the limit: a create that ran without a slot.
    """

    live: int
    peak: int
    overruns: int


class CloneSemaphore:
    """At most ``limit`` live leases fleet-wide, each released only by its holder.

    A lease expires ``lease_s`` after it was taken or last renewed.
    """

    def __init__(self, redis_client: redis.Redis, keys: Keys, limit: int, lease_s: float) -> None:
        if limit < 1:
            raise ValueError(f"clone limit must be at least 1, got {limit}")
        if lease_s <= 0:
            raise ValueError(f"lease time must be positive, got {lease_s}")
        self.redis = redis_client
        self.key = keys.clone_slots
        self._keys = [
            keys.clone_slots,
            keys.clone_slot_holders,
            keys.clone_slot_stats,
            keys.clone_slot_line,
        ]
        self.limit = int(limit)
        self.lease_s = float(lease_s)
        self._request_key = keys.request
        self._script = redis_client.register_script(_script_text())
        self._keeper = _LeaseKeeper(self._renew, self.lease_s / 3)

    @property
    def scripts(self) -> list[Script]:
        """Its script (for :func:`~vmpool.state.lua.load_missing`)."""
        return [self._script]

    def terms(self, place: float | None = None) -> SlotTerms:
        """The terms a store script takes a slot on (for a request at ``place``)."""
        return SlotTerms(self.limit, self.lease_s, place)

    def _call(self, *args: str | int) -> object:
        return self._script(keys=self._keys, args=list(args))

    def acquire(self, holder: str, token: int = 0) -> str | None:
        """Take the lease of VM ``holder`` with ``token``: its name, or None.

        Taking also renews a lease this holder has, or takes it over from an older token.
        ``token`` is the fence of the VM lock it is taken under (0 at a reservation). None when
        no slot is free or a newer holder has it. A reservation takes its VM's slot in its
        own unit, in its request's turn (:meth:`terms`, _slots.lua).
        """
        granted = self._call("acquire", holder, int(token), self.limit, repr(self.lease_s))
        return holder if int(str(granted)) == 1 else None

    def release_to_line(self, lease: str, token: int = 0) -> list[str] | None:
        """:meth:`release`, and in the same script the requests whose turn it is then
        (:meth:`turns`): None when no lease was dropped. The caller hands the freed slot
        to the first in line at once."""
        reply = self._call("release_to_line", lease, int(token), self.limit)
        assert isinstance(reply, list)
        if int(reply[0]) != 1:
            return None
        return [r.decode() if isinstance(r, bytes) else str(r) for r in reply[1:]]

    def join_line(self, request: str, place: float) -> bool:
        """The pending request waits in line for a clone slot at ``place``.

        A provision batch reserves nothing for the requests after one refused a slot
        (first come, first served): they wait in line with it, so the slots freed go to
        them in turn at once, not at the next provision sweep. False when the request is
        no longer pending or has no VM left to reserve (nothing written)."""
        keys = [*self._keys, self._request_key(request)]
        reply = self._script(keys=keys, args=["join", request, repr(float(place))])
        return int(str(reply)) == 1

    def leave_line(self, request: str) -> bool:
        """The request waits for no clone slot any more (it can reserve nothing now: its
        TTL is over, or it left pending), so it holds nobody back. True if it stood in
        line (the caller hands its turn on)."""
        return int(str(self.redis.zrem(self._keys[3], request))) > 0

    def in_line(self, requests: Sequence[str]) -> set[str]:
        """Those of ``requests`` waiting in line for a clone slot: one read."""
        if not requests:
            return set()
        places = self.redis.zmscore(self._keys[3], list(requests))
        return {rid for rid, place in zip(requests, places, strict=True) if place is not None}

    def turns(self) -> list[str]:
        """The requests waiting for a clone slot whose turn it is: the first ones in line,
        as many as slots are free (the pending sweep offers them the slots). Nobody in
        line: one read, no script (a script writes: it drops expired leases first)."""
        if not self.redis.exists(self._keys[3]):
            return []
        reply = self._call("turns", self.limit)
        assert isinstance(reply, list)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in reply]

    def acquire_all(self, holders: Sequence[tuple[str, int]]) -> dict[str, bool]:
        """:meth:`acquire` for each (VM, token) of ``holders`` in turn, in one script.

        A batch job's create claim. Returns VM -> whether it holds a lease now.
        """
        if not holders:
            return {}
        return self.granted(holders, self.acquire_all_call(holders).run())

    def acquire_all_call(self, holders: Sequence[tuple[str, int]]) -> ScriptCall:
        """The call of :meth:`acquire_all` (``holders`` not empty), to run with others.
        Its reply goes to :meth:`granted`."""
        pairs = [x for name, token in holders for x in (name, int(token))]
        args = ["acquire_all", self.limit, repr(self.lease_s), *pairs]
        return ScriptCall(self._script, list(self._keys), args)

    @staticmethod
    def granted(holders: Sequence[tuple[str, int]], reply: Any) -> dict[str, bool]:
        """VM -> whether it holds a lease, from :meth:`acquire_all_call`'s reply."""
        if isinstance(reply, Exception):
            raise reply
        assert isinstance(reply, list)
        return {name: int(g) == 1 for (name, _), g in zip(holders, reply, strict=True)}

    def release(self, lease: str, token: int = 0) -> bool:
        """Give the slot of VM ``lease`` back, if it is ours or an older token's.

        True if a live lease was dropped. Releasing twice is fine.
        """
        return int(str(self._call("release", lease, int(token)))) == 1

    @contextmanager
    def renewing(self, holder: str, token: int = 0) -> Iterator[None]:
        """Keep the lease of VM ``holder`` alive while the block runs.

        The block is a provider call that may outlast ``lease_s``: the limit must hold for as
        long as the clone it guards. ``token`` is the lease's holder token.

        - A lease another holder took over (a newer token) is renewed no more.
        - A lease that lapsed (this process paused past it) is retaken. If no slot is free it
          is retaken over the limit: an overrun, counted and logged (the clone is under way).
        - One thread per semaphore renews every block's lease. A thread started and joined per
          create would cost more than the create's Redis calls.
        - When the block ends its lease is renewed no more. An in-flight renewal of it is
          waited for.
        """
        ticket = self._keeper.add((holder, int(token)))
        try:
            yield
        finally:
            self._keeper.remove(ticket)

    def _renew(self, lease: tuple[str, int]) -> bool:
        """One renewal. False once the lease is another holder's: stop renewing it."""
        holder, token = lease
        try:
            got = int(str(self._call("renew", holder, token, self.limit, repr(self.lease_s))))
        except redis.RedisError as exc:  # the next round retries
            log.warning("clone slot lease of %s not renewed: %s", holder, exc)
            return True
        if got == _TAKEN_OVER:
            log.warning("clone slot lease of %s was taken over by a newer holder", holder)
            return False
        if got == _OVERRUN:
            log.warning("clone slot lease of %s lapsed and no slot was free: overrun", holder)
        return True

    def count(self) -> int:
        """Live leases now (expired ones are dropped first)."""
        return int(str(self._call("count")))

    def stats(self) -> SlotStats:
        """Live leases, the peak, and the overruns (one round trip after the count)."""
        live = self.count()
        peak, overruns = self.redis.hmget(self._keys[2], ["peak", "overruns"])
        return SlotStats(live, int(peak or 0), int(overruns or 0))

    def holders(self) -> list[str]:
        """Lease ids currently in the zset (expired ones may still be listed)."""
        return [
            m.decode() if isinstance(m, bytes) else str(m)
            for m in self.redis.zrange(self.key, 0, -1)
        ]


class _LeaseKeeper:
    """One daemon thread that renews each added ticket's lease every ``every`` seconds.

    It calls ``renew(lease)`` until the ticket is removed, or until ``renew`` answers
    False. It starts on first use. While nothing is added it waits on a condition (no Redis
    traffic). It ends after :data:`KEEPER_LINGER_S` without a ticket.

    :meth:`remove` returns only once no renewal of its ticket runs. So nothing renews a
    lease after its block ended, and its release stays a release.
    """

    def __init__(self, renew: Callable[[tuple[str, int]], bool], every: float) -> None:
        self._renew = renew
        self._every = every
        self._cv = threading.Condition()
        self._sleep = RenewerSleep(self._cv)
        self._due: dict[object, tuple[tuple[str, int], float]] = {}  # ticket -> (lease, due)
        self._running: set[object] = set()  # tickets being renewed now
        self._thread: threading.Thread | None = None

    def add(self, holder: tuple[str, int]) -> object:
        ticket = object()
        with self._cv:
            due = time.monotonic() + self._every
            self._due[ticket] = (holder, due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="clone-lease-keeper", daemon=True
                )
                self._thread.start()
            self._sleep.added(due)
        return ticket

    def remove(self, ticket: object) -> None:
        # No wake-up: a ticket gone makes nothing due sooner. A renewal of it in flight
        # wakes this wait when it ends (_run).
        with self._cv:
            self._due.pop(ticket, None)
            while ticket in self._running:
                self._cv.wait()

    def _next(self) -> list[tuple[object, tuple[str, int]]] | None:
        """The tickets due now (marked running), or None when the thread should end."""
        with self._cv:
            while True:
                if not self._due:
                    self._sleep.wait(KEEPER_LINGER_S)
                    if not self._due:
                        self._thread = None  # add() starts another
                        return None
                    continue
                now = time.monotonic()
                due = [(t, h) for t, (h, at) in self._due.items() if at <= now]
                if due:
                    for ticket, holder in due:
                        self._due[ticket] = (holder, now + self._every)
                        self._running.add(ticket)
                    return due
                nxt = min(at for _, at in self._due.values())
                self._sleep.wait(None if nxt == math.inf else nxt - now)

    def _run(self) -> None:
        while (due := self._next()) is not None:
            for ticket, holder in due:
                keep = True
                try:
                    keep = self._renew(holder)
                finally:
                    with self._cv:
                        self._running.discard(ticket)
                        if not keep and ticket in self._due:
                            self._due[ticket] = (holder, math.inf)  # renewed no more
                        self._cv.notify_all()

"""Per-request and per-VM locks with fencing tokens.

Why locks at all: two workers creating the same VM, or reserving for the same request,
at once would waste provider work. The locks are an efficiency measure. Safety rests
on the store's checked transitions (docs/invariants.md). A lock is a lease: its holder
can be paused (GC, SIGSTOP, a slow provider call) past its expiry while another worker
is granted the same lock. Three things make that harmless:

1. Every grant gets a fencing token: ``INCR`` of the subject's fence counter
   (``keys.request_fence(rid)`` / ``keys.vm_fence(name)``), issued by
   ``vmpool/state/scripts/lock_fence.lua`` in the same atomic unit that takes the lock
   (``SET NX PX``). Tokens therefore increase in grant order.
2. Every side-effecting store transition is passed ``fence=lock.fence``. The store
   refuses a token older than the newest grant (``stale_fence``), inside its script.
3. The holder may call :meth:`FencedLock.ensure_held` before a side effect the fence
   cannot guard (a provider call): a token-checked read (it writes nothing, so under
   ``appendfsync always`` it costs no fsync, and the renewer keeps the expiry), which
   raises :class:`LockLost` if another id owns the key or nobody does. Before a store
   write it is not needed and not made (the fence refuses a stale holder inside the
   write). It narrows the window, the fence closes it.

Renewal: a :class:`~vmpool.state.lock_renewer.LockRenewer` (one daemon thread, shared
by every lock of a process that is given it: the Fleet holds one) extends each held
lock every third of its expiry with the same token-checked script. A lock it finds
lost is marked lost (and :meth:`FencedLock.ensure_held` raises). A lock given no
renewer gets a renewer of its own. A grant is one script and a release another (no
round trip or thread per lock beyond them).

Batch jobs: :func:`acquire_all` grants the locks of a claim's subjects in one script,
:func:`held_all` checks them in one read before a side effect for all of them (a
provider's create of many VMs), and :func:`release_all` releases them in one. Each is
still its own lock with its own fresh id and token, granted or refused on its own. A
lock made with ``read_record=True`` also gets its subject's record, read in the
grant's unit (:attr:`FencedLock.record`), so its holder need not read it again.

Acquisition is non-blocking by default: a job that finds the lock taken returns
``busy`` (another worker is on it, and the periodic sweeps bring the work back if that
worker dies). ``blocking=True`` polls the grant with a backoff up to ``timeout_s``.

Keys: the lock key is exactly ``keys.lock(kind, subject)``. Its value is the holder's
lock id (fresh per grant).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, Literal

import redis
from redis.client import Pipeline

from vmpool.state.durability import settle
from vmpool.state.keys import Keys
from vmpool.state.lock_renewer import LockRenewer
from vmpool.state.lua import ScriptCall, read_script, run_pipelined
from vmpool.state.records import text

__all__ = [
    "LOCK_TEXTS",
    "FencedLock",
    "LockBusy",
    "LockKind",
    "LockLost",
    "LockRelease",
    "acquire_all",
    "acquire_all_reading",
    "all_owned",
    "check_call",
    "grant_call",
    "held_all",
    "release_all",
    "releasing",
    "take_granted",
]

log = logging.getLogger(__name__)

LockKind = Literal["request", "vm"]


class LockBusy(RuntimeError):
    """Another holder has the lock (a non-blocking acquire failed)."""


class LockLost(RuntimeError):
    """The lock expired or went to another holder while this one still worked."""


_GRANT_LUA = read_script("vmpool.state.scripts", "lock_fence.lua")
_EXTEND_LUA = read_script("vmpool.state.scripts", "lock_extend.lua")
_RELEASE_LUA = read_script("vmpool.state.scripts", "lock_release.lua")
_CHECK_LUA = read_script("vmpool.state.scripts", "lock_check.lua")
LOCK_TEXTS = (_GRANT_LUA, _EXTEND_LUA, _RELEASE_LUA, _CHECK_LUA)  # to load them at start
# A blocking acquire polls the grant this often at most.
_POLL_MAX_S = 0.1


class FencedLock:
    """A lock on one request or VM, with a fencing token per grant.

    Use as a context manager (``__enter__`` raises :class:`LockBusy` when the lock is
    taken) or with :meth:`acquire` / :meth:`release`. After a grant, :attr:`fence` is the
    token to pass to the store's transitions.
    """

    def __init__(
        self,
        redis_client: redis.Redis,
        keys: Keys,
        kind: LockKind,
        subject: str,
        *,
        expire_s: float,
        holder: str = "",
        blocking: bool = False,
        timeout_s: float | None = None,
        auto_renewal: bool = True,
        orphan_fence_ttl_s: float | None = None,
        renewer: LockRenewer | None = None,
        read_record: bool = False,
    ) -> None:
        if kind == "request":
            self.fence_key = keys.request_fence(subject)
            self.subject_key = keys.request(subject)
        elif kind == "vm":
            self.fence_key = keys.vm_fence(subject)
            self.subject_key = keys.vm(subject)
        else:  # pragma: no cover - guarded by the Literal type
            raise ValueError(f"unknown lock kind {kind!r}")
        self.kind = kind
        self.subject = subject
        self.key = keys.lock(kind, subject)
        self.redis = redis_client
        self.blocking = blocking
        self.timeout_s = timeout_s
        # Whole seconds. Never round a short expiry down to 0.
        self.expire_s = max(1, math.ceil(expire_s))
        self.orphan_fence_ttl_ms = (
            "" if orphan_fence_ttl_s is None else str(max(1, int(orphan_fence_ttl_s * 1000)))
        )
        # A fresh id per FencedLock (so per grant): the holder for humans, then random.
        self.id = f"{holder or 'pid' + str(os.getpid())}:{os.urandom(9).hex()}"
        self._renewer = (renewer or LockRenewer()) if auto_renewal else None
        self.read_record = read_record
        # The subject's hash as the grant read it (read_record), {} when it has none.
        self.record: dict[str, str] = {}
        self.fence: int = 0
        # The write mark its side effect rests on (durability.write_mark): None, all so far.
        self.decided: int | None = None
        self._held = False
        self._lost = False

    # Registered on first use: a batch claim grants and releases all its locks through its
    # first lock's scripts, and few locks are ever renewed or checked.
    _grant = cached_property(lambda self: self.redis.register_script(_GRANT_LUA))
    _extend = cached_property(lambda self: self.redis.register_script(_EXTEND_LUA))
    _release = cached_property(lambda self: self.redis.register_script(_RELEASE_LUA))
    _check = cached_property(lambda self: self.redis.register_script(_CHECK_LUA))

    # -- grant and release -------------------------------------------------------------
    def _try_grant(self) -> int:
        (reply,) = grant_call([self]).run()
        return self._granted(reply)

    def _granted(self, reply: list[Any]) -> int:
        """Take one lock's part of a grant reply ({token, record}). The token."""
        token, flat = int(reply[0]), reply[1]
        self.record = {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)}
        return token

    def acquire(self) -> bool:
        """Try to take the lock. True with :attr:`fence` set, False if someone holds it."""
        if self._held:
            raise RuntimeError(f"{self.key}: already acquired by this FencedLock")
        token = self._try_grant()
        if not token and self.blocking:
            deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
            delay = 0.01
            while not token and (deadline is None or time.monotonic() < deadline):
                left = _POLL_MAX_S if deadline is None else deadline - time.monotonic()
                time.sleep(max(0.0, min(delay, left)))
                delay = min(2 * delay, _POLL_MAX_S)
                token = self._try_grant()
        return self._taken(token)

    def _taken(self, token: int) -> bool:
        if not token:
            log.debug("lock %s is busy", self.key)
            return False
        self.fence = token
        self._held = True
        self._lost = False
        if self._renewer is not None:
            self._renewer.add(self)
        log.debug("lock %s granted, fence %d", self.key, token)
        return True

    def release(self) -> None:
        """Release the lock. A lock already lost is logged, not raised.

        The work done under it was fenced, and the new holder's lock must not be touched.
        """
        if not self._let_go():
            return
        if not int(self._release(keys=[self.key], args=[self.id])):
            self._expired_before_release()

    def _let_go(self) -> bool:
        """Mark released (the renewer forgets it). False if it was not held."""
        if not self._held:
            return False
        self._held = False
        if self._renewer is not None:
            self._renewer.remove(self)
        return True

    def _expired_before_release(self) -> None:
        log.warning("lock %s (fence %d) had expired before its release", self.key, self.fence)

    def renew_every_s(self) -> float:
        return self.expire_s / 3

    def _renew(self) -> bool:
        """One token-checked extend (the renewer's). False, and marked lost, if not ours."""
        if not self._held:
            return False
        if int(self._extend(keys=[self.key], args=[self.expire_s * 1000, self.id])):
            return True
        self._lost = True
        log.warning("lock %s (fence %d) was lost while held", self.key, self.fence)
        return False

    def _owned(self) -> bool:
        """One token-checked read (writes nothing). False, and marked lost, if not ours."""
        if int(self._check(keys=[self.key], args=[self.id])):
            return True
        self._lost = True
        log.warning("lock %s (fence %d) was lost while held", self.key, self.fence)
        return False

    # -- ownership ---------------------------------------------------------------------
    def owner(self) -> str | None:
        """The id that owns the lock key now (None when nobody does)."""
        owner = self.redis.get(self.key)
        if owner is None:
            return None
        return owner.decode() if isinstance(owner, bytes) else str(owner)

    def ensure_held(self) -> None:
        """Raise :class:`LockLost` unless this holder still owns the lock.

        A token-checked read (``lock_check.lua``, which writes nothing): the key holds our id.
        It does not push the expiry out (the renewer does, every third of it): a write
        here would cost an fsync under ``appendfsync always``. Call it before a side
        effect the fence cannot guard (a provider call). The store's fence check remains
        the guarantee, and no call is needed before a store write. In a unit of work
        (:func:`vmpool.state.durability.confirmed`) it confirms the unit's writes so far:
        those before :attr:`decided` when it is set (for this call only).
        """
        if not self._held:
            raise LockLost(f"{self.key}: not held")
        if self._lost or not self._owned():
            raise LockLost(
                f"{self.key}: lock lost (fence {self.fence}, owner now {self.owner()!r})"
            )
        settle(self.redis, self.decided)  # in a unit of work: its writes and this read
        self.decided = None  # the mark was the next side effect's: later ones confirm all

    @property
    def held(self) -> bool:
        """Whether this holder believes it holds the lock (see :meth:`ensure_held`)."""
        return self._held

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> FencedLock:
        if not self.acquire():
            raise LockBusy(self.key)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def acquire_all(locks: Sequence[FencedLock]) -> list[FencedLock]:
    """Try to grant every lock of ``locks`` in one script. Returns the granted ones.

    The locks are not yet held and made alike (one client, one expiry, one orphan TTL,
    one ``read_record``). Each is granted or refused on its own (a refused one is busy,
    as :meth:`FencedLock.acquire` without blocking). Each granted one has its
    :attr:`~FencedLock.fence` (and :attr:`~FencedLock.record`) and is renewed as usual
    until released.
    """
    return acquire_all_reading(locks)[0]


def acquire_all_reading(
    locks: Sequence[FencedLock], reads: Callable[[Pipeline], None] | None = None
) -> tuple[list[FencedLock], list[Any]]:
    """:func:`acquire_all`, and ``reads`` (plain reads queued on a pipeline) in the same
    round trip, after the grant: the granted locks and the reads' replies."""
    if not locks:
        return [], []
    replies = run_pipelined(locks[0].redis, [grant_call(locks)], reads=reads)
    return take_granted(locks, replies[0]), replies[1:]


def grant_call(locks: Sequence[FencedLock]) -> ScriptCall:
    """:func:`acquire_all`'s call (``locks`` not empty); its reply to :func:`take_granted`."""
    first = locks[0]
    if any(lk._held for lk in locks):
        raise RuntimeError("acquire_all: a lock is already acquired")
    keys = [k for lk in locks for k in (lk.key, lk.fence_key, lk.subject_key)]
    # lock_fence.lua's ARGV: the orphan fence TTL, the expiry, the read flag, the lock ids
    read = "1" if first.read_record else "0"
    args = [first.orphan_fence_ttl_ms, first.expire_s * 1000, read, *(lk.id for lk in locks)]
    return ScriptCall(first._grant, keys, args)


def take_granted(locks: Sequence[FencedLock], reply: Any) -> list[FencedLock]:
    """Those of ``locks`` :func:`grant_call`'s ``reply`` granted, held (raises an error)."""
    if isinstance(reply, Exception):
        raise reply
    return [lk for lk, r in zip(locks, reply, strict=True) if lk._taken(lk._granted(r))]


def held_all(locks: Sequence[FencedLock]) -> bool:
    """:meth:`FencedLock.ensure_held` for every lock of ``locks`` (one client) at once.

    One token-checked read of them all, then the unit's writes before the first lock's
    :attr:`~FencedLock.decided` mark confirmed (the locks of one claim share it): before
    one side effect for all their subjects (a provider's create of many VMs). False when
    one is not held or not ours any more: each then checks alone, as it would have."""
    call = check_call(locks)
    if call is None or not all_owned(locks, call.run()):
        return False
    first = locks[0]
    settle(first.redis, first.decided)
    for lock in locks:
        lock.decided = None  # as ensure_held: the mark was this side effect's
    return True


def check_call(locks: Sequence[FencedLock]) -> ScriptCall | None:
    """:func:`held_all`'s token-checked read, to run with other calls (its reply goes to
    :func:`all_owned`). None when a lock of ``locks`` is not held here, or lost."""
    if not locks or not all(lk._held and not lk._lost for lk in locks):
        return None
    return ScriptCall(locks[0]._check, [lk.key for lk in locks], [lk.id for lk in locks])


def all_owned(locks: Sequence[FencedLock], reply: Any) -> bool:
    """Whether :func:`check_call`'s ``reply`` found every lock of ``locks`` ours."""
    return not isinstance(reply, Exception) and int(reply) == len(locks)


def release_all(locks: Sequence[FencedLock]) -> None:
    """Release every held lock of ``locks`` (one client) in one script.

    Each is checked on its own: only a lock still ours is deleted. Locks found expired
    are logged, as :meth:`FencedLock.release` does.
    """
    release = releasing(locks)
    if release is not None:
        release.check(release.call.run())


class LockRelease:
    """The release of a claim's held locks, to run alone or with other calls.

    :attr:`call` deletes each lock still ours (one script). Its reply goes to
    :meth:`check`, which logs the locks found expired, as :meth:`FencedLock.release`
    does. The locks are already marked released (the renewer forgets them)."""

    def __init__(self, locks: list[FencedLock]) -> None:
        self.locks = locks
        first = locks[0]
        self.call = ScriptCall(first._release, [lk.key for lk in locks], [lk.id for lk in locks])

    def check(self, reply: Any) -> None:
        """Log the locks that had expired before the release (``reply``: the call's)."""
        if isinstance(reply, Exception):
            raise reply
        if int(reply) < len(self.locks):
            for lock in self.locks:
                if lock.owner() != lock.id:
                    lock._expired_before_release()


def releasing(locks: Sequence[FencedLock]) -> LockRelease | None:
    """The release of the held locks of ``locks`` (one client), or None: none held.

    Those held are marked released at once: the caller runs :attr:`LockRelease.call`
    (with other calls in one round trip: the end of a batch claim) and checks its reply."""
    held = [lk for lk in locks if lk._let_go()]
    return LockRelease(held) if held else None

"""Per-request and per-VM locks with fencing tokens, over python-redis-lock.

Why locks at all: two workers creating the same VM, or reserving for the same request,
at once would waste provider work. The locks are an efficiency measure; safety rests
on the store's checked transitions (DESIGN.md "Locks"). A lock is a lease: its holder
can be paused (GC, SIGSTOP, a slow provider call) past its expiry while another worker
is granted the same lock. Three things make that harmless:

1. Every grant gets a fencing token: ``INCR`` of the subject's fence counter
   (``keys.request_fence(rid)`` / ``keys.vm_fence(name)``), issued by
   ``vmpool/state/scripts/lock_fence.lua`` only to the current owner of the lock, in the same
   atomic unit that checks the ownership. Tokens therefore increase in grant order.
2. Every side-effecting store transition is passed ``fence=lock.fence``; the store
   refuses a token older than the newest grant (``stale_fence``), inside its script.
3. python-redis-lock's auto-renewal thread dies silently when the lock is lost
   (``NotAcquired`` in a daemon thread; the holder is never told), so the holder calls
   :meth:`FencedLock.ensure_held` before every side effect (a provider call, a store
   transition): a token-checked extend, which raises :class:`LockLost` if another id
   owns the key or nobody does. That check narrows the window; the fence closes it.

Acquisition is non-blocking by default: a job that finds the lock taken returns
``busy`` (another worker is on it; the periodic sweeps bring the work back if that
worker dies).

Keys: python-redis-lock names its keys ``lock:<name>`` and ``lock-signal:<name>``;
vmpool keeps every key under its own prefix, so the lock key is exactly
``keys.lock(kind, subject)`` and its wake-up list that key plus ``:signal``.
"""

from __future__ import annotations

import logging
import math
import os
from types import TracebackType
from typing import Any, Literal

import redis
import redis_lock

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = ["FencedLock", "LockBusy", "LockKind", "LockLost"]

log = logging.getLogger(__name__)

LockKind = Literal["request", "vm"]


class LockBusy(RuntimeError):
    """Another holder has the lock (a non-blocking acquire failed)."""


class LockLost(RuntimeError):
    """The lock expired or went to another holder while this one still worked."""


def _fence_script_text() -> str:
    return read_script("vmpool.state.scripts", "lock_fence.lua")


class FencedLock:
    """A python-redis-lock lock on one request or VM, with a fencing token per grant.

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
        # python-redis-lock takes whole seconds; never round a short expiry down to 0
        # (which would mean "never expires").
        self.expire_s = max(1, math.ceil(expire_s))
        self.orphan_fence_ttl_ms = (
            "" if orphan_fence_ttl_s is None else str(max(1, int(orphan_fence_ttl_s * 1000)))
        )
        # A fresh id per FencedLock (so per grant): the holder for humans, then random.
        self.id = f"{holder or 'pid' + str(os.getpid())}:{os.urandom(9).hex()}"
        self._lock: Any = redis_lock.Lock(
            redis_client,
            self.key,
            expire=self.expire_s,
            id=self.id,
            auto_renewal=auto_renewal,
        )
        # Keep the lock's keys under vmpool's prefix (the library would add "lock:").
        self._lock._name = self.key
        self._lock._signal = keys.lock_signal(kind, subject)
        self._fence_script = redis_client.register_script(_fence_script_text())
        self.fence: int = 0
        self._held = False

    # -- grant and release -------------------------------------------------------------
    def acquire(self) -> bool:
        """Try to take the lock; True with :attr:`fence` set, False if someone holds it."""
        if self._held:
            raise RuntimeError(f"{self.key}: already acquired by this FencedLock")
        if self.blocking:
            timeout = None if self.timeout_s is None else max(1, math.ceil(self.timeout_s))
            granted = bool(self._lock.acquire(blocking=True, timeout=timeout))
        elif self.redis.exists(self.key):
            # Busy is the normal answer of a non-blocking acquire; checking first spares
            # the library's WARNING log line for it. (A lock freed just after this read
            # is reported busy: harmless, the sweeps bring the work back.)
            granted = False
        else:
            granted = bool(self._lock.acquire(blocking=False))
        if not granted:
            log.debug("lock %s is busy", self.key)
            return False
        try:
            token = int(
                self._fence_script(
                    keys=[self.key, self.fence_key, self.subject_key],
                    args=[self.id, self.orphan_fence_ttl_ms],
                )
            )
        except BaseException:
            # Granted but no token (Redis restarting, a lost reply): the caller sees the
            # error and never releases, so stop the renewal here, or the library's thread
            # keeps the lease alive for as long as the process lives and every later job
            # on the subject is 'busy' (seen in the chaos soak).
            self._abandon()
            raise
        if token == 0:
            # Lost between the SET NX and the token (a pause longer than the expiry).
            log.warning("lock %s was lost before its fencing token was issued", self.key)
            self._stop_renewal()
            return False
        self.fence = token
        self._held = True
        log.debug("lock %s granted, fence %d", self.key, token)
        return True

    def release(self) -> None:
        """Release the lock. A lock already lost is logged, not raised: the work done
        under it was fenced, and the new holder's lock must not be touched."""
        if not self._held:
            return
        self._held = False
        try:
            self._lock.release()
        except redis_lock.NotAcquired:
            log.warning("lock %s (fence %d) had expired before its release", self.key, self.fence)

    def _abandon(self) -> None:
        """Give up a grant that never got its token: stop the renewal, then release the
        key if Redis answers (else it expires with its lease)."""
        self._stop_renewal()
        try:
            self._lock.release()
        except (redis_lock.NotAcquired, redis.RedisError):
            log.warning("lock %s: granted without a token; left to expire", self.key)

    def _stop_renewal(self) -> None:
        stopper = getattr(self._lock, "_stop_lock_renewer", None)
        if callable(stopper):
            stopper()

    # -- ownership ---------------------------------------------------------------------
    def owner(self) -> str | None:
        """The id that owns the lock key now (None when nobody does)."""
        owner: Any = self._lock.get_owner_id()
        return None if owner is None else str(owner)

    def ensure_held(self) -> None:
        """Raise :class:`LockLost` unless this holder still owns the lock.

        A token-checked extend (python-redis-lock's EXTEND script): it checks the key
        holds our id and pushes the expiry out again, in one unit. Call it before every
        side effect; the store's fence check remains the guarantee.
        """
        if not self._held:
            raise LockLost(f"{self.key}: not held")
        try:
            self._lock.extend()
        except redis_lock.NotAcquired as exc:
            raise LockLost(
                f"{self.key}: lock lost (fence {self.fence}, owner now {self.owner()!r})"
            ) from exc

    @property
    def held(self) -> bool:
        """Whether this holder believes it holds the lock (see :meth:`ensure_held`)."""
        return self._held

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> FencedLock:
        if not self.acquire():
            raise LockBusy(self.key)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

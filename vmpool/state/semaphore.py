"""The fleet-wide on-demand clone limit: a Redis semaphore of leases.

vmpooler counts clones in progress in one process; vmpool has many worker processes on
many machines, so the count lives in Redis: a zset whose members are lease ids and whose
scores are the leases' expiry times (Redis server time).
``vmpool/state/scripts/clone_semaphore.lua`` drops expired leases, then checks the limit
and adds the lease in one atomic unit.

Lease ids are VM names: a slot is taken for a VM when it is reserved
(``lifecycle.provision_request``) and given back when its create finishes, however it
finishes (``lifecycle.create_vm`` releases in a ``finally``; the reconciler and the
failure paths release too). Acquiring again with the id of a live lease renews it, so a
create job that runs twice, or a re-dispatched create, holds one slot, not two. A worker
killed mid-create never releases: its lease expires (``lease_s``, twice the lock
expiry) and the slot comes back by itself. A live create keeps its lease for as long as
its provider call runs, however long that is: ``renewing`` renews it from a thread
every third of ``lease_s`` (so two renewals may be missed before it lapses).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = ["CloneSemaphore"]

log = logging.getLogger(__name__)


def _script_text() -> str:
    return read_script("vmpool.state.scripts", "clone_semaphore.lua")


class CloneSemaphore:
    """At most ``limit`` live leases fleet-wide, each expiring ``lease_s`` after it was
    taken (or last renewed)."""

    def __init__(self, redis_client: redis.Redis, keys: Keys, limit: int, lease_s: float) -> None:
        if limit < 1:
            raise ValueError(f"clone limit must be at least 1, got {limit}")
        if lease_s <= 0:
            raise ValueError(f"lease time must be positive, got {lease_s}")
        self.redis = redis_client
        self.key = keys.clone_slots
        self.limit = int(limit)
        self.lease_s = float(lease_s)
        self._script = redis_client.register_script(_script_text())

    def acquire(self, holder: str) -> str | None:
        """Take (or renew) the lease ``holder``; its id, or None when all slots are taken."""
        granted = self._script(
            keys=[self.key], args=["acquire", holder, self.limit, repr(self.lease_s)]
        )
        return holder if int(granted) == 1 else None

    def release(self, lease: str) -> bool:
        """Give the slot back; True if a live lease was dropped (releasing twice is fine)."""
        return int(self._script(keys=[self.key], args=["release", lease])) == 1

    @contextmanager
    def renewing(self, holder: str) -> Iterator[None]:
        """Keep the lease ``holder`` alive while the block runs (a provider call that
        may outlast ``lease_s``): the limit must hold for as long as the clone it
        guards. Renewal is ``acquire`` again: it renews a live lease, and retakes a
        lapsed one only if a slot is free, so it never pushes the count over the limit.
        A lapse (this process paused past the lease) is logged; the caller goes on,
        since the clone is already under way."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(self.lease_s / 3):
                try:
                    if self.acquire(holder) is None:
                        log.warning("clone slot lease of %s lapsed; no slot free to retake", holder)
                except redis.RedisError as exc:  # the next round retries
                    log.warning("clone slot lease of %s not renewed: %s", holder, exc)

        thread = threading.Thread(target=renew, name=f"clone-lease-{holder}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def count(self) -> int:
        """Live leases now (expired ones are dropped first)."""
        return int(self._script(keys=[self.key], args=["count"]))

    def holders(self) -> list[str]:
        """Lease ids currently in the zset (expired ones may still be listed)."""
        return [
            m.decode() if isinstance(m, bytes) else str(m)
            for m in self.redis.zrange(self.key, 0, -1)
        ]

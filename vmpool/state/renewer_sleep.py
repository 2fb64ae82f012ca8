"""The sleep of a renewer thread, woken only when a lease added is due before it ends.

A process's lock renewer (:class:`vmpool.state.lock_renewer.LockRenewer`) and clone-lease
keeper (:mod:`vmpool.state.semaphore`) each sleep on a condition until their next lease
is due. Every lock a batch job takes is added to one, and every clone slot held while a
create runs to the other: dozens per second under load. Notifying the thread at each
add woke it each time, only for it to find nothing due and sleep again: a thread switch
and a GIL hand-over per lease, a sizable share of a busy worker's CPU. The leases of a
renewer are renewed every same fraction of one expiry, so a lease added is almost never
due before those already held: the thread is woken only when it is.
"""

from __future__ import annotations

import math
import threading
import time

__all__ = ["RenewerSleep"]


class RenewerSleep:
    """When a renewer thread looks at its leases next, and its wake-up if one is due sooner.

    The renewer thread calls :meth:`wait` (holding ``cv``) in place of ``cv.wait``. Whoever
    adds a lease calls :meth:`added` (holding ``cv``) with the time the lease is due.
    """

    def __init__(self, cv: threading.Condition) -> None:
        self.cv = cv
        # While the thread waits: when its wait ends. Otherwise -inf: it looks at its
        # leases again before it waits, so nothing needs to wake it.
        self._until = -math.inf

    def wait(self, timeout: float | None) -> None:
        """``cv.wait(timeout)``, the end of the wait known to :meth:`added`."""
        self._until = math.inf if timeout is None else time.monotonic() + timeout
        try:
            self.cv.wait(timeout)
        finally:
            self._until = -math.inf

    def added(self, due: float) -> None:
        """A lease due at ``due`` (monotonic) was added: wake the thread if it sleeps past it."""
        if due < self._until:
            self.cv.notify_all()

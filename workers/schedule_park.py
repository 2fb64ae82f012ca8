"""Periodic jobs with nothing to do: their runs skipped, the pending sweep parked.

A job's *inputs* are the keys its sweep reads first
(:func:`vmpool.lifecycle.idle.sweep_inputs`). A move of the schedule
(:meth:`workers.schedule.FleetScheduler.move`) checks them with one ``EXISTS`` and
queues no run when all are absent: an RQ run costs some sixty Redis commands, the check
one. The due time moves on the grid all the same, so a run comes within one interval of
the first input appearing: the expiry sweep's bound holds (no open request, nothing to
expire).

The pending sweep (the job table's ``woken`` row) goes further, as its interval is
short (0.25 s): when nothing is reserved or booting it *parks*. The move's own script
(``schedule_move.lua``) checks its inputs: when all are absent it sets the sweep's next
due time :data:`PARK_S` away (its safety tick) and a mark (``keys.schedule_parked``,
whose value is the earliest next due time: a cadence after the one just moved), in one
unit. The store's script that reserves a VM takes that mark and pushes its value to
``keys.schedule_wake`` (_prelude.lua's ``wake_pending_sweep``, in the reservation's
unit). Between ticks a replica blocks on that list (:meth:`Parking.wait`) instead of
sleeping; the one that pops the wake-up moves the sweep's due time to it if sooner
(``ZADD LT``: never closer than a cadence to the last run), and ticks. So the sweep
runs at its interval while a VM is reserved or booting, starts a round trip after the
first reservation, and runs every :data:`PARK_S` otherwise.

The sweep runs at every due time, parked or not: the check reads the pools of the
scheduler's config, a run those of the worker's, and a wake-up always leads to a run.
No reservation goes unseen: it comes before the move's script (and its VM is an input)
or after it (and it finds the mark). A wake-up pushed while no scheduler runs waits in
the list for the next one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Final

import redis

from vmpool.ids import Job
from vmpool.state.connection import one_try
from vmpool.state.keys import Keys
from workers.dequeue import wake_wait_s
from workers.schedule_log import text
from workers.table import JOBS, PERIODIC, template_id

__all__ = ["BLOCK_LATE_S", "PARK_S", "Parking"]

log = logging.getLogger(__name__)

# A parked pending sweep's safety tick: it runs this often however idle the fleet is.
PARK_S: Final = 30.0
# How late Redis may end a block (BLPOP's timeout): it looks at them once per tick of
# its ``hz`` (10 by default: measured 0-108 ms late). A wait ends its block that much
# early and sleeps the rest, so a due time is kept to the millisecond.
BLOCK_LATE_S: Final = 0.11


class Parking:
    """One scheduler replica's checks of the jobs' inputs, and its wait for wake-ups.

    ``inputs``: per job, the keys whose absence means it has nothing to do (a job not
    in it always runs).
    """

    def __init__(
        self, connection: redis.Redis, keys: Keys, inputs: Mapping[Job, Sequence[str]]
    ) -> None:
        self.connection = connection
        self.keys = keys
        self.inputs = dict(inputs)
        self._block_s = wake_wait_s(connection)

    def parks(self, name: Job) -> bool:
        """Whether ``name`` parks when idle (its move's script decides: see the module)."""
        return JOBS[name].woken and name in self.inputs

    def has_work(self, name: Job) -> bool:
        """Whether one of ``name``'s inputs exists (True without inputs, or if it parks).

        One ``EXISTS``.
        """
        inputs = self.inputs.get(name)
        if inputs is None or self.parks(name):
            return True
        return bool(inputs) and int(self.connection.exists(*inputs)) > 0

    def park_keys(self, name: Job) -> list[str]:
        """The KEYS ``schedule_move.lua`` takes, after its own, for a parking job."""
        return [self.keys.schedule_parked, *self.inputs[name]]

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: until a reservation wakes the parked sweep.

        Blocks on ``keys.schedule_wake`` a few seconds at a time (within the socket
        timeout), and sleeps the last :data:`BLOCK_LATE_S` here. A wake-up moves the
        sweep's due time (:meth:`wake`) and ends the wait. A wait too short to block
        (a short ``--interval``, another job due soon) looks at the list once without
        blocking, so a replica whose waits are all short still takes wake-ups.
        """
        end = time.monotonic() + seconds
        blocked = False
        while (left := end - time.monotonic()) > 2 * BLOCK_LATE_S:
            blocked = True
            try:
                with one_try():  # a retried block would overrun the due time
                    popped = self.connection.blpop(
                        [self.keys.schedule_wake], timeout=min(left - BLOCK_LATE_S, self._block_s)
                    )
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # Killed or lost: sleep to the due time; the tick then meets Redis as it is.
                log.info("scheduler: its wait for a wake-up was cut (%s)", exc)
                break
            if popped is not None:
                self.wake(text(popped[1]))
                return
        if not blocked:
            earliest = self.connection.lpop(self.keys.schedule_wake)
            if isinstance(earliest, (bytes, str)):  # LPOP without a count: one value
                self.wake(text(earliest))
                return
        time.sleep(max(0.0, end - time.monotonic()))  # the last bit here, on time

    def wake(self, earliest: str) -> None:
        """Move the parking job's due time to ``earliest`` (a wake-up's), if sooner."""
        try:
            due = float(earliest)
        except ValueError:
            log.warning("ignored a wake-up of the schedule: %r is no time", earliest)
            return
        for spec in PERIODIC:
            if spec.woken:
                template = template_id(self.keys, spec.name)
                self.connection.zadd(self.keys.schedule_due, {template: due}, xx=True, lt=True)

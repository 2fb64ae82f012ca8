"""One VM reserved under a fresh name within the clone limit.

The step a request's provision and a warm pool's top-up share.

The clone slot is taken for the name before its reservation is written, and handed to
the VM's create job, which gives it back. A reservation refused or raising gives it
back at once. A name already taken (``name_taken``: the name exists, tombstones
included) is drawn again, up to :data:`MAX_NAME_ATTEMPTS` times. Collisions are rare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.outcomes import ReserveCode, StoreCode, store_code
from vmpool.state.records import Outcome

__all__ = ["MAX_NAME_ATTEMPTS", "Reservation", "reserve_fresh"]

# Hostnames drawn for one VM before giving up on it this round.
MAX_NAME_ATTEMPTS = 8


@dataclass(frozen=True)
class Reservation:
    """One attempt's result: ``code``, and the VM's ``name`` when it was reserved."""

    code: ReserveCode | StoreCode
    name: str = ""


def reserve_fresh(
    fleet: Fleet,
    what: str,
    reserve: Callable[[str], Outcome],
    line: tuple[str, float] | None = None,
) -> Reservation:
    """Reserve one VM under a fresh name within the clone limit.

    Reserve one VM: a fresh name, its clone slot, then ``reserve(name)`` (the store's
    transition, logged as ``what``). Returns ``reserved`` with the name,
    ``clone_limit``, ``names_exhausted``, or the store's refusal (the slot given back).
    ``line``: the request's id and place in line, for a request's VM: its slot comes in
    its turn (:meth:`~vmpool.state.semaphore.CloneSemaphore.acquire`)."""
    for _ in range(MAX_NAME_ATTEMPTS):
        name = fleet.names()
        if fleet.slots.acquire(name, line=line) is None:
            return Reservation(ReserveCode.CLONE_LIMIT)
        try:
            outcome = reserve(name)
        except BaseException:
            fleet.slots.release(name)
            raise
        note_outcome(what, name, outcome)
        if outcome.ok:
            return Reservation(ReserveCode.RESERVED, name)
        fleet.slots.release(name)
        if outcome.code != "name_taken":
            return Reservation(store_code(outcome))
    return Reservation(ReserveCode.NAMES_EXHAUSTED)

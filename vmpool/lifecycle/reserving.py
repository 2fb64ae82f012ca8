"""One VM reserved under a fresh name within the clone limit.

The step a request's provision and a warm pool's top-up share.

The clone slot is taken in the reservation's own unit (the store's script, given the
semaphore's terms), and handed to the VM's create job, whose ``vm_created`` gives it
back. A reservation refused holds none. A name already taken (``name_taken``: the name
exists, tombstones included) is drawn again, up to :data:`MAX_NAME_ATTEMPTS` times.
Collisions are rare.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.outcomes import ReserveCode, StoreCode, store_code
from vmpool.state.records import Outcome
from vmpool.state.semaphore import SlotTerms

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
    reserve: Callable[[str, SlotTerms], Outcome],
    place: float | None = None,
) -> Reservation:
    """Reserve one VM under a fresh name within the clone limit.

    Reserve one VM: a fresh name, then ``reserve(name, terms)`` (the store's transition,
    logged as ``what``), which takes its clone slot on the semaphore's ``terms`` in its
    unit. Returns ``reserved`` with the name, ``clone_limit``, ``names_exhausted``, or
    the store's refusal. ``place``: the request's place in line, for a request's VM:
    its slot comes in its turn (_slots.lua ``slot_acquire_in_line``)."""
    terms = fleet.slots.terms(place)
    for _ in range(MAX_NAME_ATTEMPTS):
        name = fleet.names()
        outcome = reserve(name, terms)
        note_outcome(what, name, outcome)
        if outcome.ok:
            return Reservation(ReserveCode.RESERVED, name)
        if outcome.code == ReserveCode.CLONE_LIMIT:
            return Reservation(ReserveCode.CLONE_LIMIT)
        if outcome.code != "name_taken":
            return Reservation(store_code(outcome))
    return Reservation(ReserveCode.NAMES_EXHAUSTED)

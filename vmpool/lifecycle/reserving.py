"""One VM reserved under a fresh name within the clone limit, and a provision claim's
reservations made at once.

The step a request's provision and a warm pool's top-up share.

The clone slot is taken in the reservation's own unit (the store's script, given the
semaphore's terms), and handed to the VM's create job, whose ``vm_created`` gives it
back. A reservation refused holds none. A name already taken (``name_taken``: the name
exists, tombstones included) is drawn again, up to :data:`MAX_NAME_ATTEMPTS` times.
Collisions are rare.

A provision claim reserves the VMs its requests miss in one round trip
(:func:`reserve_at_once`), each reservation still its own script, as each request's step
would one by one; each step then takes its request's outcomes
(:class:`MadeAtOnce`) in place of its own first tries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vmpool.config import PoolConfig
from vmpool.ids import Job
from vmpool.lifecycle.fleet import Fleet, note_outcome
from vmpool.lifecycle.outcomes import ReserveCode, StoreCode, store_code
from vmpool.lifecycle.quotas import has_quota
from vmpool.state.locks import FencedLock
from vmpool.state.records import Outcome, RequestRecord
from vmpool.state.semaphore import SlotTerms
from vmpool.state.store import VMAsk
from vmpool.state.transitions import RequestStatus

__all__ = [
    "MAX_NAME_ATTEMPTS",
    "MadeAtOnce",
    "Reservation",
    "configured_pool",
    "reserve_at_once",
    "reserve_fresh",
]

# Hostnames drawn for one VM before giving up on it this round.
MAX_NAME_ATTEMPTS = 8


@dataclass(frozen=True)
class Reservation:
    """One attempt's result: ``code``, and the VM's ``name`` when it was reserved."""

    code: ReserveCode | StoreCode
    name: str = ""


@dataclass
class MadeAtOnce:
    """The reservations a provision claim made for one request, by slot alias, in the
    order made: each stands for its step's first try of one VM (:func:`reserve_fresh`)."""

    by_alias: dict[str, list[tuple[str, Outcome]]] = field(default_factory=dict)
    # Each VM reserved or refused a clone slot: the request has its VMs, or the refusal's
    # script put it in the slots' line at its place (nothing left for its step to write)
    placed: bool = False

    def take(self, alias: str) -> tuple[str, Outcome] | None:
        """The next reservation made for ``alias``: its VM's name and outcome."""
        made = self.by_alias.get(alias)
        return made.pop(0) if made else None


def configured_pool(fleet: Fleet, pool: str) -> PoolConfig | None:
    """``pool``'s config, None when it is not configured or its provider is not."""
    config = fleet.config.pools.get(pool)
    return config if config is not None and config.provider in fleet.providers else None


def reserve_at_once(fleet: Fleet, locks: Sequence[FencedLock]) -> dict[str, MadeAtOnce]:
    """Reserve the VMs the claim's requests miss, in one round trip, in the claim's order.

    For each request pending with unreserved slots (as its lock's grant read it), of a
    user without a quota: one VM per missing VM of each configured slot, under the
    request's fence, its clone slot in the request's turn. Each VM reserved has its
    create dispatched here, whether or not its request's step runs. A request of a user
    with a quota is left to its step (its user's older requests go first). Returns each
    request's outcomes (:class:`MadeAtOnce`): a script's error leaves its VM to the step.
    """
    asks = _missing_vms(fleet, locks)
    outcomes = fleet.store.reserve_vms(asks, actor=fleet.who("provision")) if asks else []
    made: dict[str, MadeAtOnce] = {}
    reserved: list[str] = []
    for ask, outcome in zip(asks, outcomes, strict=True):
        if isinstance(outcome, Exception):
            continue
        by_alias = made.setdefault(ask.request_id, MadeAtOnce()).by_alias
        by_alias.setdefault(ask.alias, []).append((ask.name, outcome))
        if outcome.ok:
            reserved.append(ask.name)
    for one in made.values():
        tried = [got for tries in one.by_alias.values() for _, got in tries]
        one.placed = all(got.ok or got.code == ReserveCode.CLONE_LIMIT for got in tried)
    if reserved:
        fleet.dispatch.send(Job.CREATE_VM, reserved)
    return made


def _missing_vms(fleet: Fleet, locks: Sequence[FencedLock]) -> list[VMAsk]:
    """A fresh VM for each VM the locks' requests miss (see :func:`reserve_at_once`)."""
    asks: list[VMAsk] = []
    for lock in locks:
        req = RequestRecord.from_hash(lock.record) if lock.record else None
        if req is None or req.status != RequestStatus.PENDING or req.unreserved <= 0:
            continue
        if has_quota(fleet, req.token_user):
            continue
        terms = fleet.slots.terms(req.place)
        for slot in req.slots:
            pool = configured_pool(fleet, slot.pool)
            if pool is None:
                continue
            asks += [
                VMAsk(req.id, fleet.names(), slot.alias, pool.name, pool.template,
                      pool.provider, pool.domain, lock.fence, terms)
                for _ in range(slot.want - slot.live)
            ]  # fmt: skip
    return asks


def reserve_fresh(
    fleet: Fleet,
    what: str,
    reserve: Callable[[str, SlotTerms], Outcome],
    place: float | None = None,
    made: tuple[str, Outcome] | None = None,
) -> Reservation:
    """Reserve one VM under a fresh name within the clone limit.

    Reserve one VM: a fresh name, then ``reserve(name, terms)`` (the store's transition,
    logged as ``what``), which takes its clone slot on the semaphore's ``terms`` in its
    unit. Returns ``reserved`` with the name, ``clone_limit``, ``names_exhausted``, or
    the store's refusal. ``place``: the request's place in line, for a request's VM:
    its slot comes in its turn (_slots.lua ``slot_acquire_in_line``). ``made``: the
    first try's name and outcome, already made (:func:`reserve_at_once`)."""
    terms = fleet.slots.terms(place)
    for _ in range(MAX_NAME_ATTEMPTS):
        if made is None:
            name = fleet.names()
            outcome = reserve(name, terms)
        else:
            (name, outcome), made = made, None
        note_outcome(what, name, outcome)
        if outcome.ok:
            return Reservation(ReserveCode.RESERVED, name)
        if outcome.code == ReserveCode.CLONE_LIMIT:
            return Reservation(ReserveCode.CLONE_LIMIT)
        if outcome.code != "name_taken":
            return Reservation(store_code(outcome))
    return Reservation(ReserveCode.NAMES_EXHAUSTED)

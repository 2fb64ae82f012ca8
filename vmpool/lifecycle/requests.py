"""The request's side of the lifecycle: reserving its VMs, re-checking it, expiring it.

``provision_request`` reserves VMs for a request's unreserved slots within the fleet's
clone limit (under the request's fenced lock). ``check_request`` re-checks one request.
``sweep_expired`` and ``provision_sweep`` are the periodic sweeps that find the requests
needing work from Redis state alone. Every state change is one checked store transition
(:mod:`vmpool.state.store`). A refusal is the normal answer of a race lost.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

from vmpool.config import PoolConfig
from vmpool.ids import Job
from vmpool.lifecycle.failures import requests_failed_noted
from vmpool.lifecycle.fleet import Fleet, dispatch_released, note_outcome
from vmpool.lifecycle.locking import run_locked
from vmpool.lifecycle.outcomes import (
    RequestCode,
    RequestStep,
    ReserveCode,
    StoreCode,
    in_state,
    store_code,
)
from vmpool.lifecycle.quotas import is_quota_refusal, limits_for, park, unpark_due
from vmpool.lifecycle.reserving import (
    MAX_NAME_ATTEMPTS,
    MadeAtOnce,
    configured_pool,
    reserve_fresh,
)
from vmpool.lifecycle.warm import claim_ready, pools_with_ready
from vmpool.state.locks import FencedLock
from vmpool.state.quotas import QuotaLimits
from vmpool.state.records import Outcome, RequestRecord
from vmpool.state.semaphore import SlotTerms
from vmpool.state.transitions import RequestStatus, VMState

__all__ = [
    "CloneGate",
    "check_request",
    "provision_request",
    "provision_sweep",
    "sweep_expired",
]

log = logging.getLogger(__name__)

# Refusals of reserve_vm that concern the whole request: stop reserving for it.
_REQUEST_LEVEL_REFUSALS = frozenset({"no_request", "stale_fence", "past_deadline"})

# ------------------------------------------------------------------------------------
# provision_request: reservations within the clone limit
# ------------------------------------------------------------------------------------


@dataclass
class CloneGate:
    """Keeps a provision claim first come, first served at the clone limit and the quotas.

    Shared by the provision steps of one claim, run in the order of service: once one
    met the clone limit, those after it reserve nothing (they still take ready VMs), so a
    slot freed meanwhile is not handed to a younger request before the older one (first
    come, first served). The older gets it at its next turn; the younger wait in the
    clone slots' line behind it, each at its place. The next claim starts with the gate
    open (slots may have come back, and the turns with them; the slots' line still
    serves in order). Likewise, once a request of
    a user met the user's quota, the user's later requests in the batch are parked
    without trying (``over_quota``): a VM the user frees meanwhile goes to the older."""

    closed: bool = False
    over_quota: set[str] = field(default_factory=set)
    # The reservations the claim made at once, by request (reserving.reserve_at_once)
    made: dict[str, MadeAtOnce] = field(default_factory=dict)


def provision_request(
    fleet: Fleet,
    request_id: str,
    lock: FencedLock | None = None,
    gate: CloneGate | None = None,
    ready: frozenset[str] | None = None,
) -> list[str]:
    """Reserve VMs for the request's unreserved slots.

    Each within the fleet-wide clone limit, and create_vm dispatched for it. Returns the
    names reserved by this call.

    Runs under the request's lock, whose grant reads the request's record in the same
    unit. Each reservation passes its fence, so a holder paused past its lock's expiry
    cannot over-reserve (the store refuses 'stale_fence', and 'slot_full' bounds the
    slot whatever the lock does). One clone slot is taken per VM before it is reserved
    and handed to create_vm, which gives it back. ``lock``: already granted that way by
    a batch job, which releases it. Else taken and released here. ``gate``: the batch
    job's :class:`CloneGate`. ``ready``: the lending pools a batch claim found holding a
    ready VM (:func:`~vmpool.lifecycle.warm.pools_with_ready`; None: ask each).

    A slot whose pool is no longer in the configuration is skipped with an error in the
    log: no VM exists yet, so there is nothing to fail. The request stays pending and its
    expiry fails it (with the usual TTL reason) unless the pool comes back meanwhile.
    """
    reserved: list[str] = []

    def step(held: FencedLock) -> None:
        _reserve_for(fleet, request_id, held, reserved, gate or CloneGate(), ready)

    run_locked(fleet, "request", request_id, "provision", step, lock=lock, read_record=True)
    return reserved  # what was reserved before a lock lost midway too


def _reserve_for(
    fleet: Fleet,
    request_id: str,
    lock: FencedLock,
    reserved: list[str],
    gate: CloneGate,
    ready: frozenset[str] | None,
) -> None:
    # The record as the grant read it. Its VM names are not needed here (not read).
    req = RequestRecord.from_hash(lock.record) if lock.record else None
    if req is None or req.status != RequestStatus.PENDING or req.unreserved <= 0:
        # Nothing left to reserve: out of the slot line, where a turn (or data of a fleet
        # whose join let a served request in) may still name it; its fulfil writes no
        # leave, its last reservation did.
        _leave_line(fleet, request_id)
        return
    limits = limits_for(fleet, req.token_user, (slot.pool for slot in req.slots))
    if req.token_user in gate.over_quota:  # an older request of the user met its quota
        park(fleet, request_id, limits)  # if it fits now, the older one goes first
        return
    for _ in range(2):  # a VM of the user freed while the request was being parked: again
        code, req = _claim_then_reserve(fleet, req, lock, reserved, gate, limits, ready)
        if not is_quota_refusal(code):
            return
        gate.over_quota.add(req.token_user)
        if park(fleet, request_id, limits):
            return


def _leave_line(fleet: Fleet, request_id: str) -> None:
    """Take the request out of the clone slots' line. If it stood there, hand its turn
    on at once: the requests whose turn it is then are dispatched (the sweeps pass by
    the requests in line until their turn, and would hand it on only at a tick)."""
    if fleet.slots.leave_line(request_id):
        turns = fleet.slots.turns()
        if turns:
            fleet.dispatch.send(Job.PROVISION_REQUEST, turns)


def _claim_then_reserve(
    fleet: Fleet,
    req: RequestRecord,
    lock: FencedLock,
    reserved: list[str],
    gate: CloneGate,
    limits: QuotaLimits,
    ready: frozenset[str] | None,
) -> tuple[str, RequestRecord]:
    """Ready VMs of warm pools first (``ready``: the lending pools known to hold one),
    then clones of the shortfall. The code that stopped it ('' when it went as far as it
    could) and the request as last read."""
    claimed, code = claim_ready(fleet, req, limits, ready)
    if is_quota_refusal(code):
        return code, req
    if claimed:
        fresh = fleet.store.get_request(req.id)
        if fresh is None or fresh.status != RequestStatus.PENDING or fresh.unreserved <= 0:
            return "", req
        req = fresh
    if gate.closed:  # an older request met the clone limit: wait in line behind it
        made = gate.made.get(req.id)
        if made is None or not made.placed:  # else its claim's reservation placed it
            fleet.slots.join_line(req.id, req.place)
        return "", req
    return _reserve_slots(fleet, req, lock, reserved, gate, limits), req


def _reserve_slots(
    fleet: Fleet,
    req: RequestRecord,
    lock: FencedLock,
    reserved: list[str],
    gate: CloneGate,
    limits: QuotaLimits,
) -> str:
    """Reserve the request's missing VMs, slot by slot. The code that stopped it, or ''."""
    request_id = req.id
    made = gate.made.get(request_id, MadeAtOnce())
    for slot in req.slots:
        missing = slot.want - slot.live
        if missing <= 0:
            continue
        pool = configured_pool(fleet, slot.pool)
        if pool is None:
            log.error(
                "request %s asks for pool %r, which is not configured (or has no provider);"
                " skipping the slot",
                request_id,
                slot.pool,
            )
            continue
        for _ in range(missing):
            first = made.take(slot.alias)
            code = _reserve_one(
                fleet, request_id, slot.alias, pool, lock, reserved, limits, req.place, first
            )
            if code == ReserveCode.CLONE_LIMIT:
                gate.closed = True
                return code
            if code in _REQUEST_LEVEL_REFUSALS or code.startswith("request_"):
                if code != "stale_fence":  # it will reserve no more: out of the slot line
                    _leave_line(fleet, request_id)
                return code
            if is_quota_refusal(code):
                return code
            if code != ReserveCode.RESERVED:
                break  # slot_full, no_such_slot, names exhausted: next slot
    return ""


def _reserve_one(
    fleet: Fleet,
    request_id: str,
    alias: str,
    pool: PoolConfig,
    lock: FencedLock,
    reserved: list[str],
    limits: QuotaLimits,
    place: float,
    first: tuple[str, Outcome] | None = None,
) -> ReserveCode | StoreCode:
    """Reserve one VM for the request's slot ``alias``.

    The VM is of ``pool``, within its user's quota ``limits``, its clone slot taken in the
    request's turn (its ``place`` in line). Its create is dispatched. Returns the code of
    :func:`~vmpool.lifecycle.reserving.reserve_fresh`. ``first``: the first try, made by
    the claim (:func:`~vmpool.lifecycle.reserving.reserve_at_once`)."""

    def reserve(name: str, slot: SlotTerms) -> Outcome:
        # No ensure_held() first: the fence refuses a stale holder inside the write.
        return fleet.store.reserve_vm(
            request_id,
            name=name,
            alias=alias,
            pool=pool.name,
            template=pool.template,
            provider=pool.provider,
            domain=pool.domain,
            actor=fleet.who("provision"),
            fence=lock.fence,
            quota=limits,
            slot=slot,
        )

    got = reserve_fresh(fleet, "reserve", reserve, place=place, made=first)
    if got.code == ReserveCode.RESERVED:
        reserved.append(got.name)
        fleet.dispatch.send(Job.CREATE_VM, [got.name])
    elif got.code == ReserveCode.CLONE_LIMIT:
        log.info("provision %s: clone limit reached, the rest waits", request_id)
    elif got.code == ReserveCode.NAMES_EXHAUSTED:
        log.warning("provision %s: %d hostnames in a row were taken", request_id, MAX_NAME_ATTEMPTS)
    return got.code


# ------------------------------------------------------------------------------------
# check_request and the sweeps
# ------------------------------------------------------------------------------------


def check_request(fleet: Fleet, request_id: str) -> RequestCode:
    """One request: expire it if its time is up, else push its work along.

    Returns the expiry outcome ('fulfilled' / 'failed'), 'pending' (work dispatched),
    'no_request' or 'request_<status>' for a request that is not pending.
    """
    req = fleet.store.get_request(request_id)
    if req is None:
        return RequestStep.NO_REQUEST
    if req.status != RequestStatus.PENDING:
        if req.status in (RequestStatus.FAILED, RequestStatus.DELETED):
            dispatch_released(fleet, request_id)
        return in_state("request", req.status)
    if fleet.store.server_time() >= req.fail_at:
        outcome = fleet.store.expire_request(request_id, actor=fleet.who("check_request"))
        note_outcome("expire", request_id, outcome)
        if outcome.ok:
            dispatch_released(fleet, request_id)
        return store_code(outcome)
    vms = fleet.store.get_vms(req.vm_names)
    pending = [vm.name for vm in vms if vm.state == VMState.PENDING]
    reserved = [vm.name for vm in vms if vm.state == VMState.RESERVED]
    if pending:
        fleet.dispatch.send(Job.CHECK_PENDING_VM, pending)
    if reserved:
        fleet.dispatch.send(Job.CREATE_VM, reserved)
    if req.unreserved > 0:
        fleet.dispatch.send(Job.PROVISION_REQUEST, [request_id])
    return RequestStep.PENDING


def sweep_expired(fleet: Fleet, limit: int = 1000) -> dict[str, int]:
    """Expire every request whose time (TTL + grace) is up. Count the outcomes.

    The candidates come from one score-range read of the open-request index
    (``store.due_for_expiry``), so the cost follows the number due, not the number open.
    Each candidate then gets its own ``expire_request`` script, deliberately not one
    script for the batch: each expiry is its own atomic unit with its own version bump
    and audit entry on its own request's keys (one ``{rid}`` hash tag per script, as a
    Redis Cluster would require). A long batch script would stall every other client
    for the whole batch. A script that fails halfway does not roll back either, so one bad
    record must not stop or half-apply the others. The script re-checks the deadline and
    readiness inside the unit: a request whose VMs are all attached is fulfilled, never
    failed.
    """
    counts: Counter[str] = Counter()
    actor = fleet.who("sweep")
    expired: list[str] = []
    for request_id in fleet.store.due_for_expiry(limit=limit):
        try:
            outcome = fleet.store.expire_request(request_id, actor=actor)
        except ResponseError as exc:  # one bad record must not stop the sweep
            log.error("expire %s: script error: %s", request_id, exc)
            counts["error"] += 1
            continue
        note_outcome("expire", request_id, outcome)
        counts[outcome.code] += 1
        if outcome.ok:
            expired.append(request_id)
        if outcome.code == "failed":  # out of time: listed with its reason (dashboard)
            requests_failed_noted(fleet, [request_id])
    # Every expiry first, then the destroys in one batch: a request late in a long due
    # list is not kept waiting behind the others' follow-up work (the settle bound).
    dispatch_released(fleet, *expired)
    return dict(counts)


def provision_sweep(fleet: Fleet) -> int:
    """Dispatch provision_request for the requests with unreserved slots (one batch).

    A request waiting in the clone slots' line is dispatched only in its turn, or while
    a pool lending its ready VMs to requests holds one (the sweep is how a waiting
    request takes a VM that turned ready): else its provision would take its lock only
    to find no slot free, and a burst past the fleet's capacity would cost a grant per
    waiting request per sweep. The turns are read here too (as the pending sweep does),
    so a turn lost at a slot's release is handed out again. A request waiting for its
    user's quota is passed by while the user has no room
    (:func:`~vmpool.lifecycle.quotas.unpark_due`)."""
    candidates = fleet.store.provision_candidates()
    if candidates and not pools_with_ready(fleet):
        waiting = fleet.slots.in_line(candidates)
        if waiting:
            turns = fleet.slots.turns()
            candidates = [rid for rid in candidates if rid not in waiting]
            candidates += [rid for rid in turns if rid not in candidates]
    candidates = unpark_due(fleet, candidates)
    if candidates:
        fleet.dispatch.send(Job.PROVISION_REQUEST, candidates)
    return len(candidates)

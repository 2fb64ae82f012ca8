"""The three batched stages of a VM's way to ready, and their batch jobs.

A provision claim reserves VMs for requests, a create claim creates them, a check claim
finds them booted. Each stage is a per-subject step (:mod:`vmpool.lifecycle.requests`,
:mod:`vmpool.lifecycle.vms`) run a claim at a time by :mod:`vmpool.lifecycle.batch`,
under its subject's lock, with what its claim does for all its subjects at once. Each
batch job runs its own stage, and the others in line when they have been quick
(:func:`~vmpool.lifecycle.batch.run_stages`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final

from redis.client import Pipeline

from vmpool.ids import Job
from vmpool.lifecycle.batch import Stage, Stages, run_stages
from vmpool.lifecycle.chain import Prepared, Reading
from vmpool.lifecycle.creating import create_at_once
from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.ready import ready_now, record_ready_all
from vmpool.lifecycle.requests import CloneGate, provision_request
from vmpool.lifecycle.reserving import reserve_at_once
from vmpool.lifecycle.vms import check_pending_vm, create_vm
from vmpool.lifecycle.warm import ReadyRead
from vmpool.providers import ProviderVM, StatusBatch
from vmpool.state.durability import write_mark
from vmpool.state.locks import FencedLock, LockKind, all_owned, check_call
from vmpool.state.lua import run_pipelined
from vmpool.state.transitions import VMState

__all__ = ["LOCKED_STEPS", "STAGES", "check_pending_batch", "create_vm_batch", "provision_batch"]

log = logging.getLogger(__name__)

# The lock each batched step runs under: the kind of its subject and the step's name
# (the holder id says which step holds it).
LOCKED_STEPS: Final[Mapping[Job, tuple[LockKind, str]]] = MappingProxyType(
    {
        Job.PROVISION_REQUEST: ("request", "provision"),
        Job.CREATE_VM: ("vm", "create"),
        Job.CHECK_PENDING_VM: ("vm", "check_pending"),
    }
)


def provision_batch(fleet: Fleet) -> dict[str, int]:
    """Run provision_request for every request in its work set.

    provision_request for every request in its work set, in the order of service. Once
    one meets the clone limit, the rest of its claim only take ready VMs
    (:class:`~vmpool.lifecycle.requests.CloneGate`). A claim reads once which pools have
    ready VMs to lend: a request whose pools have none runs no claim script."""
    return run_stages(fleet, Job.PROVISION_REQUEST, STAGES)


def _provision_stage() -> Stage:
    """A provision claim's step: a fresh gate (:class:`CloneGate`) for the claim, and its
    read of the pools with ready VMs made with its locks' grant (:class:`ReadyRead`)."""
    gate = CloneGate()
    step = partial(provision_request, gate=gate)
    job = Job.PROVISION_REQUEST
    prepare = Reading(_read_ready, partial(_reserve_for_claim, gate=gate))
    return (job, step, LOCKED_STEPS[job], prepare)


def _read_ready(fleet: Fleet, pipe: Pipeline) -> None:
    ReadyRead(fleet).queue(pipe)


def _reserve_for_claim(
    fleet: Fleet, locks: list[FencedLock], replies: list[Any], gate: CloneGate
) -> Prepared:
    """A provision claim's one read of the pools with ready VMs to lend (``replies``, made
    in its locks' round trip), for each request.

    When none has one to lend, the VMs the claim's requests miss are reserved in one
    round trip (:func:`~vmpool.lifecycle.reserving.reserve_at_once`), their outcomes on
    the claim's ``gate`` for each request's step to take."""
    ready = ReadyRead(fleet).found(replies)
    if not ready:
        gate.made = reserve_at_once(fleet, locks)
    return Prepared({lock.subject: {"ready": ready} for lock in locks})


def create_vm_batch(fleet: Fleet) -> dict[str, int]:
    """create_vm for every reserved VM in its work set."""
    return run_stages(fleet, Job.CREATE_VM, STAGES)


def _create_stage() -> Stage:
    return (Job.CREATE_VM, create_vm, LOCKED_STEPS[Job.CREATE_VM], _take_slots)


def _take_slots(fleet: Fleet, locks: list[FencedLock]) -> Prepared:
    """Take a create claim's clone slots in one script; the VMs a provider makes at once,
    made (:func:`~vmpool.lifecycle.creating.create_at_once`).

    A create claim's clone slots in one script: for each VM still reserved (as read
    under its lock), its lease renewed or a free slot taken, as ``create_vm`` would do
    alone. Each ``create_vm`` is told whether it holds one (and gives it back, as ever).
    A slot taken for a VM the claim does not reach before its time is over is its own:
    its next create uses it, and a lease nobody renews ends by itself. In the same round
    trip, the locks of those VMs are checked (as ``held_all`` would before the provider's
    call) and the job's writes so far confirmed (``settled``). Each lock is given the
    job's write mark once the claim's locks and slots are taken
    (``FencedLock.decided``): what its create must see confirmed before its provider
    call (one wait for the claim, not one per create: :func:`~vmpool.state.durability.settle`)."""
    reserved = [lk for lk in locks if lk.record.get("state") == VMState.RESERVED]
    held = [(lk.subject, lk.fence) for lk in reserved]
    slots: dict[str, bool] = {}
    checked = False
    if held:  # the slots taken, the locks checked, the writes so far confirmed: one trip
        check = check_call(reserved)
        calls = [fleet.slots.acquire_all_call(held), *([check] if check else [])]
        replies = run_pipelined(fleet.redis, calls, settled=True)
        slots = fleet.slots.granted(held, replies[0])
        checked = check is not None and all_owned(reserved, replies[1])
    decided = write_mark()  # each create rests on the writes so far, not on those after
    for lock in locks:
        lock.decided = decided
    made = create_at_once(fleet, locks, slots, checked=checked)
    extra = {name: {"slot": ok, "made": made.get(name)} for name, ok in slots.items()}
    return Prepared(extra, done=frozenset(made))  # made at once: their steps go on from it


def check_pending_batch(fleet: Fleet) -> dict[str, int]:
    """check_pending_vm for every booting VM in its work set.

    A claim asks each provider that answers for many at once about all its VMs in one
    call (:func:`_ask_at_once`), not one call per VM."""
    return run_stages(fleet, Job.CHECK_PENDING_VM, STAGES)


def _check_stage() -> Stage:
    job = Job.CHECK_PENDING_VM
    return (job, check_pending_vm, LOCKED_STEPS[job], _ask_at_once)


def _ask_at_once(fleet: Fleet, locks: list[FencedLock]) -> Prepared:
    """A check claim's one status call per batching provider, for its pending VMs.

    Asked after the locks were granted, as each VM's own check would ask. A provider
    that fails to answer is left out: its VMs ask alone (and count its error). The VMs
    of requests it says booted are recorded ready here, in one store call for the claim
    (:func:`~vmpool.lifecycle.ready.record_ready_all`), under the locks held: each
    one's check then returns its code (``readied``)."""
    names: dict[str, list[str]] = {}
    for lock in locks:
        record = lock.record
        if record.get("state") == VMState.PENDING:
            names.setdefault(record.get("provider", ""), []).append(lock.subject)
    seen: dict[str, Mapping[str, ProviderVM | None]] = {}
    for provider_name, vms in names.items():
        provider = fleet.providers.get(provider_name)
        if isinstance(provider, StatusBatch):
            try:
                seen[provider_name] = provider.statuses(vms)
            except Exception as exc:  # each VM asks alone, as it would have
                log.warning("check_pending: %s did not answer: %s", provider_name, exc)
    if not seen:
        return Prepared({})
    booted = [
        ready
        for lock in locks
        for provider_name in [lock.record.get("provider", "")]
        if provider_name in seen
        and (ready := ready_now(lock, provider_name, seen[provider_name].get(lock.subject)))
    ]
    readied = record_ready_all(fleet, booted)
    extra = {lock.subject: {"seen": seen, "readied": readied.get(lock.subject)} for lock in locks}
    return Prepared(extra, done=frozenset(readied))  # recorded ready: their steps go on


# How to run each stage (a per-subject job of BATCHED): a fresh step, lock and
# preparation for each claim.
STAGES: Final[Stages] = MappingProxyType(
    {
        Job.PROVISION_REQUEST: _provision_stage,
        Job.CREATE_VM: _create_stage,
        Job.CHECK_PENDING_VM: _check_stage,
    }
)

"""A create claim's creates made at once, at a provider that makes many VMs in one call.

A create claim runs ``create_vm`` for each of its VMs, one after the other: for each, a
check of its lock, the provider's create, and ``vm_created``, three round trips apart.
The claim's VMs hold their clone slots all that while, and at the clone limit the next
requests in line wait for them (docs/benchmarks.md, "End to end"). At a provider that
makes many VMs in one call (:class:`~vmpool.providers.CreateBatch`), the claim checks
its locks once, asks the provider once, and records every create in one round trip,
each by its own checked ``vm_created`` (a creator paused past its lock is refused by
the fence, as ever). Each VM's ``create_vm`` then takes it from there: a failure
recorded, the VM's check dispatched, a VM nobody needs destroyed (:class:`Made`).

Only a VM whose create needs nothing of its own first is made so: still reserved as
read under its lock, holding its clone slot, at a provider with no circuit breaker and
no limits of its own (those are decided VM by VM). The others create alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import redis

from vmpool.lifecycle.cloudsteps import limited
from vmpool.lifecycle.failpoints import failpoint
from vmpool.lifecycle.fleet import Fleet
from vmpool.providers import CreateBatch, CreateOrder, ProviderVM, uses_circuit
from vmpool.state.locks import FencedLock, held_all
from vmpool.state.records import Outcome, VMRecord
from vmpool.state.transitions import VMState

__all__ = ["Made", "create_at_once"]


@dataclass(frozen=True)
class Made:
    """A VM of a create claim made with the others (:func:`create_at_once`): the
    provider's answer (its error in place), and ``vm_created``'s outcome once it was made
    (the error of its round trip in place; None when the provider failed)."""

    answer: ProviderVM | Exception
    created: Outcome | Exception | None = None


def create_at_once(
    fleet: Fleet, locks: Sequence[FencedLock], slots: Mapping[str, bool], *, checked: bool = False
) -> dict[str, Made]:
    """The creates of a claim's VMs that a provider makes at once, by VM name.

    ``locks``: the claim's granted locks, each with its VM's record; ``slots``: whether
    each holds its clone slot. One group per provider. ``checked``: the locks of every
    reserved VM were found ours and the claim's writes confirmed, in the round trip that
    took the slots (each group's :func:`~vmpool.state.locks.held_all` is then not asked
    again)."""
    groups: dict[str, list[tuple[FencedLock, VMRecord]]] = {}
    makers: dict[str, CreateBatch | None] = {}  # by provider name, asked once a claim
    for lock in locks:
        vm = VMRecord.from_hash(lock.record) if lock.record else None
        if vm is None or vm.state != VMState.RESERVED or not slots.get(lock.subject):
            continue
        if vm.provider not in makers:
            makers[vm.provider] = _maker(fleet, vm.provider)
        if makers[vm.provider] is not None:
            groups.setdefault(vm.provider, []).append((lock, vm))
    made: dict[str, Made] = {}
    for name, group in groups.items():
        maker = makers[name]
        assert maker is not None
        made.update(_made_by(fleet, maker, group, checked))
    return made


def _maker(fleet: Fleet, name: str) -> CreateBatch | None:
    """Provider ``name`` when it makes many VMs at once and decides nothing VM by VM (a
    circuit breaker, limits of its own: such a provider's VMs create alone)."""
    provider = fleet.providers.get(name)
    if provider is None or uses_circuit(provider) or limited(provider):
        return None
    return provider if isinstance(provider, CreateBatch) else None


def _made_by(
    fleet: Fleet, provider: CreateBatch, group: list[tuple[FencedLock, VMRecord]], checked: bool
) -> dict[str, Made]:
    """One provider's VMs of the claim: made in one call, recorded in one round trip.

    Nothing when a lock is not ours any more: each VM then creates alone, checking its
    own lock first."""
    if not (checked or held_all([lock for lock, _ in group])):  # and the writes confirmed
        return {}
    orders = [CreateOrder(vm.pool, vm.template, vm.name, vm.request_id) for _, vm in group]
    with ExitStack() as leases:  # each slot held as long as the call runs
        for lock, vm in group:
            leases.enter_context(fleet.slots.renewing(vm.name, lock.fence))
        try:
            answers = provider.create_vms(orders)
        except Exception as exc:  # the call as a whole: each VM's create failed with it
            answers = [exc] * len(orders)
    made = {vm.name: Made(answer) for (_, vm), answer in zip(group, answers, strict=True)}
    done = [(lock, vm) for lock, vm in group if not isinstance(made[vm.name].answer, Exception)]
    for _ in done:
        failpoint("create_vm.after_provider")
    for _ in done:
        failpoint("create_vm.before_commit")  # a pause here is what the fence is for
    created: Sequence[Outcome | Exception]
    try:
        created = fleet.store.vm_created_all(
            [(vm.name, lock.fence, vm.request_id) for lock, vm in done],
            actor=fleet.who("create"),
            slot_limit=fleet.slots.limit,
        )
    except redis.RedisError as exc:  # each VM's create raises it, as alone
        created = [exc] * len(done)
    for (_, vm), outcome in zip(done, created, strict=True):
        made[vm.name] = Made(made[vm.name].answer, outcome)
    return made

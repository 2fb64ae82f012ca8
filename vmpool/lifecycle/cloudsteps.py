"""The create path's dealings with a cloud provider.

Its circuit breaker and its quota hold (:mod:`vmpool.state.circuit`, shared through
Redis).

Only providers that declare ``circuit_breaker`` (the real clouds) count toward or are
held back by a breaker. The simulated cloud's failures are the chaos tests' input.

Quota is a third kind of failure, neither transient nor permanent: when the cloud
refuses a create for quota or capacity (:class:`~vmpool.providers.QuotaExceededError`)
the VM stays reserved (no retry spent), its request learns why, and the provider's
creates wait ``provider_quota_wait`` before asking again. The pending sweep dispatches
the waiting creates once the wait is over, and the request is served when capacity
frees, within its TTL. A provider's own ``max_instances`` / ``max_cores`` are counted
from the fleet's VMs before its cloud is asked (:mod:`vmpool.state.capacity`): a VM
that does not fit waits the same way, until one of the provider's VMs is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from vmpool.lifecycle.failures import create_failed_noted
from vmpool.lifecycle.fleet import Fleet, after_vm_failed, note_outcome
from vmpool.lifecycle.outcomes import StoreCode, VMStep, store_code
from vmpool.providers import (
    Capacity,
    Provider,
    QuotaExceededError,
    is_permanent_error,
    uses_circuit,
)
from vmpool.state.capacity import Limits
from vmpool.state.circuit import HoldReason
from vmpool.state.locks import FencedLock
from vmpool.state.records import VMRecord

__all__ = [
    "admit",
    "circuit_closed",
    "count_failure",
    "create_failed",
    "creates_due",
    "held_back",
    "let_go",
    "limited",
    "quota_wait",
]

log = logging.getLogger(__name__)


def held_back(fleet: Fleet, provider: Provider, vm: VMRecord) -> HoldReason:
    """Why the VM's create must wait now, '' when it may go.

    The reasons to wait are 'circuit_open' (the provider's breaker is open) and 'quota'
    (its cloud answered quota a moment ago). Deciding takes one read. A VM held back
    stays reserved (the sweep dispatches it again once the hold is over) and its creator
    gives its clone slot back."""
    if not uses_circuit(provider):
        return ""
    reason = fleet.circuit.held_back(vm.provider)
    if reason:
        log.info("create %s: provider %s held back (%s), waiting", vm.name, vm.provider, reason)
    return reason


def creates_due(fleet: Fleet, by_pool: Mapping[str, Sequence[str]]) -> list[str]:
    """The stale reservations to create again now.

    The stale reservations (by pool) to create again, less those of pools whose provider
    holds its creates back now (circuit open, quota: they would only answer so) or is at
    its own limits. The first costs one read for all providers, the second one count each."""
    providers = {p: c.provider for p, c in fleet.config.pools.items() if by_pool.get(p)}
    clouds = [n for n in set(providers.values()) if uses_circuit(fleet.providers.get(n))]
    held = {s.provider for s in fleet.circuit.states(clouds) if s.held_back} if clouds else set()
    held |= {n for n in set(providers.values()) - held if not _fits(fleet, n)}
    return [n for p, names in by_pool.items() if providers.get(p) not in held for n in names]


def limits_of(fleet: Fleet, provider_name: str) -> Limits | None:
    """The provider's limits and the cores of its pools' VMs, None when it has none."""
    provider = fleet.providers.get(provider_name)
    if not isinstance(provider, Capacity):
        return None
    max_instances, max_cores = provider.limits()
    if not (max_instances or max_cores):
        return None
    pools = [p for p, c in fleet.config.pools.items() if c.provider == provider_name]
    cores = {p: provider.cores(p) if max_cores else 1 for p in pools}
    return Limits(max_instances, max_cores, cores)


def _fits(fleet: Fleet, provider_name: str) -> bool:
    try:
        limits = limits_of(fleet, provider_name)
    except Exception as exc:  # its cloud could not say how many cores: ask next sweep
        log.warning("provider %s: cannot count its cores: %s", provider_name, exc)
        return False
    return limits is None or fleet.capacity.fits(provider_name, limits)


def admit(
    fleet: Fleet, provider: Provider, vm: VMRecord, lock: FencedLock
) -> VMStep | StoreCode | None:
    """Claim the VM's place within its provider's limits.

    Returns None when it may be created (or the provider has none). 'quota' when it
    must wait (noted on the VM and its request), 'provider_error' when the cores could
    not be counted (it waits too), or the store's refusal of the note."""
    try:
        limits = limits_of(fleet, vm.provider)
    except Exception as exc:
        log.warning("create %s: cannot count provider %s's cores: %s", vm.name, vm.provider, exc)
        return VMStep.PROVIDER_ERROR
    if limits is None:
        return None
    ok, instances, cores = fleet.capacity.admit(vm.provider, vm.pool, vm.name, limits)
    if ok:
        return None
    reason = (
        f"waiting for capacity at provider {vm.provider}: its VMs are at its limits"
        f" ({instances} of max_instances {limits.max_instances or '-'},"
        f" {cores} cores of max_cores {limits.max_cores or '-'})"
    )
    log.info("create %s: %s", vm.name, reason)
    noted = fleet.store.vm_waiting(
        vm.name, reason, actor=fleet.who("create"), fence=lock.fence, request_id=vm.request_id
    )
    return VMStep.QUOTA if noted.ok else store_code(noted)


def limited(provider: Provider) -> bool:
    """Whether the provider has limits of its own (max_instances, max_cores)."""
    return isinstance(provider, Capacity) and any(provider.limits())


def let_go(fleet: Fleet, provider: Provider, vm: VMRecord) -> None:
    """Give back the create's claim within the provider's limits.

    The create is over: its claim within the provider's limits is given back (the VM, if
    made, is counted by its pool's index from now on)."""
    if limited(provider):
        fleet.capacity.release(vm.provider, vm.pool, vm.name)


def create_failed(
    fleet: Fleet, provider: Provider, vm: VMRecord, lock: FencedLock, exc: Exception
) -> VMStep | StoreCode:
    """Record a failed create and count it toward the provider's breaker.

    Record a failed create (vm_failed, permanent when retrying cannot help, with the
    cloud's message in the reason) and count it toward the provider's breaker and its
    pool's streak (vmpool.lifecycle.failures). A quota answer is no failure: the VM waits
    (:func:`quota_wait`)."""
    if isinstance(exc, QuotaExceededError):
        return quota_wait(fleet, vm, lock, exc)
    permanent = is_permanent_error(exc)
    log.info("create %s failed (permanent=%s): %s", vm.name, permanent, exc)
    reason = f"create failed: {exc}" + count_failure(fleet, provider, vm, exc, permanent)
    failed = fleet.store.vm_failed(
        vm.name, reason, actor=fleet.who("create"), permanent=permanent, fence=lock.fence
    )
    note_outcome("vm_failed", vm.name, failed)
    if failed.ok:  # once per failed VM, whoever else reports it
        create_failed_noted(fleet, vm, reason, permanent=permanent)
    after_vm_failed(fleet, vm, failed)
    if failed.ok and failed.code == "completed":
        return VMStep.FAILED
    return store_code(failed)


def quota_wait(
    fleet: Fleet, vm: VMRecord, lock: FencedLock, exc: QuotaExceededError
) -> VMStep | StoreCode:
    """Hold a VM the cloud refused for quota: it waits reserved.

    The cloud said quota: the VM stays reserved, no retry spent. Its request learns why
    (the last cause its failure by TTL reports) and the provider's creates wait."""
    wait_s = fleet.config.provider_quota_wait_s
    fleet.circuit.hold_for_quota(vm.provider, str(exc), wait_s)
    reason = f"waiting for capacity at provider {vm.provider}: {exc}"
    log.warning("create %s: %s; its creates wait %gs", vm.name, reason, wait_s)
    noted = fleet.store.vm_waiting(
        vm.name, reason, actor=fleet.who("create"), fence=lock.fence, request_id=vm.request_id
    )
    return VMStep.QUOTA if noted.ok else store_code(noted)


def count_failure(
    fleet: Fleet, provider: Provider, vm: VMRecord, exc: Exception, permanent: bool
) -> str:
    """Count a transient create failure toward the provider's breaker.

    Count a transient create failure toward the provider's circuit breaker (a permanent
    one is the request's mistake, not the cloud's health). The words the VM's trail gets
    when this failure opened the circuit."""
    if permanent or not uses_circuit(provider):
        return ""
    if not fleet.circuit.failure(vm.provider, str(exc)):
        return ""
    log.warning(
        "provider %s: circuit open after %d consecutive failed creates; its pools stop"
        " creating for %gs",
        vm.provider,
        fleet.circuit.threshold,
        fleet.circuit.cooldown_s,
    )
    return f" (provider {vm.provider} circuit open for {fleet.circuit.cooldown_s:g}s)"


def circuit_closed(fleet: Fleet, provider: Provider, vm: VMRecord) -> None:
    """A create went through: the provider's breaker closes and its count restarts."""
    if uses_circuit(provider):
        fleet.circuit.success(vm.provider)

"""The create path's dealings with a cloud provider: its circuit breaker and its quota
hold (:mod:`vmpool.state.circuit`, shared through Redis).

Only providers that declare ``circuit_breaker`` (the real clouds) count toward or are
held back by a breaker; the simulated cloud's failures are the chaos tests' input.

Quota is a third kind of failure, neither transient nor permanent: when the cloud
refuses a create for quota or capacity (:class:`~vmpool.providers.QuotaExceededError`)
the VM stays reserved (no retry spent), its request learns why, and the provider's
creates wait ``provider_quota_wait`` before asking again; the pending sweep dispatches
the waiting creates once the wait is over, and the request is served when capacity
frees, within its TTL.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from vmpool.lifecycle.fleet import Fleet
from vmpool.providers import Provider, QuotaExceededError, uses_circuit
from vmpool.state.circuit import HoldReason
from vmpool.state.locks import FencedLock
from vmpool.state.records import VMRecord

__all__ = [
    "circuit_closed",
    "count_failure",
    "creates_due",
    "held_back",
    "quota_wait",
]

log = logging.getLogger(__name__)


def held_back(fleet: Fleet, provider: Provider, vm: VMRecord) -> HoldReason:
    """Why the VM's create must wait ('circuit_open': the provider's breaker is open;
    'quota': its cloud answered quota a moment ago), '' when it may go (one read). A
    VM held back gives its clone slot back and stays reserved (the sweep dispatches
    it again)."""
    if not uses_circuit(provider):
        return ""
    reason = fleet.circuit.held_back(vm.provider)
    if reason:
        log.info("create %s: provider %s held back (%s), waiting", vm.name, vm.provider, reason)
        fleet.slots.release(vm.name)
    return reason


def creates_due(fleet: Fleet, by_pool: Mapping[str, Sequence[str]]) -> list[str]:
    """The stale reservations (by pool) to create again, less those of pools whose
    provider holds its creates back now (circuit open, quota: they would only answer
    so), found in one read for all providers."""
    providers = {p: c.provider for p, c in fleet.config.pools.items() if by_pool.get(p)}
    clouds = [n for n in set(providers.values()) if uses_circuit(fleet.providers.get(n))]
    held = {s.provider for s in fleet.circuit.states(clouds) if s.held_back} if clouds else set()
    return [n for p, names in by_pool.items() if providers.get(p) not in held for n in names]


def quota_wait(fleet: Fleet, vm: VMRecord, lock: FencedLock, exc: QuotaExceededError) -> str:
    """The cloud said quota: the VM stays reserved, no retry spent; its request learns
    why (the last cause its failure by TTL reports) and the provider's creates wait."""
    wait_s = fleet.config.provider_quota_wait_s
    fleet.circuit.hold_for_quota(vm.provider, str(exc), wait_s)
    reason = f"waiting for capacity at provider {vm.provider}: {exc}"
    log.warning("create %s: %s; its creates wait %gs", vm.name, reason, wait_s)
    noted = fleet.store.vm_waiting(
        vm.name, reason, actor=fleet.who("create"), fence=lock.fence, request_id=vm.request_id
    )
    return "quota" if noted.ok else noted.code


def count_failure(
    fleet: Fleet, provider: Provider, vm: VMRecord, exc: Exception, permanent: bool
) -> str:
    """Count a transient create failure toward the provider's circuit breaker (a
    permanent one is the request's mistake, not the cloud's health); the words the
    VM's trail gets when this failure opened the circuit."""
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

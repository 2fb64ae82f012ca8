"""The create path's dealings with a cloud provider: its circuit breaker
(:mod:`vmpool.state.circuit`, shared through Redis) and the pool's instance size.

Only providers that declare ``circuit_breaker`` (the real clouds) count toward or are
held back by a breaker; the simulated cloud's failures are the chaos tests' input.
"""

from __future__ import annotations

import logging

from vmpool.lifecycle.fleet import Fleet
from vmpool.providers import Provider, uses_circuit
from vmpool.state.records import VMRecord

__all__ = ["circuit_closed", "circuit_open", "count_failure", "size_hint"]

log = logging.getLogger(__name__)


def size_hint(fleet: Fleet, vm: VMRecord) -> str | None:
    """The pool's instance size (amisize, machine_type, flavor), None for the provider's."""
    pool = fleet.config.pools.get(vm.pool)
    return pool.size_hint if pool is not None else None


def circuit_open(fleet: Fleet, provider: Provider, vm: VMRecord) -> bool:
    """Whether the provider's circuit breaker holds creates back; if so the VM stays
    reserved (the sweep dispatches it again) and its creator gives its clone slot back."""
    if not uses_circuit(provider) or not fleet.circuit.is_open(vm.provider):
        return False
    log.info("create %s: provider %s circuit open, waiting", vm.name, vm.provider)
    return True


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

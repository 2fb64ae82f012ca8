"""What vmpool asks of a cloud, and how it tells a failure worth retrying from one that is not.

Workers call a provider outside Redis (docs/architecture.md),
so everything here is about the provider's own contract:

- ``create_vm`` is idempotent by name: a worker killed mid-create, or a job RQ runs twice,
  calls it again with the same name and must get the same VM back, never a second one.
- ``destroy_vm`` answers whether it destroyed something, and destroying twice is fine, so
  the destroy job and the reconciler may both run.
- ``inventory`` lists every VM the provider holds, so the reconciler can find VMs nobody
  recorded (leaks) and records whose VM vanished.
- A failure says whether retrying can help (:func:`is_permanent_error`), ported from
  vmpooler's ``permanent_error?``, so the worker fails a request at once on a missing
  template rather than burning every retry.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Protocol, runtime_checkable

from vmpool.ids import InvalidIdentifier, validate_pool_name

__all__ = [
    "Capacity",
    "CreateBatch",
    "CreateOrder",
    "Disks",
    "InstantCreates",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "ProviderVM",
    "ProviderVMState",
    "QuotaExceededError",
    "Snapshots",
    "StatusBatch",
    "TransientProviderError",
    "create_for_request",
    "is_permanent_error",
    "uses_circuit",
    "validate_provider_name",
]


class ProviderError(Exception):
    """A provider call failed. ``permanent`` says retrying the same call cannot help."""

    permanent: bool = False

    def __init__(self, message: str, *, permanent: bool | None = None) -> None:
        super().__init__(message)
        if permanent is not None:
            self.permanent = permanent


class PermanentProviderError(ProviderError):
    """Retrying cannot help: template not found, bad provider configuration, ..."""

    permanent = True


class TransientProviderError(ProviderError):
    """The cloud hiccupped (API timeout, capacity, a flaky create). A retry may succeed."""

    permanent = False


class QuotaExceededError(TransientProviderError):
    """The cloud refused for want of quota or capacity (instance, vCPU or core limits).

    Neither a failure of the VM nor of the request: the VM waits reserved until
    capacity frees, within its request's TTL, and no retry is spent on it."""


# vmpooler's permanent_error? patterns, verbatim in meaning: messages a cloud SDK gives
# when the request itself is wrong, whatever exception class carries them.
_PERMANENT_MESSAGE_PATTERNS = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"template.*not found",
        r"invalid.*path",
        r"permission.*denied",
        r"authentication.*failed",
        r"configuration.*error",
    )
)

# Ruby's ArgumentError / NoMethodError / NameError are programming or configuration
# mistakes, never a cloud's mood. These are their Python analogues.
_PERMANENT_EXCEPTION_TYPES: tuple[type[BaseException], ...] = (
    TypeError,
    AttributeError,
    NameError,
    ValueError,
)


def is_permanent_error(exc: BaseException) -> bool:
    """True when retrying the failed provider call cannot help (vmpooler's ``permanent_error?``).

    An explicit :class:`ProviderError` verdict wins over the message: a provider that says
    "transient" knows better than a regex. Anything else is judged by its message and type.
    """
    if isinstance(exc, ProviderError):
        if exc.permanent:
            return True
        # A transient ProviderError may still carry a message that gives it away (a
        # wrapped SDK error). The message of every error is checked, as vmpooler does.
        return _message_is_permanent(str(exc))
    if _message_is_permanent(str(exc)):
        return True
    return isinstance(exc, _PERMANENT_EXCEPTION_TYPES)


def _message_is_permanent(message: str) -> bool:
    return any(pattern.search(message) for pattern in _PERMANENT_MESSAGE_PATTERNS)


def validate_provider_name(name: str) -> str:
    """Reject a provider name that could not safely be part of a Redis key.

    A provider's name becomes part of Redis keys (the simulated provider's inventory), so
    it is held to the pool names' alphabet: nothing that could split or glob a key.
    """
    try:
        return validate_pool_name(name)
    except InvalidIdentifier:
        raise PermanentProviderError(
            f"configuration error: invalid provider name {name!r}"
            " (1-128 letters, digits, '-', '_' or '.')"
        ) from None


class ProviderVMState(StrEnum):
    """A VM's state as its cloud reports it (:attr:`ProviderVM.state`)."""

    BOOTING = "booting"  # until the VM answers
    RUNNING = "running"  # booted and past the pool's ready check
    FAILED = "failed"  # the cloud says it never will (an instance in ERROR, ...)


@dataclass(frozen=True)
class ProviderVM:
    """A VM as the cloud sees it, a snapshot taken when the provider was asked.

    ``hostname`` is the bare name: the caller adds a domain. ``state``: see
    :class:`ProviderVMState`. When ``failed``, the cloud's words are in ``error``.
    ``address``: the address the cloud reported ('' if none). ``owned``: False for a VM
    listed under a mark the fleet only recognises (vmpool/state/fleet_identity.py): it is
    the fleet's only if a record holds it, and never destroyed as a leak.
    """

    name: str
    pool: str
    template: str
    state: ProviderVMState
    created_at: float
    hostname: str
    address: str = ""
    error: str = ""
    owned: bool = True


@runtime_checkable
class Provider(Protocol):
    """The calls vmpool makes on a cloud, and the capabilities it declares.

    Structural, so tests may pass any fake that delegates to a real provider.

    Every provider declares two flags:

    - ``tags_request_id``: ``create_vm`` tags the VM with ``request_id`` at launch.
      A provider without it is called with the first three arguments only.
    - ``circuit_breaker``: its failed creates count toward its circuit breaker. The real
      clouds declare it, not the simulated cloud, whose failures are the chaos tests'
      input.

    The optional calls are protocols of their own, which a provider declares by
    subclassing them: :class:`StatusBatch`, :class:`CreateBatch`,
    :class:`InstantCreates`, :class:`Snapshots`, :class:`Disks` and :class:`Capacity`.
    """

    name: str
    tags_request_id: ClassVar[bool]
    circuit_breaker: ClassVar[bool]

    def create_vm(self, pool: str, template: str, name: str, request_id: str = "") -> ProviderVM:
        """Create VM ``name``. If it already exists, return it instead of making another.

        ``request_id``: the request the VM is for, used only when ``tags_request_id``."""
        ...

    def is_ready(self, pool: str, name: str) -> bool:
        """True once the VM has booted and would accept a connection."""
        ...

    def destroy_vm(self, pool: str, name: str) -> bool:
        """Destroy the VM. True if it destroyed one, False if there was no such VM."""
        ...

    def get_vm(self, pool: str, name: str) -> ProviderVM | None:
        """The VM as the cloud sees it now, or None if it holds no such VM."""
        ...

    def inventory(self) -> list[ProviderVM]:
        """Every VM this provider instance holds, all pools."""
        ...


@runtime_checkable
class StatusBatch(Protocol):
    """A provider that answers for many VMs with one cloud call (the cloud providers).

    The pending sweep asks it once per provider per tick instead of dispatching one
    check per VM. A provider without it is checked VM by VM."""

    # A cloud's list may lag its create (EC2's DescribeInstances is eventually
    # consistent): a VM created less than this long ago and missing from a list is
    # booting, not vanished. A provider whose list is exact says 0.
    list_lag_s: ClassVar[float] = 30.0

    def statuses(self, names: Collection[str]) -> Mapping[str, ProviderVM | None]:
        """Each of ``names`` as the cloud sees it now, None for a VM the cloud does not hold.

        ``state`` is 'running' once the VM passes the ready check."""
        ...


@dataclass(frozen=True)
class CreateOrder:
    """One VM of a :class:`CreateBatch` call: what ``create_vm`` is told of it."""

    pool: str
    template: str
    name: str
    request_id: str = ""


@runtime_checkable
class CreateBatch(Protocol):
    """A provider that creates many VMs with one call (the simulated cloud: one round trip).

    A create claim hands it all its VMs at once instead of one ``create_vm`` each. Each
    VM is made as ``create_vm`` makes it, idempotent by name, and fails alone."""

    def create_vms(self, orders: Sequence[CreateOrder]) -> list[ProviderVM | Exception]:
        """Each order's VM (made, or found made), or the error ``create_vm`` would have
        raised for it, in the orders' order."""
        ...


@runtime_checkable
class InstantCreates(Protocol):
    """A provider whose creates may answer at once, with no cloud to wait for (the
    simulated cloud, given no create latency).

    A fleet whose providers all say so runs its creates in line from its first claim
    (:func:`vmpool.lifecycle.pace.quick_unseen`); otherwise a worker learns their pace
    from a first claim of one VM, since a clone may block for minutes."""

    def creates_at_once(self) -> bool:
        """Whether every ``create_vm`` answers without waiting on a cloud."""
        ...


@runtime_checkable
class Snapshots(Protocol):
    """A provider that snapshots a VM and reverts it (vmpooler's snapshot tasks).

    The API names each snapshot (vmpooler's 32-character id) before any provider call,
    so both calls are idempotent by that name: a job run twice takes one snapshot."""

    def create_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        """Take the snapshot ``snapshot`` of VM ``name``. Nothing if it already exists."""
        ...

    def revert_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        """Revert VM ``name`` to ``snapshot``. PermanentProviderError when it has none."""
        ...


@runtime_checkable
class Disks(Protocol):
    """A provider that attaches extra disks to a VM (vmpooler's disk tasks)."""

    def add_disk(self, pool: str, name: str, size_gb: int, disk: str) -> None:
        """Attach a new disk of ``size_gb`` GB to VM ``name``, labelled ``disk``.

        Idempotent by ``disk``: a second call with the same label adds nothing."""
        ...


@runtime_checkable
class Capacity(Protocol):
    """A provider with limits of its own (``max_instances``, ``max_cores``).

    The create path counts the fleet's VMs against them and lets a VM wait reserved
    rather than ask a cloud that would say no (vmpool/state/capacity.py)."""

    def limits(self) -> tuple[int, int]:
        """(max_instances, max_cores), 0 for no limit."""
        ...

    def cores(self, pool: str) -> int:
        """The vCPUs of one VM of ``pool`` (asked only when max_cores is set)."""
        ...


def uses_circuit(provider: Provider | None) -> bool:
    """Whether the provider's failed creates count toward its circuit breaker.

    False for None (a provider the configuration does not name)."""
    return provider is not None and provider.circuit_breaker


def create_for_request(
    provider: Provider, pool: str, template: str, name: str, request_id: str
) -> ProviderVM:
    """``provider.create_vm``, with the request id when the provider tags VMs with it.

    A pool's placement (instance size, zone, ...) is the provider's own business: it
    was given every pool's keys when built."""
    if provider.tags_request_id:
        return provider.create_vm(pool, template, name, request_id=request_id)
    return provider.create_vm(pool, template, name)

"""The outcome codes the lifecycle's jobs coin, one StrEnum per family of functions.

A job answers one of its family's codes, or a code of the store passed through as it
came (:data:`StoreCode`, marked by :func:`store_code`), or ``vm_<state>`` /
``request_<status>`` naming the state it found (:data:`InState`, made by
:func:`in_state`). So mypy checks every code a job returns: a bare string is none of
these. The members are strings equal to their values: logs, metrics and callers that
compare strings read the same words.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, NewType

from vmpool.state.records import Outcome

__all__ = [
    "BatchCount",
    "InState",
    "LockMiss",
    "ReconcileCount",
    "RecycleReason",
    "RequestCode",
    "RequestStep",
    "ReserveCode",
    "StoreCode",
    "TaskCode",
    "TaskStep",
    "VMCode",
    "VMStep",
    "in_state",
    "store_code",
]

# A code of the store's transitions passed through unchanged (``Outcome.code``).
StoreCode = NewType("StoreCode", str)
# ``vm_<state>`` / ``request_<status>``: the state a job found its subject in.
InState = NewType("InState", str)


def store_code(outcome: Outcome) -> StoreCode:
    """The store's code of ``outcome``, passed through as a job's outcome."""
    return StoreCode(outcome.code)


def in_state(kind: Literal["vm", "request"], state: str) -> InState:
    """The code of a job that found its subject in another state than it needs."""
    return InState(f"{kind}_{state}")


class LockMiss(StrEnum):
    """Why a step did not run, or did not finish, under its lock."""

    BUSY = "busy"  # another worker holds the lock
    LOCK_LOST = "lock_lost"  # the lock expired or went to another worker midway


class ReserveCode(StrEnum):
    """What a reservation coins. Else a refusal of the store passes through."""

    RESERVED = "reserved"
    CLONE_LIMIT = "clone_limit"  # no clone slot free: the rest waits
    NAMES_EXHAUSTED = "names_exhausted"  # every name drawn was taken


class VMStep(StrEnum):
    """What create_vm, check_pending_vm and destroy_vm (and their steps) coin."""

    PENDING = "pending"  # created at the provider, recorded pending
    COMPLETED = "completed"  # the VM is nobody's: to destruction
    FAILED = "failed"  # vm_failed recorded, the request keeps its retries
    BOOTING = "booting"  # not ready yet, nothing changed
    THROTTLED = "throttled"  # no clone slot free
    QUOTA = "quota"  # the cloud or the provider's own limits: the VM waits reserved
    CIRCUIT_OPEN = "circuit_open"  # the provider's circuit breaker is open
    STALE_FENCE = "stale_fence"  # another worker holds the VM now
    NO_VM = "no_vm"  # no record
    NO_PROVIDER = "no_provider"  # the record names a provider not configured
    PROVIDER_ERROR = "provider_error"  # a transient provider failure: retried later
    OTHER_PROVIDER = "other_provider"  # the pool changed provider since the create


class RequestStep(StrEnum):
    """What check_request coins."""

    PENDING = "pending"  # its work dispatched
    NO_REQUEST = "no_request"


class TaskStep(StrEnum):
    """What vm_task coins when it does nothing."""

    NO_TASK = "no_task"  # done already
    NO_VM = "no_vm"


class RecycleReason(StrEnum):
    """Why check_ready recycles a ready VM (its trail's reason and its count)."""

    READY_TTL = "ready_ttl"
    POOL_SHRANK = "pool shrank"
    FAILED_CHECK = "failed its check"


class BatchCount(StrEnum):
    """The counts a batch job adds to its subjects' outcomes."""

    DONE = "done"  # a step that answered no code
    ERROR = "error"  # a step that raised
    MORE = "more"  # stopped on time with work left
    RELEASED = "released"  # claimed subjects let go unstarted


class ReconcileCount(StrEnum):
    """What reconcile counts."""

    INVENTORY_ERROR = "inventory_error"
    PROVIDER_ERROR = "provider_error"
    NO_PROVIDER = "no_provider"
    UNRECORDED_IN_GRACE = "unrecorded_in_grace"
    # no record, under a mark the fleet only recognises: maybe another install's, kept
    UNRECORDED_NOT_OWNED = "unrecorded_not_owned"
    # no record, while the fleet has a lost mark (its Redis lost its data): kept
    UNRECORDED_KEPT = "unrecorded_kept"
    DESTROY_DISPATCHED = "destroy_dispatched"
    SKIPPED_RECORDED = "skipped_recorded"
    LEAKED_DESTROYED = "leaked_destroyed"
    LEAKED_GONE = "leaked_gone"
    RESURRECTED_DESTROYED = "resurrected_destroyed"
    RESURRECTED_GONE = "resurrected_gone"
    RESERVATION_CREATED = "reservation_created"
    RESERVATION_RELEASED = "reservation_released"
    RESERVATION_FAILED = "reservation_failed"
    RESERVATION_REDISPATCHED = "reservation_redispatched"
    PENDING_LOST = "pending_lost"
    RUNNING_LOST = "running_lost"


# What each family of jobs answers.
VMCode = VMStep | LockMiss | StoreCode | InState
RequestCode = RequestStep | StoreCode | InState
TaskCode = TaskStep | StoreCode

"""RQ job entry points: one thin function per job, each calls ONE lifecycle function.

A job parses its argument, takes the Fleet its worker bound to it
(:func:`workers.worker.current_fleet`: the worker process builds one Fleet and hands it
to each job through RQ's current-job context, with no module globals), and calls the domain.
All the logic, every check and every state change lives in :mod:`vmpool.lifecycle` and
the store. These functions only adapt RQ's calling convention. The return value is for
the worker log only (``result_ttl=0``: RQ keeps no results).

Every job is idempotent and safe to run twice, late, or beside a copy of itself. None
relies on RQ re-running it (no ``Retry``): the periodic sweeps re-find the work.
"""

from __future__ import annotations

from vmpool import lifecycle
from vmpool.ids import Job, validate_request_id, validate_vm_name, validate_vm_task
from workers.batching import continued
from workers.worker import current_fleet

__all__ = [
    "check_pending_batch",
    "check_pending_sweep",
    "check_pending_vm",
    "check_ready",
    "check_request",
    "create_vm",
    "create_vm_batch",
    "destroy_sweep",
    "destroy_vm",
    "noop",
    "provision_batch",
    "provision_request",
    "provision_sweep",
    "reap_running",
    "reconcile",
    "record_history",
    "sweep_expired",
    "top_up_pools",
    "vm_task",
]


def noop() -> None:
    """Does nothing (benchmarks: RQ's own per-job cost)."""


# -- per request ----------------------------------------------------------------------
def provision_request(request_id: str) -> list[str]:
    return lifecycle.provision_request(current_fleet(), validate_request_id(request_id))


def check_request(request_id: str) -> str:
    return lifecycle.check_request(current_fleet(), validate_request_id(request_id))


# -- per VM ---------------------------------------------------------------------------
def create_vm(name: str) -> str:
    return lifecycle.create_vm(current_fleet(), validate_vm_name(name))


def check_pending_vm(name: str) -> str:
    return lifecycle.check_pending_vm(current_fleet(), validate_vm_name(name))


def destroy_vm(name: str) -> str:
    return lifecycle.destroy_vm(current_fleet(), validate_vm_name(name))


def vm_task(task: str) -> str:
    return lifecycle.vm_task(current_fleet(), validate_vm_task(task))


# -- periodic sweeps ------------------------------------------------------------------
def sweep_expired() -> dict[str, int]:
    return lifecycle.sweep_expired(current_fleet())


def provision_sweep() -> int:
    return lifecycle.provision_sweep(current_fleet())


def check_pending_sweep() -> int:
    return lifecycle.check_pending_sweep(current_fleet())


def reap_running() -> int:
    return lifecycle.reap_running(current_fleet())


def destroy_sweep() -> int:
    return lifecycle.destroy_sweep(current_fleet())


def reconcile() -> dict[str, int]:
    return lifecycle.reconcile(current_fleet())


def top_up_pools() -> dict[str, int]:
    return lifecycle.top_up_pools(current_fleet())


def check_ready() -> dict[str, int]:
    return lifecycle.check_ready(current_fleet())


def record_history() -> int:
    return lifecycle.record_history(current_fleet())


# Batch jobs: one job runs many subjects of a work set (vmpool.lifecycle.batch).
# One that stopped on time with work left queues its continuation (workers.batching).
def provision_batch() -> dict[str, int]:
    fleet = current_fleet()
    return continued(fleet, Job.PROVISION_BATCH, lifecycle.provision_batch(fleet))


def create_vm_batch() -> dict[str, int]:
    fleet = current_fleet()
    return continued(fleet, Job.CREATE_VM_BATCH, lifecycle.create_vm_batch(fleet))


def check_pending_batch() -> dict[str, int]:
    fleet = current_fleet()
    return continued(fleet, Job.CHECK_PENDING_BATCH, lifecycle.check_pending_batch(fleet))

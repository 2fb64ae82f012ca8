"""Snapshots, reverts and extra disks of a held VM.

What the ``vm_task`` job does, and which providers can (vmpooler's snapshot and disk
tasks).

The API records the task on the VM through the store (only its holder may ask) and
queues the job. :func:`vm_task` calls the provider's capability
(:class:`~vmpool.providers.Snapshots`, :class:`~vmpool.providers.Disks`), idempotent by
the task's id (the snapshot's name, the disk's label), then records the result through
the store (``finish_vm_task``: once, so a job run twice does the work at most twice and
records it once). A provider without the capability fails the task at once (the API
refuses such a task before it is recorded: :func:`supports`).
"""

from __future__ import annotations

import inspect
import logging
import sys
from typing import Any

from vmpool.config import Config
from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.outcomes import TaskCode, TaskStep, store_code
from vmpool.providers import Disks, Snapshots, is_permanent_error
from vmpool.providers.registry import provider_class
from vmpool.state.durability import settle
from vmpool.state.vm_tasks import TaskKind, VMTask

__all__ = ["capability", "supports", "vm_task"]

log = logging.getLogger(__name__)


def capability(kind: TaskKind) -> type[Any]:
    """The provider protocol a task of ``kind`` needs."""
    return Disks if kind == "disk" else Snapshots


def _implementation(build: Any) -> type[Any] | None:
    """The class a provider class's builder makes (its return annotation for a factory)."""
    if inspect.isclass(build):
        return build
    made = inspect.signature(build).return_annotation
    if isinstance(made, str):  # postponed annotations: a name in the builder's module
        made = getattr(sys.modules.get(build.__module__), made, None)
    return made if inspect.isclass(made) else None


def supports(config: Config, pool: str, kind: TaskKind) -> bool:
    """Whether the provider of ``pool`` can carry out a task of ``kind``.

    Judged by its class, so the API builds no provider (no cloud connection) to answer."""
    pool_config = config.pools.get(pool)
    provider = config.providers.get(pool_config.provider) if pool_config else None
    implementation = provider_class(provider.provider_class) if provider else None
    made = _implementation(implementation.build) if implementation else None
    return made is not None and issubclass(made, capability(kind))


def vm_task(fleet: Fleet, subject: str) -> TaskCode:
    """Carry out one task (``<VM>:<kind>:<id>``).

    Returns 'done', 'failed' or why nothing was done. 'failed' is any provider error: the
    trail says why, and the holder may ask again. Nothing was done: 'no_task' (done
    already) or 'no_vm'."""
    task = VMTask.parse(subject)
    arg = fleet.store.tasks.vm_task_arg(task)
    if arg is None:
        return TaskStep.NO_TASK
    vm = fleet.store.get_vm(task.vm)
    provider = fleet.providers.get(vm.provider) if vm else None
    if vm is None:
        return TaskStep.NO_VM
    actor = fleet.who("vm_task")
    if not isinstance(provider, capability(task.kind)):
        error = f"the provider of pool {vm.pool} cannot do a {task.kind}"
        return store_code(fleet.store.tasks.finish_vm_task(task, actor=actor, error=error))
    settle(fleet.redis)  # the job's writes confirmed before the side effect
    try:
        _call(provider, vm.pool, task, arg)
    except Exception as exc:  # the task fails, as vmpooler's: its holder may ask again
        kind = "permanent" if is_permanent_error(exc) else "transient"
        log.warning("vm_task %s failed (%s): %s", subject, kind, exc)
        return store_code(
            fleet.store.tasks.finish_vm_task(task, actor=actor, error=str(exc) or kind)
        )
    outcome = fleet.store.tasks.finish_vm_task(task, actor=actor)
    log.info("vm_task %s: %s", subject, outcome.code)
    return store_code(outcome)


def _call(provider: Any, pool: str, task: VMTask, arg: str) -> None:
    if task.kind == "snapshot":
        provider.create_snapshot(pool, task.vm, task.id)
    elif task.kind == "revert":
        provider.revert_snapshot(pool, task.vm, arg)
    else:
        provider.add_disk(pool, task.vm, int(arg), task.id)

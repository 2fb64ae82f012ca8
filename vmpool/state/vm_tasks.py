"""A held VM's snapshots, reverts and extra disks in the state store.

These are vmpooler's ``vmpooler__tasks__snapshot|snapshot-revert|disk``, in
:class:`VMTaskStore`: the part of the store that holds them (``Store.tasks``).

- The API records a task on the VM (``vm_task_add.lua``). Only its holder may, and a
  revert only to a snapshot taken.
- The ``vm_task`` job calls the provider and records the result (``vm_task_done.lua``:
  ``snapshot:<id>`` and ``disk`` as vmpooler writes them).

A task is named ``<VM>:<kind>:<id>`` (:data:`vmpool.ids.VM_TASK_RE`), the job's subject.
"""

from __future__ import annotations

import hashlib
import secrets
import string
from dataclasses import dataclass
from typing import Final, Literal

import redis

from vmpool.ids import validate_vm_name, validate_vm_task
from vmpool.state.keys import Keys
from vmpool.state.ops import Op
from vmpool.state.records import Outcome, text
from vmpool.state.store_scripts import StoreScripts

__all__ = ["TASK_KINDS", "TaskKind", "VMTask", "VMTaskStore", "new_task_id"]

TaskKind = Literal["snapshot", "revert", "disk"]
TASK_KINDS: Final[tuple[TaskKind, ...]] = ("snapshot", "revert", "disk")
_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits


def new_task_id(seed: str | None = None) -> str:
    """A task id as vmpooler makes a snapshot's: 32 of [a-z0-9], the first a letter.

    Random, or drawn from ``seed`` (an operation id: the repeat of a call names the task
    the first call asked for).
    """
    if seed is None:
        return secrets.choice(_FIRST) + "".join(secrets.choice(_REST) for _ in range(31))
    digest = hashlib.sha256(seed.encode()).digest()
    return _FIRST[digest[0] % 26] + "".join(_REST[b % 36] for b in digest[1:32])


@dataclass(frozen=True)
class VMTask:
    """One task of one VM: ``arg`` is a disk's size in GB, a revert's snapshot, or ''."""

    vm: str
    kind: TaskKind
    id: str

    @property
    def subject(self) -> str:
        """The vm_task job's subject."""
        return f"{self.vm}:{self.kind}:{self.id}"

    @property
    def field(self) -> str:
        """The VM hash's field that holds the task while it waits."""
        return f"task:{self.kind}:{self.id}"

    @classmethod
    def parse(cls, subject: str) -> VMTask:
        name, kind, task_id = validate_vm_task(subject).split(":")
        assert kind in TASK_KINDS
        return cls(name, kind, task_id)  # type: ignore[arg-type]


class VMTaskStore:
    """The VM-task part of the store (``Store.tasks``), usable on its own."""

    def __init__(
        self, redis_client: redis.Redis, keys: Keys, scripts: StoreScripts | None = None
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.scripts = scripts or StoreScripts(redis_client, keys)

    def add_vm_task(
        self, task: VMTask, arg: str, *, actor: str, user: str = "", op: Op | None = None
    ) -> Outcome:
        """Record ``task`` by the VM's holder ``user`` ('' for admin or auth off).

        ``op``: the operation (:mod:`vmpool.state.ops`; None: one made for the call)."""
        args = [task.vm, user, task.kind, task.id, arg]
        return self.scripts.run_on_vm(task.vm, "vm_task_add", actor, args, op=op)

    def vm_task_arg(self, task: VMTask) -> str | None:
        """The waiting task's argument, None when it is not (or no longer) waiting."""
        raw = self.redis.hget(self.keys.vm(validate_vm_name(task.vm)), task.field)
        return None if raw is None else text(raw)

    def finish_vm_task(self, task: VMTask, *, actor: str, error: str = "") -> Outcome:
        """Record the task done (``error`` '') or failed, once."""
        args = [task.vm, task.kind, task.id, "0" if error else "1", error[:200]]
        return self.scripts.run_on_vm(task.vm, "vm_task_done", actor, args)

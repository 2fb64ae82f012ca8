"""vmpooler's snapshot and disk endpoints.

POST /vm/<hostname>/snapshot (202 with the new snapshot's id), POST
/vm/<hostname>/snapshot/<id> (revert to it), POST /vm/<hostname>/disk/<size> (add a disk
of <size> GB).

Only the VM's holder may ask (403 for another user's VM: vmpooler lets any token act
on any VM), and only for a held VM (404 otherwise, as for an unknown one). The task is
recorded on the VM through the store and carried out by the ``vm_task`` job
(:mod:`vmpool.lifecycle.vm_tasks`). GET /vm/<hostname> shows the snapshots taken and
the disks added, as vmpooler does, once they are done. A pool whose provider cannot do
it: 501 ``{"ok": false, "message": ...}``.
"""

from __future__ import annotations

import logging
import re

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State, Token, counted
from vmpool.api.idempotency import CallKey, call_key
from vmpool.api.responses import not_ok, reply
from vmpool.api.vm_views import disk_failures, short_hostname
from vmpool.ids import InvalidIdentifier, Job, validate_vm_name
from vmpool.lifecycle.vm_tasks import supports
from vmpool.state.ops import Op
from vmpool.state.tokens import TokenInfo
from vmpool.state.vm_tasks import TaskKind, VMTask, new_task_id
from workers.queues import enqueue

__all__ = ["ask", "router"]

log = logging.getLogger(__name__)

router = APIRouter()

_SNAPSHOT_ID = re.compile(r"[a-z0-9]{1,32}")


def ask(
    st: ApiState, name: str, kind: TaskKind, arg: str, user: str, op: Op
) -> tuple[VMTask | None, Response]:
    """Record a task on VM ``name`` for its holder ``user`` and queue its job.

    (task, 202 reply), or (None, the refusal). Also PUT /vm/<hostname> {"disk": n}'s way.
    The task's id is drawn from ``op``: a repeat names the task the first call asked for."""
    vm = st.store.get_vm(name)
    if vm is None:
        return None, not_ok(404)
    if not supports(st.config, vm.pool, kind):
        what = "disks" if kind == "disk" else "snapshots"
        return None, not_ok(501, message=f"the provider of pool {vm.pool} does not do {what}")
    task = VMTask(name, kind, new_task_id(op.id))
    out = st.store.tasks.add_vm_task(task, arg, actor="api", user=user, op=op)
    if out.code == "forbidden":
        return None, not_ok(403, message=f"{name} is held by another user")
    if not out.ok:  # not held, no such snapshot
        return None, not_ok(404)
    enqueue(st.clients.raw, st.keys, Job.VM_TASK, task.subject)
    log.info("%s asked for VM %s%s", task.subject, name, f" by {user}" if user else "")
    return task, reply(202, {"ok": True})


def _ask(
    st: ApiState,
    hostname: str,
    kind: TaskKind,
    arg: str,
    token: TokenInfo | None,
    key: CallKey,
) -> tuple[VMTask | None, Response]:
    name = short_hostname(hostname)
    try:
        validate_vm_name(name)
    except InvalidIdentifier:
        return None, not_ok(404)
    user = token.user if token else ""
    return ask(st, name, kind, arg, user, key.op(user))


@router.post("/vm/{hostname}/snapshot", dependencies=[counted("post", "vm", "snapshot")])
async def snapshot(hostname: str, request: Request, st: State, token: Token) -> Response:
    key = call_key(request)

    def run() -> Response:
        task, refused = _ask(st, hostname, "snapshot", "", token, key)
        if task is None:
            return refused
        return reply(202, {"ok": True, task.vm: {"snapshot": task.id}})

    return await run_in_threadpool(run)


@router.post(
    "/vm/{hostname}/snapshot/{snapshot_id}", dependencies=[counted("post", "vm", "snapshot")]
)
async def revert(
    hostname: str, snapshot_id: str, request: Request, st: State, token: Token
) -> Response:
    if not _SNAPSHOT_ID.fullmatch(snapshot_id):
        return not_ok(404)
    key = call_key(request)
    return await run_in_threadpool(lambda: _ask(st, hostname, "revert", snapshot_id, token, key)[1])


@router.post("/vm/{hostname}/disk/{size}", dependencies=[counted("post", "vm", "disksize")])
async def disk(hostname: str, size: str, request: Request, st: State, token: Token) -> Response:
    short_hostname(hostname)  # vmpooler validates the hostname, then the size
    failures = disk_failures(size)
    if failures:
        return not_ok(400, error=failures[0])
    gb = int(size)
    key = call_key(request)

    def run() -> Response:
        task, refused = _ask(st, hostname, "disk", str(gb), token, key)
        if task is None:
            return refused
        return reply(202, {"ok": True, task.vm: {"disk": f"+{gb}gb"}})

    return await run_in_threadpool(run)

"""A request's and a VM's timeline: GET /ondemandvm/<id>/timeline, GET /vm/<hostname>/timeline.

Every transition of the request and its VMs (or of the VM), the provider calls they
record and their errors, with server timestamps and actors, oldest first. Read from
the audit trails by :mod:`vmpool.state.timeline`, which `vmpool request history` reads
too. No token needed, as vmpooler's GET /ondemandvm/<id>: a timeline holds no secret
(actors are processes, ``api`` or ``cli``, never a user or a token).

A malformed id or hostname is a 400 naming the problem, an unknown one a 404, both JSON.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State
from vmpool.api.responses import not_ok, reply
from vmpool.api.vm_views import short_hostname
from vmpool.ids import InvalidIdentifier, is_address, validate_request_id, validate_vm_name
from vmpool.state.timeline import TimelineEntry, request_timeline, vm_timeline

__all__ = ["router"]

router = APIRouter()


@router.get("/ondemandvm/{request_id}/timeline")
async def get_request_timeline(request_id: str, st: State) -> Response:
    return await run_in_threadpool(request_body, st, request_id)


@router.get("/vm/{hostname}/timeline")
async def get_vm_timeline(hostname: str, st: State) -> Response:
    return await run_in_threadpool(vm_body, st, hostname)


def request_body(st: ApiState, request_id: str) -> Response:
    try:
        rid = validate_request_id(request_id)
    except InvalidIdentifier as exc:
        return not_ok(400, message=str(exc))
    entries = request_timeline(st.store, rid)
    if entries is None:
        return not_ok(404, message=f"no request found for request_id '{rid}'")
    return _answer({"request_id": rid}, entries)


def vm_body(st: ApiState, hostname: str) -> Response:
    """The VM ``hostname`` names: a bare name, an FQDN or its cloud address."""
    if is_address(hostname):
        name = st.store.vm_at_address(hostname)
        if name is None:
            return not_ok(404, message=f"no VM found at address '{hostname}'")
    else:
        try:
            name = validate_vm_name(short_hostname(hostname))
        except InvalidIdentifier as exc:
            return not_ok(400, message=str(exc))
    entries = vm_timeline(st.store, name)
    if entries is None:
        return not_ok(404, message=f"no VM found named '{name}'")
    return _answer({"hostname": name}, entries)


def _answer(subject: dict[str, str], entries: list[TimelineEntry]) -> Response:
    return reply(200, {"ok": True, **subject, "timeline": [e.as_dict() for e in entries]})

"""vmpooler's per-VM API.

GET /vm, checkout (POST /vm, POST /vm/<pool>+<pool>), GET, PUT and DELETE
/vm/<hostname>, GET /token/<token> (snapshots and disks:
:mod:`vmpool.api.routers.vm_tasks`).

The API writes no state itself: a checkout is ``PoolStore.checkout`` (one script: all or
nothing, each ready VM to one client), a give-back ``PoolStore.give_back``, a modification
``PoolStore.extend_vm`` / ``PoolStore.tag_vm``. Content types are not checked: vmfloaty posts the
path form with no body and sends PUT's JSON labelled as a form. Each change is one
operation of the call's idempotency key (:mod:`vmpool.api.idempotency`): a repeat answers
what the first call did (a checkout: the VMs it handed out).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import REALM, ApiState, CheckoutToken, State, Token, counted
from vmpool.api.errors import Rejected
from vmpool.api.idempotency import CallKey, call_key
from vmpool.api.parsing import parse_count, parse_json_body, read_body
from vmpool.api.quotas import checkout_limits, over_quota_message
from vmpool.api.responses import PrettyJSON, not_ok, reply
from vmpool.api.routers.vm_tasks import ask
from vmpool.api.vm_views import (
    checkout_body,
    filter_tags,
    modify_failures,
    short_hostname,
    vm_body,
)
from vmpool.ids import ANONYMOUS_USER, InvalidIdentifier, is_address, validate_vm_name
from vmpool.state import reads
from vmpool.state.pool_store import Checkout
from vmpool.state.records import VMRecord
from vmpool.state.tokens import TokenInfo
from vmpool.state.transitions import VMState

__all__ = ["router"]

log = logging.getLogger(__name__)

MAX_CHECKOUT = 100  # vmpooler's validate_vm_count

router = APIRouter()


@router.get("/vm")
async def list_pools(st: State) -> Response:
    return PrettyJSON(list(st.config.pools), status_code=200)


@router.post("/vm", dependencies=[counted("post", "vm", "checkout")])
async def checkout_json(request: Request, st: State, token: CheckoutToken) -> Response:
    raw = await read_body(request)
    data = parse_json_body(raw) if raw.strip() else {}
    if not isinstance(data, Mapping):
        raise Rejected(400, error="Request body must be a JSON object")
    counts = {str(name): parse_count(str(name), n, MAX_CHECKOUT) for name, n in data.items()}
    return await run_in_threadpool(checkout, st, counts, token, call_key(request, raw))


@router.post("/vm/{template}", dependencies=[counted("get", "vm", "template")])
async def checkout_path(
    template: str, request: Request, st: State, token: CheckoutToken
) -> Response:
    raw = await read_body(request)  # ignored, but bounded
    counts: dict[str, int] = {}
    for name in template.split("+"):
        counts[name] = counts.get(name, 0) + 1
    return await run_in_threadpool(checkout, st, counts, token, call_key(request, raw))


def _choose(st: ApiState, counts: Mapping[str, int]) -> list[tuple[str, str, int]] | None:
    """(name asked, pool, count) for each name.

    The pool of that name, or among the pools an alias selects the first with enough ready
    VMs. None: an unknown name."""
    candidates = {name: st.config.resolve_name(name) for name in counts}
    if not counts or not all(candidates.values()):
        return None
    pools = sorted({p for c in candidates.values() for p in c})
    ready = {p: c[VMState.READY] for p, c in st.store.pool_counts(pools).items()}
    wanted = []
    for name, n in counts.items():
        pool = next((p for p in candidates[name] if ready[p] >= n), candidates[name][0])
        ready[pool] -= n
        wanted.append((name, pool, n))
    return wanted


def checkout(
    st: ApiState, counts: Mapping[str, int], token: TokenInfo | None, key: CallKey
) -> Response:
    """vmpooler's checkout, all or nothing.

    200 with the hostnames, 503 ``{"ok": false}`` when any pool is short (nothing handed
    out), 404 for an unknown name. The names asked travel with the checkout (``asked``):
    a repeat of ``key`` answers the first call's VMs under the names that call chose."""
    if any(n > MAX_CHECKOUT for n in counts.values()):
        return not_ok(400, error=f"VM count must be at most {MAX_CHECKOUT}")
    wanted = _choose(st, counts)
    if wanted is None:
        for name in counts:
            pool = name if st.config.resolve_name(name) else "unknown"
            st.metrics.checkout.labels("invalid", pool).inc()
        return not_ok(404)
    per_pool: dict[str, int] = {}
    for _, pool, n in wanted:
        per_pool[pool] = per_pool.get(pool, 0) + n
    lifetime = st.config.vm_lifetime_auth_s if token else st.config.vm_lifetime_s
    user = token.user if token else ""
    out = st.store.pools.checkout(
        per_pool,
        owner=user,
        owner_hash=token.sha256 if token else "",
        lifetime_s=lifetime,
        actor="api",
        asked=json.dumps(wanted),
        op=key.op(user),
        quota=checkout_limits(st.config, user),
    )
    if not out.ok:
        log.info("checkout of %s refused: %s %s", dict(per_pool), out.code, out.short)
        return _refused(st, out, per_pool, user)
    for pool in per_pool:
        st.metrics.checkout.labels("success", pool).inc()
    log.info("checked out %s%s", [n for n, _ in out.vms], f" to {token.user}" if token else "")
    hostnames = {vm.name: vm.hostname for vm in st.store.get_vms(n for n, _ in out.vms)}
    asked = [(str(a), str(p), int(n)) for a, p, n in json.loads(out.asked)] if out.asked else wanted
    return reply(200, checkout_body(asked, out.vms, st.config, hostnames))


def _refused(st: ApiState, out: Checkout, per_pool: Mapping[str, int], user: str) -> Response:
    """vmpooler's answer to a checkout that handed out nothing, counted by outcome.

    503 ``{"ok": false}`` when a pool is short (vmpooler's ``checkout.empty``); 403 with
    a message naming the quota when the VMs would pass the user's (``checkout.quota``).
    """
    if out.code.startswith("quota_"):
        for pool in per_pool:
            st.metrics.checkout.labels("quota", pool).inc()
        asked = sum(per_pool.values())
        return not_ok(403, message=over_quota_message(st.config, user, out.code, out.held, asked))
    st.metrics.checkout.labels("empty", out.short if out.short in per_pool else "unknown").inc()
    return not_ok(503)


def _vm_name(hostname: str) -> str | None:
    """The VM a bare name or FQDN names (its first label).

    An address: None (see :func:`_resolve`)."""
    name = short_hostname(hostname)
    try:
        validate_vm_name(name)
    except InvalidIdentifier:
        return None
    return name


def _vm(st: ApiState, hostname: str) -> VMRecord | None:
    """The VM ``hostname`` names.

    Whatever the API handed out, a bare name, an FQDN or the cloud's address (the address
    index, Keys.addresses)."""
    name = st.store.vm_at_address(hostname) if is_address(hostname) else _vm_name(hostname)
    return None if name is None else st.store.get_vm(name)


async def _resolve(st: ApiState, hostname: str) -> str | None:
    """:func:`_vm`'s name lookup, awaited on the loop.

    An address costs one read of the index."""
    if not is_address(hostname):
        return _vm_name(hostname)
    raw = await st.clients.aio.get().hget(st.keys.addresses, hostname)
    return None if raw is None else str(raw)


@router.get("/vm/{hostname}", dependencies=[counted("get", "vm", "hostname")])
async def get_vm(hostname: str, st: State) -> Response:
    """The VM and the server's time (its age, its time left) in one pipeline.

    Awaited on the loop."""
    name = await _resolve(st, hostname)
    if name is None:
        return not_ok(404)
    pipe = st.clients.aio.get().pipeline(transaction=False)
    reads.queue_vms(pipe, st.keys, [name])
    pipe.time()
    replies = await pipe.execute()
    vms = reads.vms_from(replies[:1])
    if not vms:
        return not_ok(404)
    vm = vms[0]
    return reply(200, {"ok": True, vm.name: vm_body(vm, st.config, reads.time_from(replies[1]))})


@router.put("/vm/{hostname}", dependencies=[counted("put", "vm", "modify")])
async def modify_vm(hostname: str, request: Request, st: State, token: Token) -> Response:
    raw = await read_body(request)  # JSON whatever the content type says (vmfloaty)
    key = call_key(request, raw)
    return await run_in_threadpool(modify, st, hostname, raw, token, key)


def modify(
    st: ApiState, hostname: str, raw: bytes, token: TokenInfo | None, key: CallKey
) -> Response:
    """PUT /vm/<hostname>: each change one operation of ``key`` (its step: the field)."""
    vm = _vm(st, hostname)
    if vm is None:
        return not_ok(404)
    data = parse_json_body(raw) if raw.strip() else {}
    if not isinstance(data, Mapping):
        return not_ok(400, error="Request body must be a JSON object")
    failures = modify_failures(data, st.config)
    if failures:
        return not_ok(400, failure=failures)
    user = token.user if token else ""
    for param, arg in data.items():
        op = key.op(user, param)
        if param == "disk":  # what vmfloaty's `modify --disk N` sends
            task, refused = ask(st, vm.name, "disk", str(int(str(arg).strip())), user, op)
            if task is None:
                return refused
            continue
        if param == "lifetime":
            hours = int(str(arg).strip())
            out = st.store.pools.extend_vm(vm.name, hours, actor="api", user=user, op=op)
        else:
            tags = filter_tags(arg, st.config.tagfilter)
            out = st.store.pools.tag_vm(vm.name, tags, actor="api", user=user, op=op)
        if out.code == "forbidden":
            return not_ok(403, message=f"{vm.name} is held by another user")
        if not out.ok and out.code != "no_tags":
            return not_ok(400, failure=[f"{vm.name} is not running ({out.code})"])
    return reply(200, {"ok": True})


@router.delete("/vm/{hostname}", dependencies=[counted("delete", "vm", "hostname")])
async def delete_vm(hostname: str, request: Request, st: State, token: CheckoutToken) -> Response:
    """vmpooler's give-back: a token is needed only for a VM handed out with one."""
    key = call_key(request)

    def give_back() -> Response:
        vm = _vm(st, hostname)
        if vm is None:
            return not_ok(404)
        anonymous = token is None and st.config.auth is not None
        user = ANONYMOUS_USER if anonymous else token.user if token else ""
        out = st.store.pools.give_back(vm.name, actor="api", user=user, op=key.op(user))
        if out.ok:
            log.info("VM %s given back%s", vm.name, f" by {token.user}" if token else "")
            return reply(200, {"ok": True})
        if out.code == "forbidden" and anonymous:  # vmpooler's need_token!
            raise Rejected(401, {"WWW-Authenticate": REALM})
        if out.code == "forbidden":
            return not_ok(403, message=f"{vm.name} is held by another user")
        return not_ok(404)

    return await run_in_threadpool(give_back)


@router.get("/token/{token}")
async def get_token(token: str, st: State) -> Response:
    return await run_in_threadpool(token_body, st, token)


def token_body(st: ApiState, token: str) -> Response:
    """vmpooler's GET /token/<token>.

    The token's record and its running VMs (short names, as vmfloaty's ``list --active``
    needs them). 404 when auth is off."""
    info = st.tokens.lookup(token, touch=False) if st.config.auth is not None else None
    if info is None:
        return not_ok(404)
    entry: dict[str, Any] = {"user": info.user, "created": info.created, "last": info.last}
    owners: dict[str, str] = {}
    running = []
    for vm in st.store.pools.held_vms(st.config.pools):
        if vm.request_id:
            if vm.request_id not in owners:
                req = st.store.get_request(vm.request_id)
                owners[vm.request_id] = req.token_hash if req else ""
            mine = owners[vm.request_id] == info.sha256
        else:
            mine = st.store.pools.owner_token(vm.name) == info.sha256
        if mine:
            running.append(vm.name)
    if running:
        entry["vms"] = {"running": running}
    return reply(200, {"ok": True, token: entry})

"""vmpooler's pool endpoints.

GET /poolstat, GET /totalrunning, GET /config, and the operator endpoints behind
``experimental_features`` (405 ``{"ok": false}`` when off): POST /config/poolsize,
/config/pooltemplate, /config/clonetarget, POST /poolreset, DELETE
/config/poolsize/<pool>, DELETE /config/pooltemplate/<pool>.

An operator call needs a token of one of ``:auth: admins`` when auth is on (401
without a valid token, 403 for anyone else: vmpooler lets any token resize any pool).
Every change goes through :mod:`vmpool.lifecycle.overrides` (runtime values in Redis,
and a reset through the store's ``reset_pool`` script), so workers honour it at once.
Each is an operation of the call's idempotency key (:mod:`vmpool.api.idempotency`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State, token_auth
from vmpool.api.errors import Rejected
from vmpool.api.idempotency import call_key
from vmpool.api.parsing import parse_json_body, read_body
from vmpool.api.responses import not_ok, reply
from vmpool.config import PoolConfig
from vmpool.config.fields import MAX_COUNT
from vmpool.lifecycle.overrides import (
    pools_with_overrides,
    reset_pools,
    revert_setting,
    set_setting,
)
from vmpool.state.overrides import Setting
from vmpool.state.transitions import VMState

__all__ = ["router"]

router = APIRouter()

_TEMPLATE_RE = re.compile(r"[^\x00-\x1f\x7f]{1,255}")


def _pools(st: ApiState) -> dict[str, PoolConfig]:
    return pools_with_overrides(st.clients.text, st.keys, st.config)


@router.get("/poolstat")
async def poolstat(request: Request, st: State) -> Response:
    """GET /poolstat: each pool's size, aliases and ready VMs.

    ``?pool=a,b``: each pool named (or having one of the names as an alias): its ``max``
    (size), ``alias`` and ``ready`` VMs. No ``pool``: ``{"pools": {}}``."""
    wanted = set((request.query_params.get("pool") or "").split(","))

    def body() -> Response:
        pools = [p for p in _pools(st).values() if p.name in wanted or wanted & set(p.alias)]
        ready = st.store.pool_counts(p.name for p in pools)
        out: dict[str, Any] = {}
        for pool in pools:
            entry: dict[str, Any] = {"max": pool.size}
            if pool.alias:
                entry["alias"] = list(pool.alias)
            entry["ready"] = ready[pool.name][VMState.READY]
            out[pool.name] = entry
        return reply(200, {"pools": out})

    return await run_in_threadpool(body)


@router.get("/totalrunning")
async def totalrunning(st: State) -> Response:
    """The running VMs of every pool: checked out, and on-demand requests' VMs."""

    def body() -> Response:
        counts = st.store.pool_counts(st.config.pools)
        return reply(200, {"running": sum(c[VMState.RUNNING] for c in counts.values())})

    return await run_in_threadpool(body)


def _minutes(seconds: float) -> float | int:
    """vmpooler's unit for pool timeouts: whole minutes stay integers."""
    minutes = round(seconds / 60, 2)
    return int(minutes) if minutes == int(minutes) else minutes


def _public(pool: PoolConfig) -> dict[str, Any]:
    """A pool as vmpooler's GET /config lists it (its effective values, without secrets)."""
    entry: dict[str, Any] = {"name": pool.name}
    if pool.alias:
        entry["alias"] = list(pool.alias)
    entry["template"] = pool.template
    entry["size"] = pool.size
    entry["timeout"] = _minutes(pool.timeout_s)
    if pool.ready_ttl_s is not None:
        entry["ready_ttl"] = _minutes(pool.ready_ttl_s)
    entry["provider"] = pool.provider
    if pool.domain:
        entry["domain"] = pool.domain
    if pool.clone_target:
        entry["clone_target"] = pool.clone_target
    entry["template_ready"] = True  # no template preparation step in vmpool
    return entry


@router.get("/config")
async def get_config(st: State) -> Response:
    def body() -> Response:
        pools = [_public(p) for p in _pools(st).values()]
        return reply(200, {"pool_configuration": pools, "status": {"ok": True}})

    return await run_in_threadpool(body)


# -- operator endpoints ---------------------------------------------------------------------
def _operator(st: ApiState, request: Request) -> str:
    """405 unless experimental_features. With auth on a valid token (401) of an admin (403).

    Returns who acts, for the logs and trails."""
    if not st.config.experimental_features:
        raise Rejected(405)
    token = token_auth(request)
    if token is None:
        return "api"
    auth = st.config.auth
    if auth is None or token.user not in auth.admins:
        raise Rejected(403, message="only an admin may change pools at runtime")
    return f"api:{token.user}"


def _mapping(raw: bytes) -> Mapping[str, Any]:
    """The body as a JSON object: vmpooler's 400 for bad JSON, 404 for ``null``."""
    data = parse_json_body(raw)
    if data is None:
        raise Rejected(404)
    if not isinstance(data, Mapping):
        raise Rejected(400, message="JSON payload must be an object")
    return data


def _size(value: Any) -> str | None:
    """A pool size as vmpooler takes it (an integer or its digits, >= 0), as text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        number = int(value.strip())
    else:
        return None
    return str(number) if 0 <= number <= MAX_COUNT else None


def _template(value: Any, pool: PoolConfig) -> str | None:
    """vmpooler's check of a template name.

    No leading or trailing '/', and a path (with '/') where the configured template is one
    (vSphere's folders). Any other clouds' image names."""
    if not isinstance(value, str) or not _TEMPLATE_RE.fullmatch(value):
        return None
    if value.startswith("/") or value.endswith("/"):
        return None
    if "/" in pool.template and "/" not in value:
        return None
    return value


def _target(value: Any, pool: PoolConfig) -> str | None:
    return value if isinstance(value, str) and _TEMPLATE_RE.fullmatch(value) else None


_CHECKS: Mapping[Setting, tuple[str, Callable[[Any, PoolConfig], str | None]]] = {
    "poolsize": ("not_configured", lambda v, _p: _size(v)),
    "template": ("bad_templates", _template),
    "clone_target": ("bad_templates", _target),
}


def _change(st: ApiState, request: Request, setting: Setting, raw: bytes) -> Response:
    actor = _operator(st, request)
    payload = _mapping(raw)
    field, check = _CHECKS[setting]
    values: dict[str, str] = {}
    bad: list[str] = []
    for name, given in payload.items():
        pool = st.config.pools.get(name)
        value = None if pool is None else check(given, pool)
        if value is None:
            bad.append(name)
        else:
            values[name] = value
    if bad:
        return not_ok(400, **{field: bad})
    op = call_key(request, raw).op(actor)
    changed = set_setting(
        st.store, st.config, setting, values, actor=actor, dispatch=st.batch, op=op
    )
    return reply(201 if changed else 200, {"ok": True})


def _post(setting: Setting) -> Any:
    async def post(request: Request, st: State) -> Response:
        if not st.config.experimental_features:
            return not_ok(405)
        raw = await read_body(request)
        return await run_in_threadpool(_change, st, request, setting, raw)

    return post


router.add_api_route("/config/poolsize", _post("poolsize"), methods=["POST"])
router.add_api_route("/config/pooltemplate", _post("template"), methods=["POST"])
router.add_api_route("/config/clonetarget", _post("clone_target"), methods=["POST"])

_REVERTED_FIELDS: Mapping[Setting, tuple[str, str]] = {
    "poolsize": ("pool_size_before_reset", "pool_size_before_overrides"),
    "template": ("template_before_reset", "template_before_overrides"),
}


def _delete(setting: Setting) -> Any:
    def revert(st: ApiState, request: Request, pool: str) -> Response:
        actor = _operator(st, request)
        if pool not in st.config.pools:
            return not_ok(404)
        op = call_key(request).op(actor)
        out = revert_setting(
            st.store, st.config, setting, pool, actor=actor, dispatch=st.batch, op=op
        )
        now, configured = _REVERTED_FIELDS[setting]
        as_value: Callable[[str], Any] = int if setting == "poolsize" else str
        body = {"ok": True, now: as_value(out.before), configured: as_value(out.configured)}
        return reply(201 if out.changed else 200, body)

    async def delete(pool: str, request: Request, st: State) -> Response:
        return await run_in_threadpool(revert, st, request, pool)

    return delete


router.add_api_route("/config/poolsize/{pool}", _delete("poolsize"), methods=["DELETE"])
router.add_api_route("/config/pooltemplate/{pool}", _delete("template"), methods=["DELETE"])


@router.post("/poolreset")
async def poolreset(request: Request, st: State) -> Response:
    """Replace the ready VMs of each pool named in the body (``{"pool": "1", ...}``)."""
    if not st.config.experimental_features:
        return not_ok(405)
    raw = await read_body(request)

    def reset() -> Response:
        actor = _operator(st, request)
        payload = _mapping(raw)
        bad = [name for name in payload if name not in st.config.pools]
        if bad:
            return not_ok(400, bad_pools=bad)
        op = call_key(request, raw).op(actor)
        reset_pools(st.store, list(payload), actor=actor, dispatch=st.batch, op=op)
        return reply(201, {"ok": True})

    return await run_in_threadpool(reset)

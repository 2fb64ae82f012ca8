"""vmpooler's on-demand requests: POST, GET and DELETE /ondemandvm.

POST takes JSON or vmfloaty's path form (/ondemandvm/<template>). The API writes no
request or VM state itself: POST goes through ``Store.create_request`` (the record,
its queue entries and its place in the provision work set in one atomic unit), sent
with the other creates of the event loop's turn and one lane check of the fleet's
batching dispatcher in one pipeline awaited on the loop (vmpool.api.create_batch).
GET reads in one script call awaited on the loop, sent with the turn's other GETs
(vmpool.api.turn_batch). DELETE goes through
``Store.delete_request``. A refusal writes nothing. Idempotency keys:
vmpool.api.idempotency.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

import redis
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import ApiState, State, Token, api_state, authenticate
from vmpool.api.errors import redis_refusal
from vmpool.api.idempotency import call_key, keyed
from vmpool.api.metrics import ApiMetrics
from vmpool.api.parsing import (
    Ondemand,
    ondemand_from_json,
    ondemand_from_path,
    parse_json_body,
    read_body,
)
from vmpool.api.quotas import place_fields, request_priority
from vmpool.api.responses import created_reply, hot_reply, not_ok, reply
from vmpool.config import Config
from vmpool.ids import InvalidIdentifier, Job, new_request_id, validate_request_id
from vmpool.lifecycle.plan import RequestRejected, plan_slots
from vmpool.state import reads
from vmpool.state.durability import confirm, confirm_async
from vmpool.state.lua import ScriptPipeline
from vmpool.state.ops import Op
from vmpool.state.quotas import Place, Standing
from vmpool.state.records import Outcome, RequestRecord, Slot
from vmpool.state.store import Store
from vmpool.state.tokens import TokenInfo

__all__ = ["HOT", "create_request", "delete_request", "request_status", "router"]

log = logging.getLogger(__name__)

DELETED_MESSAGE = "The request has been deleted"

router = APIRouter()

# The paths of the routes below that are also hot routes (HOT, at the end).
ONDEMAND = "/ondemandvm"
ONDEMAND_FORM = "/ondemandvm/{template}"
ONDEMAND_STATUS = "/ondemandvm/{request_id}"


# The two POST routes take the request alone and do what dependencies did (the state,
# the vmpooler counter, then auth: that order) inline: FastAPI's dependency solving and
# the thread hop of the sync auth dependency cost more than the rest of a POST's Python
# when auth is off (profiled: docs/benchmarks.md).
@router.post(ONDEMAND)
async def post_ondemand(request: Request) -> Response:
    st = api_state(request)
    st.metrics.count_vm_call("post", "ondemand", "requestid")
    token = None if st.config.auth is None else await authenticate(request, st)
    data = parse_json_body(await read_body(request))
    try:
        wanted = ondemand_from_json(data, st.config)
    except RequestRejected as rejected:
        return refused(st.metrics, rejected, {})
    return await create_request(st, keyed(wanted, request, token), token)


# vmpooler counts this route under the (misnamed) delete.ondemand.template.
@router.post(ONDEMAND_FORM)
async def post_ondemand_path(request: Request) -> Response:
    st = api_state(request)
    st.metrics.count_vm_call("delete", "ondemand", "template")
    token = await authenticate(request, st)
    await read_body(request)  # ignored, but bounded
    wanted = ondemand_from_path(request.path_params["template"])
    return await create_request(st, keyed(wanted, request, token), token)


# As the POST routes: the request alone, the counter inline. The reads awaited on the
# loop in one round trip.
@router.get(ONDEMAND_STATUS)
async def get_ondemand(request: Request) -> Response:
    st = api_state(request)
    st.metrics.count_vm_call("get", "ondemand", "request")
    return await request_status(st, request.path_params["request_id"])


@router.delete(ONDEMAND_STATUS)
async def delete_ondemand(request_id: str, request: Request, st: State, token: Token) -> Response:
    # Counted after the auth check, as vmpooler counts it.
    st.metrics.count_vm_call("delete", "ondemand", "request")
    op = call_key(request).op(token.user if token else "")
    return await run_in_threadpool(delete_request, st.store, request_id, token, op)


def _weighed(config: Config, counts: Mapping[str, int]) -> bool:
    """Whether backend weights can pick among pools for this request.

    They can when weights are configured and a name asked for has several pools.
    """
    return bool(config.backend_weight) and any(len(config.resolve_name(n)) > 1 for n in counts)


async def _weighing(st: ApiState) -> Config:
    """The config with the pools' runtime clone targets (POST /config/clonetarget).

    Backend weights are looked up by them. Read only when weights are configured.
    """
    raw = await st.clients.aio.get().hgetall(st.keys.pool_override("clone_target"))
    targets = {str(p): str(t) for p, t in raw.items() if p in st.config.pools}
    if not targets:
        return st.config
    pools = st.config.pools
    targeted = {
        n: replace(p, clone_target=targets.get(n, p.clone_target)) for n, p in pools.items()
    }
    return replace(st.config, pools=targeted)


async def create_request(st: ApiState, wanted: Ondemand, token: TokenInfo | None) -> Response:
    """Plan ``wanted`` against the config, create the request, start its provisioning."""
    try:
        if _weighed(st.config, wanted.counts):
            slots: Sequence[Slot] = plan_slots(await _weighing(st), wanted.counts, st.rng)
        else:
            slots = st.plans.slots(wanted.counts)
    except RequestRejected as rejected:
        return refused(st.metrics, rejected, wanted.counts)
    user = token.user if token else ""
    priority = request_priority(st.config, user, wanted.priority, sum(s.count for s in slots))
    rid = wanted.request_id or wanted.keyed_id or new_request_id()
    try:
        outcome = await _create_batched(st, rid, slots, token, priority)
        if outcome.code == "exists":
            # An id that exists is acknowledged (201 or 409) only once durable. An id the
            # API made up (uuid4, or the key's) can only exist if this very create ran
            # before: redis-py, or the client with its key, sent it again.
            await confirm_async(st.clients.aio.get())
            if wanted.request_id is None:
                outcome = Outcome(True, "created")
    except redis.RedisError as exc:
        # Not acknowledged. It may exist all the same: the id lets the client look.
        refusal = redis_refusal(exc, request_id=rid)
        if refusal is None:
            raise
        log.warning("request %s: create not acknowledged (%s)", rid, exc)
        return refusal
    if not outcome.ok:
        if outcome.code == "exists":
            st.metrics.generate.labels("duplicaterequests").inc()
            return not_ok(
                409, request_id=rid, message=f"request_id '{rid}' has already been created"
            )
        log.warning("create_request %s refused: %s", rid, outcome.code)
        return not_ok(400, message=f"request refused: {outcome.code}")
    st.metrics.generated.inc()
    if log.isEnabledFor(logging.INFO):  # the line is built only when it is written
        log.info(
            "request %s created: %s%s",
            rid,
            ",".join(f"{s.alias}:{s.pool}:{s.count}" for s in slots),
            f" for {token.user}" if token else "",
        )
    return created_reply(rid)


async def _create_batched(
    st: ApiState, rid: str, slots: Sequence[Slot], token: TokenInfo | None, priority: int
) -> Outcome:
    """Create the request and start its provisioning in this loop turn's batch.

    create_request.lua adds the new id to the provision work set in its own unit; the
    batch's one pipeline runs it with the turn's other creates, then the lane check, and
    confirms them (vmpool.api.create_batch).
    """
    user, sha = (token.user, token.sha256) if token else ("", "")
    settings = st.request_settings(authenticated=token is not None, priority=priority)
    pipe = ScriptPipeline()
    refused = st.store.create_request(
        rid,
        slots,
        settings,
        actor="api",
        token_user=user,
        token_hash=sha,
        work_set=st.keys.work_set(Job.PROVISION_REQUEST),
        clone_limit=st.config.ondemand_clone_limit,
        pipeline=pipe,
    )
    if refused is not None:
        return refused
    reply = await st.creates.submit(pipe.calls[0])
    if isinstance(reply, Exception):
        raise reply
    return Outcome.from_reply(reply)


def refused(metrics: ApiMetrics, rejected: RequestRejected, counts: Mapping[str, int]) -> Response:
    """vmpooler's answer to a plan refused, counted as vmpooler counts them.

    404 naming unknown names, else 403 (a count over the maximum).
    """
    if rejected.bad_templates:
        for _ in rejected.bad_templates:
            metrics.fail.labels("invalid", "unknown").inc()
        return not_ok(404, bad_templates=list(rejected.bad_templates))
    for name, count in counts.items():
        if rejected.maximum is not None and count > rejected.maximum:
            metrics.fail.labels("toomanyrequests", name).inc()
    return not_ok(403, message=str(rejected))


# The failure reason of a request failed by its TTL (_prelude.lua's expire_or_fulfil),
# and vmpooler's message for every failed request.
TTL_FAILURE = "The request failed to provision instances within the configured ondemand_request_ttl"


def _not_found(rid: str) -> Response:
    return not_ok(404, message=f"no request found for request_id '{rid}'")


async def request_status(st: ApiState, rid: str) -> Response:
    """GET /ondemandvm/<id> awaited on the loop.

    One script call reads the record, its VM set, its VMs once it is ready and, while it
    is pending, its place in line (one snapshot: scripts/request_place.lua), sent with
    the other GETs of the loop's turn in one round trip, which confirms what Redis
    holds, so all it read (vmpool.api.turn_batch, vmpool.state.durability): every
    answer, "not found" too (not from a stale or demoted primary), comes from that one
    round trip.
    """
    if not _well_formed(rid):
        return _not_found(rid)
    call = st.store.quotas.place_call(rid, st.config.ondemand_clone_limit)
    reply = await st.status_reads.submit(call)
    if isinstance(reply, Exception):
        raise reply
    standing = Standing.from_reply(reply)
    if standing.record is None:
        return _not_found(rid)
    hostnames = reads.hostnames_by_alias(standing.vms)
    return status_reply(rid, standing.record, hostnames, standing.place)


def _well_formed(rid: str) -> bool:
    try:
        validate_request_id(rid)
    except InvalidIdentifier:
        return False
    return True


def status_reply(
    rid: str,
    record: RequestRecord,
    hostnames: Mapping[str, list[str]],
    place: Place | None = None,
) -> Response:
    """The answer to GET /ondemandvm/<id>.

    202 while pending, with where it stands (``place``: its position and ETA, vmpool's
    fields beside vmpooler's). 200 once ready (with ``hostnames`` by alias), failed or
    deleted.
    """
    body: dict[str, Any] = {"ok": True, "request_id": rid, "ready": False}
    if record.status == "ready":
        body["ready"] = True
        for slot in record.slots:
            body.setdefault(slot.alias, {"hostname": list(hostnames.get(slot.alias, []))})
        return hot_reply(200, body)
    if record.status == "failed":
        why = record.failure_reason
        if not why or why.startswith(TTL_FAILURE):
            body["message"] = f"{TTL_FAILURE} '{_ttl_minutes(record)}'"  # vmpooler's words
        else:  # it failed before its TTL: not the TTL's fault
            body["message"] = f"The request failed: {why}"
        if why and why != TTL_FAILURE:
            # a vmpool extension: the last real cause (the cloud's words)
            body["reason"] = why
        return hot_reply(200, body)
    if record.status == "deleted":
        body["message"] = DELETED_MESSAGE
        return hot_reply(200, body)
    body.update(_progress(record))
    body.update(place_fields(place))
    return hot_reply(202, body)


def _progress(record: RequestRecord) -> dict[str, dict[str, str]]:
    """A pending request's VMs ready and still pending, per alias asked for."""
    per_alias: dict[str, list[int]] = {}
    for slot in record.slots:
        counts = per_alias.setdefault(slot.alias, [0, 0])
        counts[0] += slot.have
        counts[1] += max(0, slot.want - slot.have)
    return {
        alias: {"ready": str(ready), "pending": str(pending)}
        for alias, (ready, pending) in per_alias.items()
    }


def _ttl_minutes(record: RequestRecord) -> str:
    """The request's TTL as vmpooler prints its config value (minutes, e.g. '5', '0.5')."""
    minutes = round((record.deadline - record.created) / 60.0, 4)
    return str(int(minutes)) if float(minutes).is_integer() else str(minutes)


def delete_request(store: Store, rid: str, token: TokenInfo | None, op: Op | None) -> Response:
    """DELETE /ondemandvm/<id>: the request and its VMs released for destruction."""
    try:
        validate_request_id(rid)
    except InvalidIdentifier:
        return _not_found(rid)
    outcome = store.delete_request(rid, actor="api", user=token.user if token else "", op=op)
    if outcome.code in ("request_failed", "already_deleted"):
        confirm(store.redis)  # a state read, acknowledged: durable first
    if outcome.ok or outcome.code == "request_failed":
        if outcome.ok:
            log.info("request %s deleted%s", rid, f" by {token.user}" if token else "")
        return reply(200, {"ok": True})
    if outcome.code == "already_deleted":
        return reply(200, {"ok": True, "message": "the request has already been deleted"})
    if outcome.code == "no_request":
        return _not_found(rid)
    if outcome.code == "forbidden":
        return not_ok(403, message=f"request_id '{rid}' belongs to another user")
    log.warning("delete of %s refused: %s", rid, outcome.code)
    return not_ok(409, message=f"request_id '{rid}' cannot be deleted: {outcome.code}")


# (method, path, endpoint) of this router's hot routes: the app's entry layer serves them
# without the framework's stack (vmpool.api.hot_routes).
HOT: Final = (
    ("POST", ONDEMAND, post_ondemand),
    ("POST", ONDEMAND_FORM, post_ondemand_path),
    ("GET", ONDEMAND_STATUS, get_ondemand),
)

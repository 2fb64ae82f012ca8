"""The HTTP API: vmpooler 3.9's v3 on-demand endpoints, tokens, status, health, metrics.

``create_app(config, redis)`` builds one FastAPI app; everything it needs lives on
``app.state`` (no module-level state), so several apps can share a process.

The API writes no request or VM state itself: POST goes through
``Store.create_request`` (the record and its queue entries in one atomic unit) and then
enqueues a ``provision`` job; DELETE goes through ``Store.delete_request``. The only
keys it writes directly are tokens, the rate-limit counters and a token's ``last`` use.

Responses are pretty-printed JSON with the key order of vmpooler (its specs compare
``JSON.pretty_generate`` output byte for byte); errors and unknown routes included.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from vmpool.api.metrics import ApiMetrics, RedisStateCollector
from vmpool.config import Config
from vmpool.ids import InvalidIdentifier, validate_request_id
from vmpool.lifecycle.plan import RequestRejected, plan_slots
from vmpool.state.keys import Keys
from vmpool.state.store import RequestRecord, RequestSettings, Store
from vmpool.state.tokens import TokenInfo, TokenStore, check_rate_limit, verify_password

__all__ = [
    "MAX_BODY_BYTES",
    "EnqueueFn",
    "RedisClients",
    "app_from_env",
    "create_app",
]

log = logging.getLogger("vmpool.api.app")

API = "/api/v3"
MAX_BODY_BYTES = 64 * 1024
MAX_NAMES = 100  # distinct names in one request
DELETED_TTL_MESSAGE = "The request has been deleted"
REALM = 'Basic realm="Authentication required"'
_DIGITS = re.compile(r"^[0-9]+$")

EnqueueFn = Callable[[redis.Redis, str, str], Any]


@dataclass(frozen=True)
class RedisClients:
    """``text`` decodes responses (the store, tokens); ``raw`` does not (RQ needs that)."""

    text: redis.Redis
    raw: redis.Redis

    @classmethod
    def from_url(cls, url: str) -> RedisClients:
        return cls(
            redis.Redis.from_url(url, decode_responses=True, health_check_interval=30),
            redis.Redis.from_url(url, decode_responses=False, health_check_interval=30),
        )


# --------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------


class PrettyJSON(Response):
    """JSON as vmpooler renders it: ``JSON.pretty_generate`` (two-space indent)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, indent=2, ensure_ascii=False)
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate echoed from hostile input
            return json.dumps(content, indent=2, ensure_ascii=True).encode("ascii")


def reply(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    return PrettyJSON(dict(body), status_code=status, headers=dict(headers or {}))


def not_ok(status: int, **fields: Any) -> Response:
    return reply(status, {"ok": False, **fields})


class BodyTooLarge(Exception):
    pass


class TrailingSlash:
    """vmpooler's routes end in ``/?``: serve ``/x/`` as ``/x`` (no redirect)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if len(path) > 1 and path.endswith("/"):
                scope = dict(scope)
                scope["path"] = path.rstrip("/") or "/"
                raw = scope.get("raw_path")
                if isinstance(raw, bytes):
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise BodyTooLarge
        except ValueError:
            pass
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------


class Rejected(Exception):
    def __init__(self, response: Response) -> None:
        super().__init__("rejected")
        self.response = response


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json_body(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
        return json.loads(text, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Rejected(not_ok(400, message="JSON payload could not be parsed")) from None


def parse_count(name: str, value: Any, maximum: int) -> int:
    """A count as vmpooler's clients send it: ``n`` or ``"n"``; a positive integer."""
    bad = Rejected(not_ok(400, message=f"invalid count for '{name}': must be a positive integer"))
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        count = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise bad
        count = int(value) if abs(value) < 1e18 else (maximum + 1 if value > 0 else -1)
    elif isinstance(value, str):
        text = value.strip()
        if not _DIGITS.match(text):
            raise bad
        count = int(text) if len(text) <= 18 else maximum + 1
    else:
        raise bad
    if count < 1:
        raise bad
    return count


# --------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------


@dataclass
class ApiState:
    config: Config
    clients: RedisClients
    keys: Keys
    store: Store
    tokens: TokenStore
    metrics: ApiMetrics
    enqueue: EnqueueFn | None
    rng: random.Random
    started: float


def _default_enqueue(conn: redis.Redis, queue: str, request_id: str) -> Any:
    from workers.queues import enqueue  # the fleet's module; imported when first needed

    return enqueue(conn, queue, request_id)


def create_app(
    config: Config,
    redis_url_or_clients: str | RedisClients,
    *,
    enqueue: EnqueueFn | None = _default_enqueue,
    rng: random.Random | None = None,
) -> FastAPI:
    """The API app for ``config`` over the Redis at ``redis_url_or_clients``.

    ``enqueue(conn, queue, request_id)`` puts a job on RQ (``workers.queues.enqueue`` by
    default); ``None`` skips enqueuing (the periodic provision sweep finds new requests).
    """
    clients = (
        RedisClients.from_url(redis_url_or_clients)
        if isinstance(redis_url_or_clients, str)
        else redis_url_or_clients
    )
    keys = Keys(config.key_prefix)
    store = Store(clients.text, keys)
    metrics = ApiMetrics()
    metrics.registry.register(RedisStateCollector(store, clients.raw, config.pools))
    app = FastAPI(
        title="vmpool",
        description="vmpooler v3 compatible on-demand VM API",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    st = ApiState(
        config=config,
        clients=clients,
        keys=keys,
        store=store,
        tokens=TokenStore(clients.text, keys),
        metrics=metrics,
        enqueue=enqueue,
        rng=rng or random.SystemRandom(),
        started=time.monotonic(),
    )
    app.state.vmpool = st
    _install_handlers(app, st)
    _install_routes(app, st)
    app.add_middleware(_Observe, state=st)
    wrapped_init = app.build_middleware_stack

    def build() -> ASGIApp:
        return TrailingSlash(wrapped_init())

    app.build_middleware_stack = build  # type: ignore[method-assign]
    return app


class _Observe:
    """Counts responses and latency per route template; turns a Redis outage into 503."""

    def __init__(self, app: ASGIApp, state: ApiState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            m = self.state.metrics
            m.responses.labels(template, method, str(status["code"])).inc()
            m.latency.labels(template, method).observe(time.perf_counter() - start)


def _install_handlers(app: FastAPI, st: ApiState) -> None:
    async def http_error(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 500)
        if code in (404, 405):
            # Sinatra has no "method not allowed": a route that does not match is a 404.
            return not_ok(404)
        if code == 413:
            return not_ok(413, message=f"request body exceeds {MAX_BODY_BYTES} bytes")
        if 400 <= code < 500:
            return not_ok(code)
        return not_ok(code, message="internal error")

    async def validation_error(request: Request, exc: Exception) -> Response:
        return not_ok(400, message="invalid request")

    async def too_large(request: Request, exc: Exception) -> Response:
        return not_ok(413, message=f"request body exceeds {MAX_BODY_BYTES} bytes")

    async def rejected(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Rejected)
        return exc.response

    async def redis_down(request: Request, exc: Exception) -> Response:
        log.error("Redis error serving %s %s: %s", request.method, request.url.path, exc)
        return not_ok(503, message="the state store is unavailable; retry later")

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error serving %s %s", request.method, request.url.path)
        return not_ok(500, message="internal error")

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(BodyTooLarge, too_large)
    app.add_exception_handler(Rejected, rejected)
    app.add_exception_handler(redis.RedisError, redis_down)
    app.add_exception_handler(Exception, unexpected)


def _ttl_minutes(record: RequestRecord) -> str:
    """The request's TTL as vmpooler prints its config value (minutes, e.g. '5', '0.5')."""
    minutes = round((record.deadline - record.created) / 60.0, 4)
    return str(int(minutes)) if float(minutes).is_integer() else str(minutes)


def _install_routes(app: FastAPI, st: ApiState) -> None:
    config = st.config
    auth = config.auth

    # -- auth helpers -------------------------------------------------------------------
    def unauthorized() -> Rejected:
        return Rejected(reply(401, {"ok": False}, {"WWW-Authenticate": REALM}))

    def need_token(request: Request) -> TokenInfo | None:
        """The caller's token when auth is on (401 otherwise); None when auth is off."""
        if auth is None:
            return None
        token = request.headers.get("x-auth-token", "")
        info = st.tokens.lookup(token) if token else None
        if info is None:
            raise unauthorized()
        if auth.rate_limit_per_minute:
            decision = check_rate_limit(
                st.clients.text, st.keys, info.sha256, auth.rate_limit_per_minute
            )
            if not decision.allowed:
                raise Rejected(
                    reply(
                        429,
                        {
                            "ok": False,
                            "error": "Rate limit exceeded",
                            "limit": decision.limit,
                            "period": decision.period,
                            "retry_after": decision.retry_after,
                        },
                        {"Retry-After": str(decision.retry_after)},
                    )
                )
        return info

    def need_basic(request: Request) -> str:
        """The user of valid HTTP Basic credentials (401 otherwise)."""
        assert auth is not None
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            raise unauthorized()
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise unauthorized() from None
        user, sep, password = decoded.partition(":")
        if not sep or not user:
            raise unauthorized()
        if auth.provider == "dummy":
            ok = user != password  # vmpooler's dummy provider: anyone but user == password
        else:
            stored = auth.users.get(user)
            ok = stored is not None and verify_password(password, stored)
            if stored is None:
                verify_password(password, "sha256$x$" + "0" * 64)  # same work either way
        if not ok:
            log.info("token: failed login for user %r", user)
            raise unauthorized()
        return user

    # -- POST /ondemandvm -----------------------------------------------------------------
    def create(
        payload: Mapping[str, int], request_id: str | None, token: TokenInfo | None
    ) -> Response:
        m = st.metrics
        try:
            slots = plan_slots(config, payload, st.rng)
        except RequestRejected as rejected:
            if rejected.bad_templates:
                for _ in rejected.bad_templates:
                    m.fail.labels("invalid", "unknown").inc()
                return not_ok(404, bad_templates=list(rejected.bad_templates))
            for name, count in payload.items():
                if rejected.maximum is not None and count > rejected.maximum:
                    m.fail.labels("toomanyrequests", name).inc()
            return not_ok(403, message=str(rejected))
        rid = request_id or str(uuid.uuid4())
        outcome = st.store.create_request(
            rid,
            slots,
            RequestSettings.from_config(config, authenticated=token is not None),
            actor="api",
            token_user=token.user if token else "",
            token_hash=token.sha256 if token else "",
        )
        if not outcome.ok:
            if outcome.code == "exists":
                m.generate.labels("duplicaterequests").inc()
                return not_ok(
                    409, request_id=rid, message=f"request_id '{rid}' has already been created"
                )
            log.warning("create_request %s refused: %s", rid, outcome.code)
            return not_ok(400, message=f"request refused: {outcome.code}")
        m.generate.labels("success").inc()
        log.info(
            "request %s created: %s%s",
            rid,
            ",".join(f"{s.alias}:{s.pool}:{s.count}" for s in slots),
            f" for {token.user}" if token else "",
        )
        if st.enqueue is not None:
            try:
                st.enqueue(st.clients.raw, "provision", rid)
            except Exception as exc:  # the request exists; the provision sweep finds it
                m.enqueue_failures.inc()
                log.warning(
                    "request %s: enqueue of provision failed (%s); the sweep will pick it up",
                    rid,
                    type(exc).__name__,
                )
        return reply(201, {"ok": True, "request_id": rid})

    def parse_payload(data: Any) -> tuple[dict[str, int], str | None]:
        if data is None:
            raise Rejected(not_ok(404))  # vmpooler: a `null` body is a 404 {"ok": false}
        if not isinstance(data, dict):
            raise Rejected(not_ok(400, message="JSON payload could not be parsed"))
        request_id: str | None = None
        if "request_id" in data:
            raw_id = data["request_id"]
            try:
                request_id = validate_request_id(raw_id)
            except InvalidIdentifier as exc:
                raise Rejected(not_ok(400, message=str(exc))) from None
        names = [k for k in data if k != "request_id"]
        if len(names) > MAX_NAMES:
            raise Rejected(not_ok(400, message=f"at most {MAX_NAMES} names in one request"))
        invalid = [name for name in names if not config.resolve_name(name)]
        if invalid:
            for _ in invalid:
                st.metrics.fail.labels("invalid", "unknown").inc()
            raise Rejected(not_ok(404, bad_templates=invalid))
        maximum = config.max_ondemand_instances_per_request
        payload = {name: parse_count(name, data[name], maximum) for name in names}
        if not payload:
            raise Rejected(not_ok(400, message="no instances requested"))
        return payload, request_id

    @app.post(API + "/ondemandvm")
    async def post_ondemand(request: Request) -> Response:
        st.metrics.http_requests_vm.labels("post", "ondemand", "requestid").inc()
        token = await run_in_threadpool(need_token, request)
        body = await read_body(request)
        payload, request_id = parse_payload(parse_json_body(body))
        return await run_in_threadpool(create, payload, request_id, token)

    @app.post(API + "/ondemandvm/{template}")
    async def post_ondemand_path(template: str, request: Request) -> Response:
        # vmpooler counts this route under the (misnamed) delete.ondemand.template.
        st.metrics.http_requests_vm.labels("delete", "ondemand", "template").inc()
        token = await run_in_threadpool(need_token, request)
        await read_body(request)  # ignored, but bounded
        payload: dict[str, int] = {}
        for name in template.split("+"):
            payload[name] = payload.get(name, 0) + 1
        if len(payload) > MAX_NAMES:
            return not_ok(400, message=f"at most {MAX_NAMES} names in one request")
        return await run_in_threadpool(create, payload, None, token)

    # -- GET /ondemandvm/<id> --------------------------------------------------------------
    def not_found(rid: str) -> Response:
        return not_ok(404, message=f"no request found for request_id '{rid}'")

    def status_of(rid: str) -> Response:
        try:
            validate_request_id(rid)
        except InvalidIdentifier:
            return not_found(rid)
        record = st.store.get_request(rid)
        if record is None:
            return not_found(rid)
        body: dict[str, Any] = {"ok": True, "request_id": rid, "ready": False}
        if record.status == "ready":
            body["ready"] = True
            hostnames = st.store.hostnames(rid)
            for slot in record.slots:
                body.setdefault(slot.alias, {"hostname": list(hostnames.get(slot.alias, []))})
            return reply(200, body)
        if record.status == "failed":
            body["message"] = (
                "The request failed to provision instances within the configured"
                f" ondemand_request_ttl '{_ttl_minutes(record)}'"
            )
            return reply(200, body)
        if record.status == "deleted":
            body["message"] = DELETED_TTL_MESSAGE
            return reply(200, body)
        per_alias: dict[str, list[int]] = {}
        for slot in record.slots:
            counts = per_alias.setdefault(slot.alias, [0, 0])
            counts[0] += slot.have
            counts[1] += max(0, slot.want - slot.have)
        for alias, (ready, pending) in per_alias.items():
            body[alias] = {"ready": str(ready), "pending": str(pending)}
        return reply(202, body)

    @app.get(API + "/ondemandvm/{request_id}")
    async def get_ondemand(request_id: str) -> Response:
        st.metrics.http_requests_vm.labels("get", "ondemand", "request").inc()
        return await run_in_threadpool(status_of, request_id)

    # -- DELETE /ondemandvm/<id> -----------------------------------------------------------
    def delete(rid: str, token: TokenInfo | None) -> Response:
        try:
            validate_request_id(rid)
        except InvalidIdentifier:
            return not_found(rid)
        outcome = st.store.delete_request(rid, actor="api", user=token.user if token else "")
        if outcome.ok or outcome.code == "request_failed":
            if outcome.ok:
                log.info("request %s deleted%s", rid, f" by {token.user}" if token else "")
            return reply(200, {"ok": True})
        if outcome.code == "already_deleted":
            return reply(200, {"ok": True, "message": "the request has already been deleted"})
        if outcome.code == "no_request":
            return not_found(rid)
        if outcome.code == "forbidden":
            return not_ok(403, message=f"request_id '{rid}' belongs to another user")
        log.warning("delete of %s refused: %s", rid, outcome.code)
        return not_ok(409, message=f"request_id '{rid}' cannot be deleted: {outcome.code}")

    @app.delete(API + "/ondemandvm/{request_id}")
    async def delete_ondemand(request_id: str, request: Request) -> Response:
        token = await run_in_threadpool(need_token, request)
        st.metrics.http_requests_vm.labels("delete", "ondemand", "request").inc()
        return await run_in_threadpool(delete, request_id, token)

    # -- tokens ------------------------------------------------------------------------------
    @app.post(API + "/token")
    async def post_token(request: Request) -> Response:
        if auth is None:
            return not_ok(404)
        user = await run_in_threadpool(need_basic, request)
        token = await run_in_threadpool(st.tokens.create, user)
        log.info("token created for user %r", user)
        return reply(200, {"ok": True, "token": token})

    @app.delete(API + "/token/{token}")
    async def delete_token(token: str, request: Request) -> Response:
        if auth is None:
            return not_ok(404)
        user = await run_in_threadpool(need_basic, request)
        revoked = await run_in_threadpool(lambda: st.tokens.revoke(token, user=user))
        if not revoked:
            return not_ok(404)
        log.info("token revoked by user %r", user)
        return reply(200, {"ok": True})

    # -- status, health, metrics ---------------------------------------------------------
    def status_body() -> dict[str, Any]:
        counts = st.store.pool_counts(config.pools)
        pools: dict[str, Any] = {}
        totals = dict.fromkeys(("pending", "running", "completed"), 0)
        for name, pool in config.pools.items():
            c = counts[name]
            pending = c["reserved"] + c["pending"]
            entry: dict[str, Any] = {
                "ready": 0,
                "running": c["running"],
                "pending": pending,
                "max": pool.size,
                "lastBoot": None,
                "reserved": c["reserved"],
                "booting": c["pending"],
                "completed": c["completed"],
            }
            if pool.alias:
                entry["alias"] = list(pool.alias)
            pools[name] = entry
            totals["pending"] += pending
            totals["running"] += c["running"]
            totals["completed"] += c["completed"]
        queues, workers = _rq_state(st.clients.raw)
        r = st.clients.text
        return {
            "pools": pools,
            "queue": {
                "pending": totals["pending"],
                "ready": 0,
                "running": totals["running"],
                "completed": totals["completed"],
                "total": sum(totals.values()),
            },
            "queues": queues,
            "requests": {
                "open": int(r.zcard(st.keys.open_requests)),
                "provisioning": int(r.zcard(st.keys.provision_queue)),
            },
            "status": {
                "ok": True,
                "message": "Battle station fully armed and operational.",
                "uptime": round(time.monotonic() - st.started, 1),
            },
            "workers": workers,
        }

    @app.get(API + "/status")
    async def get_status() -> Response:
        return reply(200, await run_in_threadpool(status_body))

    @app.get("/healthz")
    async def healthz() -> Response:
        return reply(200, {"ok": True})

    @app.get("/readyz")
    async def readyz() -> Response:
        def ping() -> bool:
            try:
                return bool(st.clients.text.ping())
            except redis.RedisError:
                return False

        if await run_in_threadpool(ping):
            return reply(200, {"ok": True, "redis": "ok"})
        return not_ok(503, redis="unreachable")

    @app.get("/metrics")
    async def metrics() -> Response:
        data = await run_in_threadpool(st.metrics.render)
        return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")


def _rq_state(raw: redis.Redis) -> tuple[dict[str, int], list[dict[str, Any]]]:
    queues: dict[str, int] = {}
    workers: list[dict[str, Any]] = []
    try:
        from rq import Queue, Worker

        for name in queue_names(raw):
            queues[name] = Queue(name, connection=raw).count
        for worker in Worker.all(connection=raw):
            workers.append(
                {
                    "name": worker.name,
                    "state": str(worker.get_state()),
                    "queues": worker.queue_names(),
                }
            )
    except redis.RedisError:
        raise
    except Exception as exc:  # an RQ quirk must not break /status
        log.warning("status: could not read RQ state: %s", exc)
    return queues, sorted(workers, key=lambda w: str(w["name"]))


def queue_names(raw: redis.Redis) -> list[str]:
    """The fleet's RQ queues (``workers.queues.QUEUES``) and any other queue RQ knows."""
    from rq import Queue

    names: list[str] = []
    try:
        from workers.queues import QUEUES

        names.extend(QUEUES)
    except ImportError:
        pass
    for queue in Queue.all(connection=raw):
        if queue.name not in names:
            names.append(queue.name)
    return names


def app_from_env() -> FastAPI:
    """uvicorn factory (``vmpool.api.app:app_from_env``) for ``vmpool api --workers N``:
    the config from ``VMPOOL_CONFIG``, Redis from ``VMPOOL_REDIS_URL`` or the config."""
    from vmpool.config import load_config

    config = load_config()
    url = os.environ.get("VMPOOL_REDIS_URL") or config.redis_url or "redis://127.0.0.1:6379/0"
    return create_app(config, url)

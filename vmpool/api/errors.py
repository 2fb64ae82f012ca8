"""The API's refusals, and the handlers that turn every exception into one JSON reply.

A user never sees a traceback: a refusal raised anywhere (a dependency, the parsing of
a body) carries its status and fields. An HTTP error from routing is vmpooler's
``{"ok": false}``. A Redis outage is a 503 the client can retry, whose message names
the condition (unreachable, out of memory, read-only, a write not confirmed durable);
on a mutating call it names the call's idempotency key (vmpool/api/idempotency.py), so
the client can send the call again with it and learn what it got. An idempotency key
reused for another call is a 422. Anything else is a 500 whose details stay in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from vmpool.api.responses import not_ok, reply
from vmpool.state.ops import op_mismatch
from vmpool.state.redis_health import MESSAGES, classify

__all__ = [
    "IDEMPOTENCY_HEADER",
    "IDEMPOTENCY_STATE",
    "MAX_BODY_BYTES",
    "BodyTooLarge",
    "Rejected",
    "install_error_handlers",
    "keyed_refusal",
    "redis_refusal",
]

log = logging.getLogger(__name__)

# The largest request body the API reads (vmpooler's bodies are a few names and counts).
MAX_BODY_BYTES = 64 * 1024
# The header of a client's idempotency key, and where a mutating call keeps its key
# (request.state) for a 503 to name (vmpool/api/idempotency.py).
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_STATE = "idempotency_key"


class Rejected(Exception):
    """A refusal: the reply is ``{"ok": false, **fields}`` with ``status`` and ``headers``."""

    def __init__(
        self, status: int, headers: Mapping[str, str] | None = None, **fields: Any
    ) -> None:
        super().__init__(f"rejected with {status}")
        self.status = status
        self.headers = dict(headers or {})
        self.fields = fields

    def response(self) -> Response:
        return reply(self.status, {"ok": False, **self.fields}, self.headers)


class BodyTooLarge(Exception):
    """The request body is over :data:`MAX_BODY_BYTES`."""


async def _http_error(request: Request, exc: Exception) -> Response:
    code = getattr(exc, "status_code", 500)
    if code in (404, 405):
        # Sinatra has no "method not allowed": a route that does not match is a 404.
        return not_ok(404)
    if code == 413:
        return not_ok(413, message=f"request body exceeds {MAX_BODY_BYTES} bytes")
    if 400 <= code < 500:
        return not_ok(code)
    return not_ok(code, message="internal error")


async def _validation_error(request: Request, exc: Exception) -> Response:
    return not_ok(400, message="invalid request")


async def _too_large(request: Request, exc: Exception) -> Response:
    return not_ok(413, message=f"request body exceeds {MAX_BODY_BYTES} bytes")


async def _rejected(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Rejected)
    return exc.response()


def redis_refusal(exc: redis.RedisError, **fields: Any) -> Response | None:
    """The 503 for a Redis outage of any kind, its message naming the condition.

    The condition as :mod:`vmpool.state.redis_health` words it ("Redis is out of memory",
    ...). None when ``exc`` is no outage (a bug: the caller lets it become a 500)."""
    condition = classify(exc)
    if condition is None:
        return None
    return not_ok(503, message=f"{MESSAGES[condition]}; retry later", redis=condition, **fields)


async def _redis_down(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, redis.RedisError)
    if op_mismatch(exc):
        return not_ok(422, message=f"this {IDEMPOTENCY_HEADER} was used for another request")
    log.error("Redis error serving %s %s: %s", request.method, request.url.path, exc)
    refusal = keyed_refusal(exc, getattr(request.state, IDEMPOTENCY_STATE, None))
    return not_ok(500, message="internal error") if refusal is None else refusal


def keyed_refusal(exc: redis.RedisError, key: str | None) -> Response | None:
    """:func:`redis_refusal` naming the call's idempotency key (body and header), if any."""
    refusal = redis_refusal(exc, **({} if key is None else {"idempotency_key": key}))
    if refusal is not None and key is not None:
        refusal.headers[IDEMPOTENCY_HEADER] = key
    return refusal


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return not_ok(500, message="internal error")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers above on ``app`` (the most specific class wins)."""
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(BodyTooLarge, _too_large)
    app.add_exception_handler(Rejected, _rejected)
    app.add_exception_handler(redis.RedisError, _redis_down)
    app.add_exception_handler(Exception, _unexpected)

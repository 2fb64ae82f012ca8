"""vmpooler's token endpoints.

POST /token mints one for the HTTP Basic user, GET /token lists that user's, DELETE
/token/<token> revokes one of them. All are 404 when ``:auth:`` is off. Tokens are
stored hashed, so GET /token names each by its SHA-256. A mint and a revoke are
operations of the call's idempotency key (:mod:`vmpool.api.idempotency`): the minted
token is kept sealed under the key for the repeat, which answers the same token (a
client's key must then be long enough not to be guessed: a UUID)."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import BasicUser, State
from vmpool.api.errors import IDEMPOTENCY_HEADER
from vmpool.api.idempotency import MIN_SEALING_KEY, call_key
from vmpool.api.responses import not_ok, reply

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter()


@router.post("/token")
async def post_token(request: Request, st: State, user: BasicUser) -> Response:
    auth = st.config.auth
    assert auth is not None  # BasicUser answered 404 otherwise
    key = call_key(request)
    if key.given and len(key.key) < MIN_SEALING_KEY:
        return not_ok(
            400,
            message=f"{IDEMPOTENCY_HEADER} of POST /token: {MIN_SEALING_KEY} characters or more",
        )
    minted = await run_in_threadpool(
        partial(
            st.tokens.mint,
            user,
            ttl_s=auth.token_ttl_s,
            max_tokens=auth.max_tokens_per_user,
            seal=partial(key.seal, user),
            op=key.op(user),
        )
    )
    log.info("token created for user %r (%d older dropped)", user, minted.dropped)
    return reply(200, {"ok": True, "token": key.unseal(user, minted.sealed)})


@router.delete("/token/{token}")
async def delete_token(token: str, request: Request, st: State, user: BasicUser) -> Response:
    key = call_key(request)
    revoked = await run_in_threadpool(partial(st.tokens.revoke, token, user=user, op=key.op(user)))
    if not revoked:
        return not_ok(404)
    log.info("token revoked by user %r", user)
    return reply(200, {"ok": True})


@router.get("/token")
async def list_tokens(st: State, user: BasicUser) -> Response:
    """vmpooler's GET /token: ``{"ok": true, "<token>": {"created", "last"}, ...}``.

    Each token is named by its SHA-256 (the token itself is never stored). 404 when the
    user has none."""
    tokens = await run_in_threadpool(st.tokens.of_user, user)
    if not tokens:
        return not_ok(404)
    body: dict[str, Any] = {"ok": True}
    for info in tokens:
        body[info.sha256] = {"created": info.created, "last": info.last or "never"}
    return reply(200, body)

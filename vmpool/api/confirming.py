"""Each HTTP call is one unit of work: its writes are confirmed once, before it answers.

:class:`ConfirmedCalls` runs the whole app, the hot routes' entry layer
(:mod:`vmpool.api.hot_routes`) included, in a unit of work
(:func:`vmpool.state.durability.confirmed_async`). A script call in a handler, awaited on
the loop or run in the thread pool (which is handed the call's context), does not wait on
its own. When the answer starts (``http.response.start``) and something is still
unconfirmed, one PUBLISH and WAIT confirm it through the loop's client; a refusal
replaces the answer with the 503 of a Redis condition, naming the call's idempotency
key as the handlers' own 503s do (nothing of it is acknowledged).
A handler that confirmed in its own round trip (POST /ondemandvm's pipeline, a GET's
confirmed read) leaves nothing to wait for here.
"""

from __future__ import annotations

from typing import Any

import redis
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vmpool.api.deps import LoopClients
from vmpool.api.errors import IDEMPOTENCY_STATE, keyed_refusal
from vmpool.state.durability import confirmed_async, settle_async

__all__ = ["ConfirmedCalls", "install_confirmed_calls"]


class ConfirmedCalls:
    """The app, each HTTP call of it one unit of work (see the module docstring)."""

    def __init__(self, app: ASGIApp, clients: LoopClients) -> None:
        self.app = app
        self.clients = clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = self.clients.get()
        refused = False

        async def confirmed_send(message: Message) -> None:
            nonlocal refused
            if refused:
                return  # the handler's own answer, replaced by the refusal
            if message["type"] == "http.response.start":
                try:
                    await settle_async(client)
                except redis.RedisError as exc:
                    key = scope.get("state", {}).get(IDEMPOTENCY_STATE)
                    answer: Any = keyed_refusal(exc, key)
                    if answer is None:
                        raise
                    refused = True
                    await answer(scope, receive, send)
                    return
            await send(message)

        try:
            async with confirmed_async(client):
                await self.app(scope, receive, confirmed_send)
        except redis.RedisError:
            if not refused:
                raise
            # The refusal is the answer: the unit's end met what its start met, and
            # nothing of the call was acknowledged.


def install_confirmed_calls(app: FastAPI, clients: LoopClients) -> None:
    """:class:`ConfirmedCalls` around ``app``'s whole built stack, the entry layer and its
    hot routes included: installed last, so it is the outermost layer."""
    build_stack = app.build_middleware_stack

    def build() -> ASGIApp:
        return ConfirmedCalls(build_stack(), clients)

    app.build_middleware_stack = build  # type: ignore[method-assign]

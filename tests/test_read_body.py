"""A POST's body as the API reads it (vmpool/api/parsing.py ``read_body``): every ASGI
message of it, at most the limit, whatever the client claims or sends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import ClientDisconnect, Request

from vmpool.api.errors import BodyTooLarge
from vmpool.api.parsing import read_body


def read(messages: list[dict[str, Any]], limit: int, length: int | None = None) -> bytes:
    """``read_body`` of a request whose receive hands out ``messages`` in order."""
    headers = [] if length is None else [(b"content-length", b"%d" % length)]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    given = iter(messages)

    async def receive() -> dict[str, Any]:
        return next(given)

    return asyncio.run(read_body(Request(scope, receive), limit))


def part(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_several_messages_is_read_whole() -> None:
    """Proves: the messages' bodies joined in order, up to the one without more_body;
    a body in one message is that message's."""
    assert read([part(b'{"a"', True), part(b"", True), part(b": 1}", False)], 100) == b'{"a": 1}'
    assert read([part(b"{}", False)], 100) == b"{}"
    assert read([{"type": "http.request"}], 100) == b""


def test_a_body_over_the_limit_is_refused() -> None:
    """Proves: a body past the limit is refused once its messages pass it (whatever the
    Content-Length said), and a Content-Length past it before any message is read."""
    with pytest.raises(BodyTooLarge):
        read([part(b"x" * 6, True), part(b"x" * 6, False)], 10, length=3)
    with pytest.raises(BodyTooLarge):
        read([], 10, length=11)


def test_a_client_gone_mid_body_is_a_disconnect() -> None:
    """Proves: the server's disconnect message ends the read with Starlette's error."""
    with pytest.raises(ClientDisconnect):
        read([part(b"x", True), {"type": "http.disconnect"}], 100)

"""The hot replies (vmpool/api/responses.py) are what Starlette and the JSON encoder would
send: the same bytes and the same headers, spelt with less of the loop's time."""

from __future__ import annotations

import json

from starlette.responses import Response

from vmpool.api.responses import CompactJSON, created_reply, hot_reply
from vmpool.ids import new_request_id


def test_the_created_reply_is_the_hot_reply_of_its_body() -> None:
    """Proves: POST /ondemandvm's 201, spelt without the encoder, is byte for byte the
    compact JSON of ``{"ok": true, "request_id": id}``, with the same headers, for a
    uuid4 and for the other characters a request id may hold."""
    for rid in (new_request_id(), "ABS_job-42.7", "x"):
        made, encoded = created_reply(rid), hot_reply(201, {"ok": True, "request_id": rid})
        assert made.body == encoded.body
        assert json.loads(made.body) == {"ok": True, "request_id": rid}
        assert (made.status_code, made.raw_headers) == (201, encoded.raw_headers)


def test_a_hot_reply_has_starlettes_headers() -> None:
    """Proves: the compact reply's own two headers are those Starlette's Response makes
    for the same body and media type; given headers, and a status without a body's
    length (204), go Starlette's way."""
    body = {"ok": True, "request_id": "r1"}
    for status in (200, 201, 202):
        ours = hot_reply(status, body)
        theirs = Response(ours.body, status_code=status, media_type="application/json")
        assert ours.raw_headers == theirs.raw_headers
    given = CompactJSON(body, 200, headers={"Retry-After": "5"})
    theirs = Response(given.body, 200, headers={"Retry-After": "5"}, media_type="application/json")
    assert given.raw_headers == theirs.raw_headers
    empty = CompactJSON(None, 204)
    assert empty.raw_headers == Response(empty.body, 204, media_type="application/json").raw_headers

"""Every response the API sends is JSON, keeping the key order the handler built.

Two renderings. Most replies are vmpooler's ``JSON.pretty_generate`` (two-space indent),
which vmpooler's specs compare byte for byte. The hot replies, those a client sends or
polls in a loop (POST /ondemandvm's 201, GET /ondemandvm/<id>, /healthz), are
``JSON.generate``'s compact form: the same JSON to any parser (vmfloaty, vmpooler's
clients, ``curl | jq``), rendered by the C encoder, where an indent takes Python's own
(profiled: docs/benchmarks.md). Errors and unknown routes go through the pretty class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

__all__ = ["CompactJSON", "PrettyJSON", "created_reply", "hot_reply", "not_ok", "reply"]


class PrettyJSON(Response):
    """JSON as vmpooler renders it: ``JSON.pretty_generate`` (two-space indent)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, indent=2, ensure_ascii=False)
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate echoed from hostile input
            return json.dumps(content, indent=2, ensure_ascii=True).encode("ascii")


# Made once: ``json.dumps`` given an argument makes an encoder on every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))
_JSON_TYPE = b"application/json"


class CompactJSON(Response):
    """JSON as Ruby's ``JSON.generate`` renders it: no whitespace, the C encoder."""

    media_type = "application/json"

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        if headers or self.status_code < 200 or self.status_code in (204, 304):
            super().init_headers(headers)
            return
        # Starlette's two, without its search of given headers and media type for them
        length = str(len(self.body)).encode("latin-1")
        self.raw_headers = [(b"content-length", length), (b"content-type", _JSON_TYPE)]

    def render(self, content: Any) -> bytes:
        if isinstance(content, bytes):
            return content  # rendered already (created_reply)
        try:
            return _COMPACT.encode(content).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate echoed from hostile input
            return _COMPACT_ASCII.encode(content).encode("ascii")


def reply(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    """``body`` as pretty JSON with ``status`` (and ``headers``)."""
    return PrettyJSON(dict(body), status_code=status, headers=dict(headers or {}))


def hot_reply(status: int, body: Mapping[str, Any]) -> Response:
    """``body`` as compact JSON with ``status``: a reply clients send or poll for in a loop."""
    return CompactJSON(body, status_code=status)


def created_reply(request_id: str) -> Response:
    """POST /ondemandvm's 201, ``{"ok":true,"request_id":"<id>"}``, as :func:`hot_reply`
    renders it.

    Spelt without the encoder (a request's every POST): a request id is letters, digits,
    '-', '_' and '.' (vmpool.ids, checked before the create), nothing JSON escapes."""
    return CompactJSON(b'{"ok":true,"request_id":"%s"}' % request_id.encode("ascii"), 201)


def not_ok(status: int, **fields: Any) -> Response:
    """vmpooler's refusal: ``{"ok": false, ...fields}``."""
    return reply(status, {"ok": False, **fields})

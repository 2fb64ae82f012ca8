"""Every response the API sends is JSON rendered as vmpooler renders it.

vmpooler's specs compare ``JSON.pretty_generate`` output byte for byte, so the body is
two-space indented and keeps the key order the handler built. Errors and unknown routes
go through the same class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

__all__ = ["PrettyJSON", "not_ok", "reply"]


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
    """``body`` as pretty JSON with ``status`` (and ``headers``)."""
    return PrettyJSON(dict(body), status_code=status, headers=dict(headers or {}))


def not_ok(status: int, **fields: Any) -> Response:
    """vmpooler's refusal: ``{"ok": false, ...fields}``."""
    return reply(status, {"ok": False, **fields})

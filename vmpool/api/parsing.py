"""From an HTTP request to "N VMs of these names": bounded bodies, JSON, counts.

Plain functions, each testable without an app. They raise :class:`Rejected` (vmpooler's
400s, and its 404 for a ``null`` body) and let the plan's ``RequestRejected`` through
for an unknown name: the names are checked once, by :mod:`vmpool.lifecycle.plan`.
The order of the checks is vmpooler's: the body's shape, then the names, then the counts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request

from vmpool.api.errors import MAX_BODY_BYTES, BodyTooLarge, Rejected
from vmpool.config import Config
from vmpool.ids import InvalidIdentifier, validate_request_id
from vmpool.lifecycle.plan import check_names

__all__ = [
    "MAX_NAMES",
    "Ondemand",
    "ondemand_from_json",
    "ondemand_from_path",
    "parse_count",
    "parse_json_body",
    "parse_priority",
    "raw_header",
    "read_body",
]

MAX_NAMES = 100  # distinct names in one request
# Matched whole (fullmatch): '$' alone would also match before a final newline.
_DIGITS = re.compile(r"[0-9]+")
_UNPARSABLE = "JSON payload could not be parsed"


@dataclass(frozen=True)
class Ondemand:
    """What a POST /ondemandvm asks for: name -> count, the client's request id, a priority.

    ``keyed_id``: the id the call's idempotency key names (vmpool/api/idempotency.py),
    taken when the body names none: a repeat of the call finds the request it made."""

    counts: dict[str, int]
    request_id: str | None = None
    keyed_id: str | None = None
    priority: int | None = None  # ABS's "priority" (1 highest, 3 lowest); None: the user's


def raw_header(request: Request, name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower case: the ASGI server lowers names).

    Read from the scope, as Starlette's ``request.headers`` reads it, without building
    that mapping: a POST's hot path reads two headers, each at most once."""
    for key, value in request.scope["headers"]:
        if key == name:
            found: bytes = value
            return found
    return None


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, read up to ``limit`` bytes.

    BodyTooLarge past the limit, whatever the Content-Length claims."""
    length = raw_header(request, b"content-length")
    if length is not None:
        try:
            if int(length) > limit:
                raise BodyTooLarge
        except ValueError:
            pass
    # The ASGI messages read as they come: Starlette's ``stream()`` is an async
    # generator (the loop's hooks and a frame of its own, on every POST).
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return b"".join([*chunks, chunk]) if chunks else chunk
        chunks.append(chunk)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: ``json.loads`` given an argument makes a decoder on every call.
_STRICT_JSON = json.JSONDecoder(parse_constant=_no_constants)


def parse_json_body(body: bytes) -> Any:
    """Strict JSON (no NaN or Infinity) in UTF-8. 400 otherwise."""
    try:
        return _STRICT_JSON.decode(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Rejected(400, message=_UNPARSABLE) from None


def parse_count(name: str, value: Any, maximum: int) -> int:
    """A count as vmpooler's clients send it: ``n`` or ``"n"``. A positive integer.

    A count too large to hold is ``maximum + 1``, so the plan refuses it as over the
    maximum (vmpooler's 403) rather than as malformed."""
    if isinstance(value, bool):
        raise _bad_count(name)
    if isinstance(value, int):
        count = value
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise _bad_count(name)
        count = int(value) if abs(value) < 1e18 else (maximum + 1 if value > 0 else -1)
    elif isinstance(value, str):
        text = value.strip()
        if not _DIGITS.fullmatch(text):
            raise _bad_count(name)
        count = int(text) if len(text) <= 18 else maximum + 1
    else:
        raise _bad_count(name)
    if count < 1:
        raise _bad_count(name)
    return count


def _bad_count(name: str) -> Rejected:
    # made only when raised: an accepted POST builds no refusal body (less Python per POST)
    return Rejected(400, message=f"invalid count for '{name}': must be a positive integer")


def ondemand_from_json(data: Any, config: Config) -> Ondemand:
    """The parsed JSON body of POST /ondemandvm: ``{"<name>": n, ..., "request_id": id}``.

    With ABS's ``"priority": 1|2|3`` (a vmpool extension of vmpooler's body), unless a
    pool or an alias is called ``priority``: then it is that pool's count, as vmpooler
    reads it."""
    if data is None:
        raise Rejected(404)  # vmpooler: a `null` body is a 404 {"ok": false}
    if not isinstance(data, Mapping):
        raise Rejected(400, message=_UNPARSABLE)
    request_id = _request_id(data["request_id"]) if "request_id" in data else None
    # "priority" is ABS's key, unless the config names a pool (or alias) so
    own = [PRIORITY_KEY] if PRIORITY_KEY in data and not config.resolve_name(PRIORITY_KEY) else []
    priority = parse_priority(data[PRIORITY_KEY]) if own else None
    names = [k for k in data if k != "request_id" and k not in own]
    _check_name_count(names)
    check_names(config, names)
    maximum = config.max_ondemand_instances_per_request
    counts = {name: parse_count(name, data[name], maximum) for name in names}
    if not counts:
        raise Rejected(400, message="no instances requested")
    return Ondemand(counts, request_id, priority=priority)


PRIORITY_KEY = "priority"
_PRIORITIES = (1, 2, 3)


def parse_priority(value: Any) -> int:
    """ABS's priority: 1, 2 or 3 (1 is the highest), as a number or a digit string."""
    if isinstance(value, str) and value.strip() in ("1", "2", "3"):
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value in _PRIORITIES:
        return value
    raise Rejected(400, message="priority must be 1, 2 or 3 (1 is the highest)")


def ondemand_from_path(names: str) -> Ondemand:
    """vmfloaty's path form, ``<name>+<name>+...``: a repeated name raises its count.

    The names are checked by the plan, with the counts."""
    counts: dict[str, int] = {}
    for name in names.split("+"):
        counts[name] = counts.get(name, 0) + 1
    _check_name_count(counts)
    return Ondemand(counts)


def _request_id(raw: Any) -> str:
    try:
        return validate_request_id(raw)
    except InvalidIdentifier as exc:
        raise Rejected(400, message=str(exc)) from None


def _check_name_count(names: Sized) -> None:
    if len(names) > MAX_NAMES:
        raise Rejected(400, message=f"at most {MAX_NAMES} names in one request")

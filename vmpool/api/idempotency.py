"""The ``Idempotency-Key`` request header: a mutating call answered once, however often sent.

A client that did not learn the outcome of a mutating call (a timeout, a dropped
connection, a 503 whose write could not be confirmed) sends it again with the same key.
The repeat answers what the first call did and changes nothing (docs/api.md, "Retrying
a call"). The key names the call's store operations (:mod:`vmpool.state.ops`): the
digest of the caller's user, the key and the step (a PUT may make several changes),
recorded with the change in its atomic unit and kept :data:`IDEMPOTENCY_TTL_S`. The
request's fingerprint (method, path, body) is recorded with it: a key reused for
another request is refused with 422 and changes nothing. A call refused (nothing
changed) is not recorded: sent again, it is tried again.

A mutating call sent without the header gets a key made for it, recorded the same way.
A 503 names it (``idempotency_key`` and the header: vmpool/api/errors.py), so that the
client can send the call again with it and learn what it got. vmpooler's clients, which
send no key, see nothing else change.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from dataclasses import dataclass, replace
from typing import Final

from fastapi import Request

from vmpool.api.errors import IDEMPOTENCY_HEADER, IDEMPOTENCY_STATE, Rejected
from vmpool.api.parsing import Ondemand, raw_header
from vmpool.state.ops import Op
from vmpool.state.tokens import TokenInfo

__all__ = ["IDEMPOTENCY_TTL_S", "MIN_SEALING_KEY", "CallKey", "call_key", "keyed"]

# How long a call's reply is kept for its repeat: far beyond a client's retry after a
# timeout or a 503, short enough that the records of a busy API stay small.
IDEMPOTENCY_TTL_S: Final = 3600.0
# A key is a string of visible ASCII (the header's structured-field form, quoted, is
# taken too). Keys that seal a secret (POST /token) must be long enough not to guess.
_KEY_RE: Final = re.compile(r"[\x21-\x7e]{1,255}")
MIN_SEALING_KEY: Final = 16


@dataclass(frozen=True)
class CallKey:
    """A mutating call's idempotency key: the client's (``given``) or one made for it."""

    key: str
    given: bool
    fingerprint: str

    def op(self, user: str, step: str = "") -> Op:
        """The store operation of ``step`` of this call by ``user`` ('' for anonymous)."""
        return Op(f"http:{_digest(user, self.key, step)}", IDEMPOTENCY_TTL_S, self.fingerprint)

    def request_id(self, user: str) -> str | None:
        """The on-demand request id a given key names (a UUID), None for a made-up key.

        POST /ondemandvm creates the request of this id: its repeat finds it.
        """
        return str(uuid.UUID(_digest(user, self.key, "ondemand"))) if self.given else None

    def seal(self, user: str, secret: str) -> str:
        """``secret`` (ASCII, at most 32 bytes) encrypted under this key, as hex.

        A one-time pad drawn from HMAC-SHA256 keyed by the key (never stored: Redis
        holds only its digest), so the sealed text is read only by who sends the key.
        """
        data = secret.encode("ascii")
        pad = self._pad(user)
        if len(data) > len(pad):
            raise ValueError("a sealed secret is at most 32 bytes")
        return bytes(a ^ b for a, b in zip(data, pad, strict=False)).hex()

    def unseal(self, user: str, sealed: str) -> str:
        """The secret :meth:`seal` sealed for ``user``."""
        data = bytes.fromhex(sealed)
        return bytes(a ^ b for a, b in zip(data, self._pad(user), strict=False)).decode("ascii")

    def _pad(self, user: str) -> bytes:
        return hmac.digest(self.key.encode(), f"seal\0{user}".encode(), "sha256")


# The header's name as the ASGI server hands it (lower case).
_HEADER_NAME: Final = IDEMPOTENCY_HEADER.lower().encode("latin-1")


def _digest(*parts: str) -> str:
    joined = "\0".join(parts).encode("utf-8", "surrogateescape")
    return hashlib.sha256(joined).hexdigest()[:32]


def call_key(request: Request, body: bytes = b"") -> CallKey:
    """The call's key (400 for a malformed header), kept for a 503 to name.

    ``body``: the request's body as read (part of the fingerprint).
    """
    raw = request.headers.get(IDEMPOTENCY_HEADER)
    if raw is None:
        key, given = uuid.uuid4().hex, False
    else:
        key, given = raw.strip().removeprefix('"').removesuffix('"'), True
        if not _KEY_RE.fullmatch(key):
            raise Rejected(
                400, message=f"{IDEMPOTENCY_HEADER} must be 1 to 255 visible ASCII characters"
            )
    setattr(request.state, IDEMPOTENCY_STATE, key)
    print_ = _digest(request.method, request.url.path, hashlib.sha256(body).hexdigest())
    return CallKey(key, given, print_)


def keyed(wanted: Ondemand, request: Request, token: TokenInfo | None) -> Ondemand:
    """POST /ondemandvm's ``wanted`` with the request id its idempotency key names.

    Unchanged without the header: nothing more is done on the hot path.
    """
    if raw_header(request, _HEADER_NAME) is None:
        return wanted
    return replace(wanted, keyed_id=call_key(request).request_id(token.user if token else ""))

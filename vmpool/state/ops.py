"""Operation ids: a mutating script call changes the data once, however often it is sent.

redis-py sends a command again after a connection error or a timeout
(:mod:`vmpool.state.connection`). When the first send ran and only its reply was lost or
late, the script would run twice: a checkout of one VM would take two. So every mutating
script call carries an operation id (:class:`Op`), made once per logical call before
its first send: the retry sends the same id. The script's body runs inside
``_once.lua`` (:func:`once_text`), which records the reply under ``Keys.op(id)`` in the
same atomic unit as the change and answers a repeat with it, changing nothing.

Two kinds of id:

- made for the call (:func:`new_op`): kept for the client's retry window
  (:func:`retry_window_s`: what its timeouts let a retry take, at least a minute);
- given by the caller: the API's ``Idempotency-Key`` (vmpool/api/idempotency.py), kept
  for as long as the API promises, with a fingerprint of the HTTP request so that a key
  reused for another request is refused (``OPMISMATCH``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = [
    "MIN_OP_TTL_S",
    "OP_MISMATCH",
    "Op",
    "new_op",
    "once_text",
    "op_mismatch",
    "retry_window_s",
]

# The shortest time an operation's record is kept: far beyond one retry of a client
# with small timeouts (the retry comes within its socket timeout and a reconnect).
MIN_OP_TTL_S: Final = 60.0
# How many socket-plus-connect timeouts a retry may take at most: the timed-out read,
# the backoff, the reconnect and the sentinels asked on the way (three, each bounded
# by the same timeouts), with room to spare.
_RETRY_TIMEOUTS: Final = 10
# The error reply's first word for an id reused for another call (_once.lua).
OP_MISMATCH: Final = "OPMISMATCH"


def op_mismatch(exc: BaseException) -> bool:
    """Whether ``exc`` is _once.lua's refusal of an id reused for another call."""
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(OP_MISMATCH)


@dataclass(frozen=True)
class Op:
    """One logical mutating call: its id, how long its reply is kept, what was asked.

    ``id``: text without spaces (a random id, or a digest of an idempotency key).
    ``fingerprint``: '' for an id made for the call; the digest of what was asked for
    an id a client chose (its repeat must ask the same).
    """

    id: str
    ttl_s: float
    fingerprint: str = ""

    def part(self, name: str) -> Op:
        """The operation of one step of this call (a call making several changes)."""
        return Op(f"{self.id}:{name}", self.ttl_s, self.fingerprint)

    def argv(self, keys: Keys) -> list[str | int]:
        """The three arguments _once.lua takes from the end of ARGV."""
        return [keys.op(self.id), max(1, round(self.ttl_s * 1000)), self.fingerprint]


def new_op(ttl_s: float) -> Op:
    """An operation id made for one call (128 random bits), kept ``ttl_s`` seconds."""
    return Op(os.urandom(16).hex(), ttl_s)


def retry_window_s(client: redis.Redis) -> float:
    """How long a retry of ``client``'s call may come after its first send, at most.

    Ten times its socket timeout plus its connect timeout (the connection pool's
    settings), and never under :data:`MIN_OP_TTL_S`. A client without timeouts (a
    test's plain client) gets the minimum: it retries at once or not at all.
    """
    kwargs = getattr(client.connection_pool, "connection_kwargs", {})
    timeouts = sum(float(kwargs.get(k) or 0) for k in ("socket_timeout", "socket_connect_timeout"))
    return max(MIN_OP_TTL_S, _RETRY_TIMEOUTS * timeouts)


def once_text(body: str) -> str:
    """``body`` (a script's text, read by :func:`~vmpool.state.lua.read_script`) made
    idempotent: _once.lua, then the body as a function it calls once per operation id.

    The body keeps its meaning: its top-level ``return`` ends the function, its locals
    are the function's. A call of the result appends :meth:`Op.argv` to its ARGV.
    """
    once = read_script("vmpool.state.scripts", "_once.lua")
    return f"{once}\nlocal function script_body()\n{body}\nend\nreturn once(script_body)\n"

"""Script calls written straight to one connection's socket, their replies read as they come.

The API's hot batches (:mod:`vmpool.api.turn_batch`) send one round trip per turn of the
event loop. Through redis-py's asyncio client a round trip costs the API's CPU more than
its calls do: a pooled connection taken and given back under a lock, a task for the send
(``asyncio.wait_for``), a stream reader woken per read and a coroutine per reply, and
the batch's own task around them. A :class:`DirectPipeline` writes a batch in one call
on a connection of its own and hands the batch its replies from the callback that reads
them: no task, no lock (measured: docs/benchmarks.md, "API").

The connection is one the client's pool makes (redis-py opens it: the server, or the
primary it follows, the handshake, TLS, keepalive), then taken over for this use only.
It serves the plain case. Otherwise the batch goes the standard way,
:func:`vmpool.state.lua.run_pipelined_async` (its retry, its script load, its pooled
connections), and the direct connection is dropped, to be opened again by a later batch:

- it is not open (a loop's first batches), the primary is named elsewhere now, or it
  idled past the health-check interval;
- it was lost with the batch unanswered, or the replies were overdue (the socket
  timeout): the batch is sent again, as redis-py's retry sends a round trip again (each
  hot script is idempotent under a retry: a create's id, a read). After an overdue
  batch, without the standard path's own retry, so a frozen server costs two socket
  timeouts, as it did;
- a call answered NOSCRIPT (a restart, SCRIPT FLUSH) runs again alone, as the standard
  path runs it; a READONLY reply (a demoted server) stays in its place, as the standard
  path leaves it, and the connection is dropped.

The replies are the standard path's: each call's reply or its error in place, the
batch's confirmation (:mod:`vmpool.state.durability`) checked after them, in a context of
the batch's own (no caller's unit of work).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.exceptions import NoScriptError, ReadOnlyError

from vmpool.state.connection import one_try
from vmpool.state.durability import Durability
from vmpool.state.lua import (
    ScriptCall,
    checked_replies,
    durability_of,
    pipelined_commands,
    run_pipelined_async,
)

__all__ = ["DirectConnection", "DirectPipeline", "Replied"]

log = logging.getLogger(__name__)

# What a batch's owner is called with: the calls' replies (errors in place), or the
# batch's error (Redis unreachable, the confirmation refused).
Replied = Callable[[list[Any] | Exception], None]


@dataclass
class _Sent:
    """A batch written, waiting for its ``count`` replies."""

    count: int
    done: Callable[[list[Any] | None], None]  # None: lost (the connection closed or overdue)
    timer: asyncio.TimerHandle | None
    replies: list[Any] = field(default_factory=list)


class DirectConnection(asyncio.Protocol):
    """One connection opened by redis-py, then read and written here only.

    Batches are written whole; replies are parsed as they arrive and each batch is handed
    its own, in the order sent. A batch overdue closes it, and each batch still waiting
    is told it is lost (``done(None)``), as when the connection is lost.
    """

    def __init__(self, opened: Any, reader: Any) -> None:
        self.opened = opened  # redis-py's connection: its stream writer owns the socket
        self.reader = reader  # its hiredis reader: the connection's decoding and error classes
        self.timeout: float | None = opened.socket_timeout
        self.address = (getattr(opened, "host", None), getattr(opened, "port", None))
        self.transport: asyncio.WriteTransport | None = None
        self.sent: deque[_Sent] = deque()
        self.last_used = time.monotonic()
        self.overdue = False

    @classmethod
    async def open(cls, client: aredis.Redis) -> DirectConnection | None:
        """A connection of ``client``'s pool, opened and taken over; None where redis-py
        does not read it with hiredis, or keeps its stream and reader under other names
        (a redis-py not the locked one): then every batch goes the standard way."""
        opened = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        await opened.connect()
        parser = getattr(opened, "_parser", None)
        reader = getattr(parser, "_reader", None)
        writer = getattr(opened, "_writer", None)
        if not isinstance(parser, _AsyncHiredisParser) or reader is None or writer is None:
            await opened.disconnect()
            return None
        direct = cls(opened, reader)
        direct.transport = writer.transport
        writer.transport.set_protocol(direct)
        return direct

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, packed: Sequence[bytes], count: int, done: Callable[..., None]) -> None:
        """Write ``packed`` (``count`` commands); ``done`` gets their replies, or None."""
        assert self.transport is not None
        timer = None
        if self.timeout:
            timer = asyncio.get_running_loop().call_later(self.timeout, self._overdue)
        self.sent.append(_Sent(count, done, timer))
        self.transport.writelines(packed)
        self.last_used = time.monotonic()

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        sent = self.sent
        while sent:
            head = sent[0]
            while len(head.replies) < head.count:
                reply = self.reader.gets()
                if reply is NOT_ENOUGH_DATA:
                    return
                head.replies.append(reply)
            sent.popleft()
            if head.timer is not None:
                head.timer.cancel()
            head.done(head.replies)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        while self.sent:
            lost = self.sent.popleft()
            if lost.timer is not None:
                lost.timer.cancel()
            lost.done(None)

    def _overdue(self) -> None:
        self.overdue = True
        self.close()

    def close(self) -> None:
        """Close the socket now: each batch waiting is lost (``done(None)``)."""
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows, on the loop


class DirectPipeline:
    """Batches of script calls on ``client``'s event loop, direct when it can be (see the
    module docstring). One per asyncio client, so one per loop."""

    def __init__(self, client: aredis.Redis) -> None:
        self.client = client
        self.direct: DirectConnection | None = None
        self._opening = False
        self._shut = False  # closed for good: no connection opened again
        self._running: set[asyncio.Task[None]] = set()  # held until done

    def run(self, calls: Sequence[ScriptCall], done: Replied) -> None:
        """Run ``calls`` in one round trip; ``done`` is called with what
        :func:`~vmpool.state.lua.run_pipelined_async` would return, or its error."""
        contextvars.Context().run(self._run, calls, done)

    def _run(self, calls: Sequence[ScriptCall], done: Replied) -> None:
        direct = self._usable()
        if direct is None:
            self._standard(calls, done, reopen=True)
            return
        commands, confirmed = pipelined_commands(self.client, calls, durability_of(self.client))

        def replied(replies: list[Any] | None) -> None:
            if replies is None:  # lost: sent again, once more only if it was overdue
                self._standard(calls, done, reopen=False, one=direct.overdue)
            else:
                contextvars.Context().run(self._replied, calls, replies, confirmed, done)

        direct.send(_packed(direct.opened, commands), len(commands), replied)

    def _replied(
        self,
        calls: Sequence[ScriptCall],
        replies: list[Any],
        confirmed: Durability | None,
        done: Replied,
    ) -> None:
        """Hand ``done`` the calls' replies: confirmed, and NOSCRIPT calls run again."""
        if any(isinstance(reply, ReadOnlyError) for reply in replies):
            self.close()  # a demoted server: the next batch goes the standard way
        try:
            mine = checked_replies(replies, len(calls), confirmed)
        except Exception as exc:
            _hand(done, exc)
            return
        if any(isinstance(reply, NoScriptError) for reply in mine):
            self.start(self._rerun_missing(calls, mine, done))
        else:
            _hand(done, mine)

    async def _rerun_missing(
        self, calls: Sequence[ScriptCall], replies: list[Any], done: Replied
    ) -> None:
        """The calls answered NOSCRIPT, each run again the standard way (which loads it)."""
        try:
            for i, reply in enumerate(replies):
                if isinstance(reply, NoScriptError):
                    replies[i] = (await run_pipelined_async(self.client, [calls[i]]))[0]
        except Exception as exc:
            _hand(done, exc)
            return
        _hand(done, replies)

    def _standard(
        self, calls: Sequence[ScriptCall], done: Replied, reopen: bool, one: bool = False
    ) -> None:
        """Run ``calls`` the standard way (``one``: without its retry); then, with
        ``reopen``, open the direct connection if none is open or opening."""

        async def standard() -> None:
            try:
                if one:
                    with one_try():
                        replies = await run_pipelined_async(self.client, calls)
                else:
                    replies = await run_pipelined_async(self.client, calls)
            except Exception as exc:
                _hand(done, exc)
                return
            _hand(done, replies)
            if reopen:
                await self.connect()

        self.start(standard())

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` on the loop in a task of its own context (no caller's unit of
        work), held until done."""
        task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _usable(self) -> DirectConnection | None:
        """The direct connection if a batch may go on it now; else None (dropped if open)."""
        direct = self.direct
        if direct is None or not direct.is_open:
            return None
        opened = direct.opened
        named = getattr(opened, "named_primary", None)
        moved = named is not None and named() not in (None, direct.address)
        interval = opened.health_check_interval
        idle = interval and time.monotonic() - direct.last_used > interval and not direct.sent
        if moved or idle:
            self.close()
            return None
        return direct

    async def connect(self) -> None:
        """Open the direct connection, unless it is open or being opened. A failure leaves
        none: batches go the standard way, and the next one's success tries again."""
        if self._shut or self._opening or (self.direct is not None and self.direct.is_open):
            return
        self._opening = True
        try:
            self.direct = await DirectConnection.open(self.client)
        except (redis.RedisError, OSError):
            self.direct = None
        finally:
            self._opening = False
        if self._shut:  # shut while it opened
            self.close()

    def close(self) -> None:
        """Close the direct connection (batches waiting on it go the standard way); a
        later batch opens another."""
        direct, self.direct = self.direct, None
        if direct is not None:
            direct.close()

    def shut(self) -> None:
        """Close the direct connection for good (the client is being closed)."""
        self._shut = True
        self.close()


def _packed(opened: aredis.Connection, commands: Sequence[tuple[Any, ...]]) -> list[bytes]:
    """``commands`` in RESP, in one buffer: each packed by the connection (by hiredis on
    the API's clients, vmpool/api/packing.py), the pieces joined once (the connection's
    ``pack_commands`` weighs each piece in a Python loop to join them in parts)."""
    return [b"".join([piece for command in commands for piece in opened.pack_command(*command)])]


def _hand(done: Replied, result: list[Any] | Exception) -> None:
    """``done(result)``; if ``done`` itself fails, it is handed that error, so that no
    caller of the batch waits for ever on an answer a bug lost."""
    try:
        done(result)
    except Exception as exc:
        log.exception("a batch's owner failed on its replies")
        done(exc)

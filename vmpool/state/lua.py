"""The one loader of vmpool's Lua scripts.

Every script lives in a ``.lua`` file beside the module that calls it (the store's in
``vmpool/state/scripts/``, the simulated provider's in ``vmpool/providers/``, the
workers' in ``workers/``), and each file opens with a header comment: its keys,
arguments, return values and the invariant it protects. Modules read them through
:func:`read_script` only, so there is one way a script reaches Redis: the text of the
file (plus, for the store, the rendered transition table), registered with redis-py's
``register_script`` (EVALSHA, loading on NOSCRIPT). :func:`run_pipelined_async` runs several
registered scripts in one round trip (a :class:`ScriptPipeline` gathers them).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aredis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from vmpool.state.durability import (
    ConfirmingAsyncRedis,
    ConfirmingRedis,
    Durability,
    check_confirmation,
    confirm,
    current_scope,
    queue_confirmation,
)

__all__ = [
    "ScriptCall",
    "ScriptPipeline",
    "checked_replies",
    "durability_of",
    "evalsha_on",
    "execute_loading",
    "load_missing",
    "pipelined_commands",
    "read_script",
    "run_pipelined",
    "run_pipelined_async",
]


@cache
def read_script(package: str, name: str) -> str:
    """The text of ``name`` (``foo.lua``) shipped in ``package``.

    ``package``: a dotted package name, e.g. ``"vmpool.state.scripts"``. Cached: a
    script file never changes at run time.
    """
    if not name.endswith(".lua"):
        raise ValueError(f"not a Lua script file name: {name!r}")
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class ScriptCall:
    """One call of a registered script, to run alone or with others (run_pipelined_async)."""

    script: Script
    keys: list[Any]
    args: list[Any]

    def run(self, client: redis.Redis | None = None) -> Any:
        return self.script(keys=self.keys, args=self.args, client=client)


def evalsha_on(pipe: Pipeline, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Queue a call of registered ``script`` on ``pipe`` as a bare EVALSHA.

    redis-py's pipeline sends SCRIPT EXISTS, a round trip of its own, before every
    execute that holds a script called on it; a pipeline of these is run by
    :func:`execute_loading`, which loads a script only when the server lacks it."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def execute_loading(
    conn: redis.Redis, build: Callable[[Pipeline], None], scripts: Sequence[Script]
) -> list[Any]:
    """The replies of the pipeline ``build`` fills (scripts queued by :func:`evalsha_on`).

    One round trip. When the server answered NOSCRIPT (it restarted or flushed its
    scripts), ``scripts`` are loaded and the pipeline is built and sent once more: only
    for a pipeline whose commands may all run twice (a script call answered NOSCRIPT did
    not run; every other command of it is idempotent). An error reply is raised, as
    ``execute`` raises it."""
    for attempt in range(2):
        pipe = conn.pipeline(transaction=False)
        build(pipe)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        if not attempt and any(isinstance(r, NoScriptError) for r in replies):
            for script in scripts:
                conn.script_load(script.script)
            continue
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies
    raise AssertionError("unreachable")  # the second attempt returns or raises


def load_missing(client: redis.Redis, scripts: Sequence[Script]) -> int:
    """Load into the server those of ``scripts`` it does not hold; how many it loaded.

    Two round trips at most: one SCRIPT EXISTS for all, one pipeline of the loads. A
    process runs it as it starts (:meth:`vmpool.lifecycle.fleet.Fleet.warm`), so that its
    first calls are not answered NOSCRIPT on a fresh or restarted Redis: each such
    answer costs a round trip and a load, and in a pipeline the call runs again after
    the calls that followed it."""
    unique = list({script.sha: script for script in scripts}.values())
    if not unique:
        return 0
    held = client.script_exists(*(script.sha for script in unique))
    missing = [script for script, has in zip(unique, held, strict=True) if not has]
    if missing:
        pipe = client.pipeline(transaction=False)
        for script in missing:
            pipe.script_load(script.script)
        pipe.execute()
    return len(missing)


def run_pipelined(
    client: redis.Redis,
    calls: Sequence[ScriptCall],
    *,
    settled: bool = False,
    reads: Callable[[Pipeline], None] | None = None,
) -> list[Any]:
    """The replies of ``calls`` run in order in one round trip (an error reply in its place).

    Each call is still its own atomic script; the pipeline adds no atomicity across
    them. A call the server answered NOSCRIPT did not run: it runs again alone, its
    script loaded (after the calls that followed it: rare, after a Redis restart or
    SCRIPT FLUSH). Their durability is a script call's on ``client``
    (:class:`~vmpool.state.durability.ConfirmingRedis`): in a unit of work left to the
    unit's end, else confirmed at once, one wait for them all. ``settled``: in a unit,
    its writes so far (these calls' included) are confirmed in the same round trip, as
    :func:`~vmpool.state.durability.settle` would after them: before a side effect
    outside Redis that the calls decide (:class:`WriteNotConfirmed` when not).
    ``reads``: queues plain read commands after the calls, in the same round trip;
    their replies follow the calls' (run again with them when the server answered a
    call NOSCRIPT)."""
    if not calls:
        return []
    durability = client.durability if isinstance(client, ConfirmingRedis) else None
    confirming = durability is not None and durability.waits
    scope = current_scope() if confirming else None
    with client.pipeline(transaction=False) as pipe:
        for call in calls:
            evalsha_on(pipe, call.script, call.keys, call.args)
        if reads is not None:
            reads(pipe)
        read_count = len(pipe.command_stack) - len(calls)
        settles = settled and scope is not None and queue_confirmation(pipe, durability)
        replies: list[Any] = pipe.execute(raise_on_error=False)
    read_replies = replies[len(calls) : len(calls) + read_count]
    if scope is not None:
        assert durability is not None
        for _ in calls:
            scope.defer(durability)
        if settles:
            check_confirmation(durability, replies[len(calls) + read_count :])
    out = [
        call.run(client) if isinstance(reply, NoScriptError) else reply
        for call, reply in zip(calls, replies[: len(calls)], strict=True)
    ]
    if reads is not None and any(isinstance(r, NoScriptError) for r in replies[: len(calls)]):
        read_replies = _reads_again(client, reads)  # after the calls that ran again
    if confirming and scope is None:
        confirm(client)
    return out + read_replies


def _reads_again(client: redis.Redis, reads: Callable[[Pipeline], None]) -> list[Any]:
    """The replies of ``reads`` run alone: after a call that the server answered
    NOSCRIPT ran again, as the reads came after it."""
    with client.pipeline(transaction=False) as pipe:
        reads(pipe)
        return list(pipe.execute(raise_on_error=False))


class ScriptPipeline:
    """Script calls gathered to run in one round trip, each still its own atomic unit.

    A store method given ``pipeline=`` adds its call here instead of running it. The
    caller runs them all with :meth:`execute_async` (replies in the order added).
    """

    def __init__(self) -> None:
        self.calls: list[ScriptCall] = []

    def add(self, call: ScriptCall) -> int:
        """Add ``call``. Its index in the replies."""
        self.calls.append(call)
        return len(self.calls) - 1

    async def execute_async(self, client: aredis.Redis) -> list[Any]:
        """The replies of the calls (:func:`run_pipelined_async`: errors in place)."""
        return await run_pipelined_async(client, self.calls)


async def run_pipelined_async(client: aredis.Redis, calls: Sequence[ScriptCall]) -> list[Any]:
    """The replies of ``calls`` run in order in one round trip on an asyncio client.

    A pipeline of EVALSHA, with no SCRIPT EXISTS round trip first (redis-py's pipeline
    sends one whenever it holds a script). Each call is still its own atomic script.
    The pipeline adds no atomicity across them. A call the server answered NOSCRIPT did
    not run: its script is loaded and it runs again, alone (so after the calls that
    followed it: rare, after a Redis restart or SCRIPT FLUSH). A call that failed
    otherwise has its exception in its place, not raised, so that one call's error does
    not hide another's outcome. On a client of the connection factory the calls'
    durability is confirmed in the same round trip (:mod:`vmpool.state.durability`):
    WriteNotConfirmed is raised when it is not.
    """
    durability = durability_of(client)
    replies = await _pipelined(client, calls, durability)
    out = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, NoScriptError):
            try:
                await client.script_load(call.script.script)
                reply = (await _pipelined(client, [call], durability))[0]
            except redis.ResponseError as exc:
                reply = exc
        out.append(reply)
    return out


async def _pipelined(
    client: aredis.Redis, calls: Sequence[ScriptCall], durability: Durability | None
) -> list[Any]:
    """The calls' replies (errors in place), in one round trip.

    The calls, then (on one connection) their confirmation, checked
    (:func:`vmpool.state.durability.queue_confirmation`).
    """
    commands, confirmed = pipelined_commands(client, calls, durability)
    return checked_replies(await _round_trip(client, commands), len(calls), confirmed)


def durability_of(client: aredis.Redis) -> Durability | None:
    """What ``client``'s writes wait for; None for a client not of the connection factory."""
    return client.durability if isinstance(client, ConfirmingAsyncRedis) else None


def pipelined_commands(
    client: aredis.Redis, calls: Sequence[ScriptCall], durability: Durability | None
) -> tuple[list[tuple[Any, ...]], Durability | None]:
    """The commands that run ``calls`` in one round trip (EVALSHA each), then those that
    confirm them (:func:`vmpool.state.durability.queue_confirmation`); and the durability
    they confirm, None when there is no confirmation (:func:`checked_replies`)."""
    commands: list[tuple[Any, ...]] = [
        ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args) for call in calls
    ]
    if durability is None or not durability.waits:
        return commands, None
    # redis-py's pipeline spells the confirmation's commands; they are sent after the calls
    pipe = client.pipeline(transaction=False)
    if not queue_confirmation(pipe, durability):
        return commands, None
    return commands + [args for args, _ in pipe.command_stack], durability


def checked_replies(replies: Sequence[Any], count: int, confirmed: Durability | None) -> list[Any]:
    """The calls' replies, the first ``count`` of a round trip of
    :func:`pipelined_commands`, once the rest confirm them (``confirmed``: the durability
    it names; WriteNotConfirmed otherwise)."""
    if confirmed is not None:
        check_confirmation(confirmed, replies[count:])
    return list(replies[:count])


async def _round_trip(client: aredis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    """The raw replies of ``commands`` (a ResponseError in its place), sent in one write.

    What redis-py's pipeline ``execute`` does for commands without reply callbacks
    (EVALSHA, PUBLISH, WAIT): one pooled connection; on a connection error it is
    disconnected and the whole round trip sent once more, under the connection's retry
    (vmpool.state.connection: the pool's idle connections closed too). Without the
    pipeline's per-reply parsing and bookkeeping: a sixth less client CPU per create in
    a batch of eight, a fifth less for a call alone (measured: docs/benchmarks.md). The
    replies are read under one deadline (:func:`_read_replies`).
    """
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py untyped
    try:

        async def send_and_read() -> list[Any]:
            await conn.send_packed_command(conn.pack_commands(commands))
            return await _read_replies(conn, len(commands))

        async def failed(error: Exception) -> None:
            await conn.disconnect()

        result: list[Any] = await conn.retry.call_with_retry(send_and_read, failed)
        return result
    except BaseException:
        await conn.disconnect()  # replies may be left unread on it: never reused so
        raise
    finally:
        await pool.release(conn)


async def _read_replies(conn: Any, count: int) -> list[Any]:
    """``count`` replies on ``conn`` (a ResponseError in its place), all read before the
    connection's socket timeout runs out.

    redis-py bounds each reply's read by the socket timeout with a timer of its own (an
    asyncio timeout armed and cancelled per reply): in a round trip of 17 replies, 9.2 µs
    of client CPU a reply against 5.3 µs with one deadline for them all (measured). It
    bounds the same wait: Redis answers a pipeline's commands in order and writes their
    replies together, and the slowest, a confirmation's WAIT, waits at most the
    durability timeout, which the config keeps under the socket timeout. On the
    deadline the connection is dropped and redis-py's TimeoutError raised, as a read of
    redis-py's own would (the connection's retry then sends the round trip again).
    """
    replies: list[Any] = []
    try:
        async with asyncio.timeout(conn.socket_timeout):  # None: no deadline
            for _ in range(count):
                try:
                    # math.inf: no timer of redis-py's own; the deadline above bounds it
                    replies.append(await conn.read_response(timeout=math.inf))
                except redis.ResponseError as exc:
                    replies.append(exc)
    except TimeoutError:
        await conn.disconnect(nowait=True)
        raise redis.TimeoutError("Timeout reading from Redis") from None
    return replies

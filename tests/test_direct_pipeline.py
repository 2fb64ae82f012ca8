"""The hot batches' own connection (vmpool/state/direct_pipeline.py) answers what the
standard path answers, and hands every case but the plain one to that path.

Each test runs batches of script calls through a :class:`DirectPipeline` on a client of
the connection factory, against a real Redis, and checks the replies against what the
standard path (``run_pipelined_async``) gives, or the error it raises.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest
import redis
from redis._parsers import _AsyncRESP2Parser
from redis.exceptions import ReadOnlyError

from vmpool.api.packing import pack_with_hiredis
from vmpool.local.redis_server import free_port
from vmpool.state.confirmation import WriteNotConfirmed
from vmpool.state.connection import RedisOptions, connect_async
from vmpool.state.direct_pipeline import DirectPipeline, _packed
from vmpool.state.lua import ScriptCall, run_pipelined_async

from pipelinehelp import APPEND, FAILS, calls, options
from storehelp import poll

T = TypeVar("T")


async def batch(pipeline: DirectPipeline, batch_calls: Sequence[ScriptCall]) -> Any:
    """What ``pipeline`` hands the batch: its replies, or its error (returned)."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    pipeline.run(batch_calls, done.set_result)
    return await asyncio.wait_for(done, 30)  # a batch never answered fails the test


def run_with(url: str, opts: RedisOptions, body: Callable[[DirectPipeline], Awaitable[T]]) -> T:
    """``body`` on a pipeline of a factory client of ``url``, its direct connection open."""

    async def main() -> T:
        client = connect_async(url, opts, decode_responses=True)
        pipeline = DirectPipeline(client)
        await pipeline.connect()
        assert pipeline.direct is not None and pipeline.direct.is_open
        try:
            return await body(pipeline)
        finally:
            pipeline.close()
            await client.aclose()

    return asyncio.run(main())


def direct_clients(conn: redis.Redis) -> list[dict[str, Any]]:
    return [c for c in conn.client_list() if c["cmd"] == "evalsha"]


def test_a_batch_on_the_direct_connection_answers_what_the_standard_path_answers(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: replies in order, a call's error in its place, each call run once, on the
    direct connection (the only one that sent EVALSHA), and a second batch behind the
    first on it gets its own replies."""
    failing = ScriptCall(redis_client.register_script(FAILS), [], [])
    redis_client.script_load(APPEND)
    redis_client.script_load(FAILS)

    async def body(pipeline: DirectPipeline) -> tuple[Any, Any, Any]:
        first = [*calls(redis_client, "direct", ["a", "b"]), failing]
        second = calls(redis_client, "direct", ["c"])
        done_first, done_second = await asyncio.gather(
            batch(pipeline, first), batch(pipeline, second)
        )
        standard = await run_pipelined_async(pipeline.client, calls(redis_client, "std", ["x"]))
        return done_first, done_second, standard

    first, second, standard = run_with(redis_url, options(), body)
    assert first[:2] == [1, 2] and isinstance(first[2], redis.ResponseError)
    assert "refused on purpose" in str(first[2])
    assert second == [3]
    assert standard == [1]
    assert redis_client.lrange("direct", 0, -1) == ["a", "b", "c"]


def test_a_call_answered_noscript_runs_again_alone_and_the_others_keep_their_replies(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: after SCRIPT FLUSH, a direct batch's NOSCRIPT call is loaded and run
    again (once), and the next batch goes direct again."""

    async def body(pipeline: DirectPipeline) -> tuple[Any, Any]:
        redis_client.script_flush()
        first = await batch(pipeline, calls(redis_client, "flushed", ["a", "b"]))
        assert pipeline.direct is not None and pipeline.direct.is_open
        return first, await batch(pipeline, calls(redis_client, "flushed", ["c"]))

    first, second = run_with(redis_url, options(), body)
    assert first == [1, 2] and second == [3]
    assert redis_client.lrange("flushed", 0, -1) == ["a", "b", "c"]


def test_a_batch_whose_direct_connection_is_killed_is_sent_again_and_runs_once(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: a batch held unrun (CLIENT PAUSE WRITE) whose direct connection is
    killed goes again the standard way and runs once; the next batch reopens it."""
    redis_url, redis_client = own_redis
    redis_client.script_load(APPEND)
    killed: list[int] = []

    def kill_the_held_batch() -> None:
        try:
            if poll(lambda: any("b" in c["flags"] for c in direct_clients(redis_client)), 10):
                for client in direct_clients(redis_client):
                    redis_client.client_kill_filter(_id=client["id"])
                    killed.append(client["id"])
        finally:
            redis_client.execute_command("CLIENT", "UNPAUSE")

    async def body(pipeline: DirectPipeline) -> tuple[Any, Any]:
        redis_client.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        killer = threading.Thread(target=kill_the_held_batch)
        killer.start()
        try:
            first = await batch(pipeline, calls(redis_client, "killed", ["a", "b"]))
        finally:
            await asyncio.to_thread(killer.join, 15)
        second = await batch(pipeline, calls(redis_client, "killed", ["c"]))  # standard, reopens
        assert await asyncio.to_thread(
            poll, lambda: pipeline.direct is not None and pipeline.direct.is_open, 5
        )
        return first, second

    first, second = run_with(redis_url, options(), body)
    assert len(killed) == 1
    assert first == [1, 2] and second == [3]
    assert redis_client.lrange("killed", 0, -1) == ["a", "b", "c"]


def test_an_overdue_batch_is_sent_once_more_without_a_retry_of_its_own(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: with Redis holding writes past the socket timeout, a direct batch is
    overdue, goes once more the standard way, and its error comes after two socket
    timeouts, not three (the standard path's own retry not run on top)."""
    redis_url, redis_client = own_redis
    redis_client.script_load(APPEND)
    timeout = 0.5

    async def body(pipeline: DirectPipeline) -> tuple[Any, float]:
        redis_client.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            started = time.monotonic()
            result = await batch(pipeline, calls(redis_client, "overdue", ["a"]))
            return result, time.monotonic() - started
        finally:
            redis_client.execute_command("CLIENT", "UNPAUSE")

    result, elapsed = run_with(redis_url, options(socket_timeout=timeout), body)
    assert isinstance(result, redis.TimeoutError), result
    assert 2 * timeout <= elapsed < 2.8 * timeout, elapsed


def test_a_direct_batch_not_confirmed_fails_as_the_standard_path_fails(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the direct batch carries its confirmation (a WAIT for a replica there is
    not) and hands the batch WriteNotConfirmed, as the standard path raises it."""
    redis_client.script_load(APPEND)
    redis_client.config_resetstat()

    async def body(pipeline: DirectPipeline) -> Any:
        return await batch(pipeline, calls(redis_client, "unconfirmed", ["a", "b"]))

    result = run_with(redis_url, options(replicas=1), body)
    assert isinstance(result, WriteNotConfirmed), result
    assert int(redis_client.info("commandstats")["cmdstat_wait"]["calls"]) == 1


def test_a_moved_primary_or_an_idle_connection_sends_the_batch_the_standard_way(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a connection idle past the health-check interval, or one whose primary
    is named elsewhere now, is dropped before it sends; the batch still gets its replies
    (the standard way) and the direct connection is opened again after it."""
    redis_client.script_load(APPEND)

    async def body(pipeline: DirectPipeline) -> list[Any]:
        out = []
        direct = pipeline.direct
        assert direct is not None
        direct.last_used -= 10  # idle for longer than the 1 s health-check interval
        out.append(await batch(pipeline, calls(redis_client, "moved", ["a"])))
        assert not direct.is_open
        assert await asyncio.to_thread(
            poll, lambda: pipeline.direct is not None and pipeline.direct.is_open, 5
        )
        reopened = pipeline.direct
        assert reopened is not None
        reopened.opened.named_primary = lambda: ("192.0.2.1", 6379)  # a failover happened
        out.append(await batch(pipeline, calls(redis_client, "moved", ["b"])))
        assert not reopened.is_open
        return out

    assert run_with(redis_url, options(health_check=1.0), body) == [[1], [2]]


def test_a_readonly_reply_stays_in_place_and_drops_the_direct_connection(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: on a server demoted to a replica, a write's READONLY error is its reply
    (as the standard path leaves it) and the next batch goes the standard way."""
    url, conn = own_redis
    conn.script_load(APPEND)

    async def body(pipeline: DirectPipeline) -> tuple[Any, bool]:
        conn.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        try:
            result = await batch(pipeline, calls(conn, "readonly", ["a"]))
        finally:
            conn.execute_command("REPLICAOF", "NO", "ONE")
        return result, pipeline.direct is None

    result, dropped = run_with(url, options(), body)
    assert isinstance(result[0], ReadOnlyError), result
    assert dropped


@pytest.mark.parametrize("count", [1, 40])
def test_many_batches_in_flight_each_get_their_own_replies(
    redis_url: str, redis_client: redis.Redis, count: int
) -> None:
    """Proves: batches written back to back on the one connection are answered in the
    order sent, each with its own calls' replies."""
    redis_client.script_load(APPEND)

    async def body(pipeline: DirectPipeline) -> list[Any]:
        return await asyncio.gather(
            *(batch(pipeline, calls(redis_client, f"many{i}", ["a", "b"])) for i in range(count))
        )

    assert run_with(redis_url, options(), body) == [[1, 2]] * count


def test_an_owner_that_fails_on_its_replies_is_handed_that_error(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a batch's owner that raises on its replies (a bug) is called again with
    that error, so its callers get an answer instead of waiting for ever."""
    redis_client.script_load(APPEND)
    seen: list[Any] = []

    async def body(pipeline: DirectPipeline) -> None:
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(result: Any) -> None:
            seen.append(result)
            if isinstance(result, list):
                raise KeyError("a bug")
            answered.set_result(None)

        pipeline.run(calls(redis_client, "owner", ["a"]), done)
        await asyncio.wait_for(answered, 30)

    run_with(redis_url, options(), body)
    assert seen[0] == [1] and isinstance(seen[1], KeyError)


def test_a_shut_pipeline_opens_no_connection_and_still_answers(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: once shut (its client closing), batches still get their replies, the
    standard way, and no direct connection is opened again after them."""
    redis_client.script_load(APPEND)

    async def body(pipeline: DirectPipeline) -> Any:
        pipeline.shut()
        result = await batch(pipeline, calls(redis_client, "shut", ["a"]))
        await asyncio.gather(*pipeline._running)  # the batch's task, connect included
        assert pipeline.direct is None
        return result

    assert run_with(redis_url, options(), body) == [1]


def test_without_a_hiredis_reader_every_batch_goes_the_standard_way(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a connection redis-py reads with its pure-Python parser (nothing to take
    over) is not taken; the batches still get their replies, the standard way."""
    redis_client.script_load(APPEND)

    async def main() -> list[Any]:
        client = connect_async(redis_url, options(), decode_responses=True)
        client.connection_pool.connection_kwargs["parser_class"] = _AsyncRESP2Parser
        pipeline = DirectPipeline(client)
        try:
            await pipeline.connect()
            assert pipeline.direct is None
            return [await batch(pipeline, calls(redis_client, "pure", [v])) for v in "ab"]
        finally:
            pipeline.shut()
            await client.aclose()

    assert asyncio.run(main()) == [[1], [2]]


def test_a_batch_is_packed_as_the_connection_packs_it(redis_url: str) -> None:
    """Proves: the batch's one buffer holds the bytes the connection's own
    ``pack_commands`` writes, on a connection that packs with hiredis as the API's do
    (and on a plain one), for a batch's commands (EVALSHA with text, integer and float
    arguments, then PUBLISH and WAIT), a memoryview argument and a two-word name."""

    async def main() -> None:
        batches = [
            [("EVALSHA", "ab" * 20, 2, "k1", "k2", "é", 7, 0.25), ("PUBLISH", "c", "")],
            [("WAIT", 1, 50)],
            [("EVALSHA", "ab" * 20, 0, memoryview(b"raw"))],
            [("CLIENT SETNAME", "vmpool")],
        ]
        for hiredis_packing in (True, False):
            client = connect_async(redis_url, options(), decode_responses=True)
            if hiredis_packing:
                pack_with_hiredis(client)
            opened = client.connection_pool.make_connection()
            try:
                for commands in batches:
                    ours = b"".join(_packed(opened, commands))
                    assert ours == b"".join(opened.pack_commands(commands))
            finally:
                await client.aclose()

    asyncio.run(main())

"""The API's pipelined round trip (vmpool/state/lua.py ``_round_trip``): every reply
read under one deadline, the connection's socket timeout, with redis-py's own outcome
when Redis does not answer in time."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from vmpool.state.lua import _round_trip


def _client(redis_url: str, timeout_s: float) -> aredis.Redis:
    return aredis.Redis.from_url(redis_url, socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0))


def test_each_reply_in_place_an_error_too(redis_url: str) -> None:
    """Proves: the replies come back in order, a command's error in its place (not
    raised), and the connection goes back to the pool clean for the next round trip."""

    async def run() -> tuple[list[object], list[object]]:
        client = _client(redis_url, 5.0)
        try:
            first = await _round_trip(client, [("PING",), ("NOSUCHCOMMAND",), ("ECHO", "x")])
            second = await _round_trip(client, [("ECHO", "y")])
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(run())
    assert first[0] is True or first[0] == b"PONG"
    assert isinstance(first[1], redis.ResponseError)
    assert first[2] == b"x"
    assert second == [b"y"]


def test_a_round_trip_past_the_socket_timeout_raises_redis_timeout_and_drops_the_connection(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: when Redis answers a pipeline later than the socket timeout (every client
    paused for 1 s, timeout 0.3 s), the round trip ends at the timeout with redis-py's
    TimeoutError, as redis-py's own read would, and the connection is dropped, so no
    later round trip reads the late replies as its own."""

    async def run() -> tuple[float, object]:
        client = _client(redis_url, 0.3)
        try:
            await _round_trip(client, [("PING",)])  # a pooled connection, open
            redis_client.execute_command("CLIENT", "PAUSE", 1000, "ALL")
            start = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                await _round_trip(client, [("PING",), ("ECHO", "late"), ("PING",)])
            elapsed = time.monotonic() - start
            redis_client.execute_command("CLIENT", "UNPAUSE")
            after = await _round_trip(client, [("ECHO", "after")])
            return elapsed, after
        finally:
            redis_client.execute_command("CLIENT", "UNPAUSE")
            await client.aclose()

    elapsed, after = asyncio.run(run())
    assert 0.25 <= elapsed < 0.9
    assert after == [b"after"]

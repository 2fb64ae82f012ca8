"""The API's asyncio connections pack commands with hiredis (vmpool/api/packing.py):
the same bytes as redis-py's own hiredis serializer for every argument it takes, the
same refusal for one it does not, and commands sent so reach Redis intact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.connection import HiredisRespSerializer

from vmpool.api.deps import LoopClients
from vmpool.api.packing import _HiredisPacking
from vmpool.config import default_redis_options

CASES: list[tuple[Any, ...]] = [
    ("EVALSHA", "0" * 40, 2, "k:{a}", "k:{b}", "text", 3, 2.5, -7, b"\x00\xffraw", ""),
    (b"SET", b"k", "é ü"),  # a bytes name, non-ASCII text
    ("SCRIPT LOAD", "return 1"),  # a two-word name, split
    (b"CLIENT SETINFO", b"LIB-NAME", b"x"),
    ("SET", "k", bytearray(b"ba")),  # copied to bytes
    ("SET", "k", memoryview(b"mv")),
]


@pytest.mark.parametrize("args", CASES)
def test_the_same_bytes_as_redis_pys_serializer(args: tuple[Any, ...]) -> None:
    assert _HiredisPacking().pack_command(*args) == HiredisRespSerializer().pack(*args)


@pytest.mark.parametrize("bad", [True, None, object()])
def test_an_argument_redis_py_refuses_is_refused_alike(bad: object) -> None:
    with pytest.raises(redis.DataError):
        HiredisRespSerializer().pack("SET", "k", bad)
    with pytest.raises(redis.DataError):
        _HiredisPacking().pack_command("SET", "k", bad)


def test_commands_packed_so_reach_redis_intact(redis_url: str, redis_client: redis.Redis) -> None:
    async def run() -> list[Any]:
        client = LoopClients(redis_url, default_redis_options()).get()
        try:
            await client.set("packed:a", b"\x00\xff")
            await client.hset("packed:h", mapping={"f": 2.5, "g": "é"})
            return [await client.hgetall("packed:h"), await client.strlen("packed:a")]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [{"f": "2.5", "g": "é"}, 2]

"""The API's asyncio Redis connections pack their commands with hiredis.

redis-py's asyncio connection packs each command in Python (its sync connection uses
hiredis when installed). A POST /ondemandvm sends two scripts of 17-25 arguments in one
pipeline, and packing them in Python cost about a third of that round trip's CPU in
the API process (profiled: docs/benchmarks.md). :func:`pack_with_hiredis` gives a
client's pool a connection class that packs with redis-py's own hiredis serializer,
whatever class the pool had (a Sentinel-managed one stays Sentinel-managed). Without
hiredis the client is left as it is.
"""

from __future__ import annotations

from typing import Any

import hiredis
import redis.asyncio as aredis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

__all__ = ["pack_with_hiredis"]


class _HiredisPacking:
    """A connection mixin: ``pack_command`` by hiredis, as redis-py's sync connection."""

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        name = args[0]
        if (b" " if isinstance(name, bytes) else " ") not in name:
            # The serializer's own steps are for a two-word command name, which it
            # splits, and bytearray or memoryview arguments, which it copies to bytes
            # (hiredis refuses those: TypeError, then the serializer's way). Its copy of
            # the arguments was a third of the packing of a create's 30 (profiled).
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        packed: list[bytes] = self._serializer.pack(*args)
        return packed


def pack_with_hiredis(client: aredis.Redis) -> None:
    """Make the connections ``client``'s pool opens from now on pack with hiredis."""
    pool = client.connection_pool
    base = pool.connection_class
    if not HIREDIS_AVAILABLE or issubclass(base, _HiredisPacking):
        return
    pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})

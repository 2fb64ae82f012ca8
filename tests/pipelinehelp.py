"""Script calls for the tests of the hot batches' pipeline (tests/test_direct_pipeline.py,
tests/test_turn_batches.py): a write each, and the client options they run under."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from vmpool.state.connection import RedisOptions
from vmpool.state.durability import DurabilitySetting
from vmpool.state.lua import ScriptCall

# Appends its argument to its key and answers the list's length: a write, so that a
# batch sent twice would show (and CLIENT PAUSE WRITE holds it).
APPEND = "redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('LLEN', KEYS[1])"
FAILS = "return redis.error_reply('ERR refused on purpose')"


def options(
    socket_timeout: float = 5.0, health_check: float = 0, replicas: int = 0
) -> RedisOptions:
    """A client's options; ``replicas``: its writes confirmed by that many (WAIT)."""
    mode = "replicas" if replicas else "none"
    setting = DurabilitySetting(mode, replicas, 0.05)  # type: ignore[arg-type]
    return RedisOptions(socket_timeout, 2.0, health_check, setting)


def calls(conn: redis.Redis, key: str, values: Sequence[str]) -> list[ScriptCall]:
    """One APPEND call of ``key`` for each of ``values``, in order."""
    script = conn.register_script(APPEND)
    return [ScriptCall(script, [key], [value]) for value in values]

"""Is Redis usable for vmpool now, and if not, why: one vocabulary for every process.

A Redis that answers PING may still refuse every write:

- it is full (``maxmemory`` reached under ``noeviction``: OOM)
- it is a replica (READONLY: a failover moved the primary; UNBLOCKED: a blocking
  read ended because its server became one)
- it lacks the replicas ``min-replicas-to-write`` asks for (NOREPLICAS)
- a write's durability cannot be confirmed
  (:class:`~vmpool.state.durability.WriteNotConfirmed`).

:func:`classify` names the condition of an error (None: not a Redis condition, a bug).
:func:`probe` makes a real write (:file:`scripts/write_probe.lua`) and says what it met.

Users: the API's ``/readyz`` and ``/metrics``, its error replies, and the workers and
the scheduler waiting out an outage. A full Redis reads "Redis is out of memory"
everywhere, not "unavailable".
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import redis

from vmpool.state.durability import WriteNotConfirmed, confirmed, settle
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = ["MESSAGES", "RedisCondition", "classify", "error_code", "memory", "probe"]

PROBE_TTL_MS: Final = 60_000
# What redis-py's Pipeline.annotate_exception puts before the server's message.
_PIPELINE_MARK: Final = " of pipeline caused error: "
_PROBE_LUA: Final = read_script("vmpool.state.scripts", "write_probe.lua")


class RedisCondition(StrEnum):
    """Why Redis cannot take vmpool's writes (or ``ok``)."""

    OK = "ok"
    UNREACHABLE = "unreachable"
    LOADING = "loading"
    OUT_OF_MEMORY = "out_of_memory"
    READ_ONLY = "read_only"
    NO_REPLICAS = "no_replicas"
    NOT_CONFIRMED = "not_confirmed"


# What a client is told (the API's 503 messages, the workers' log lines).
MESSAGES: Final = {
    RedisCondition.OK: "Redis takes writes",
    RedisCondition.UNREACHABLE: "the state store is unavailable",
    RedisCondition.LOADING: "Redis is loading its data",
    RedisCondition.OUT_OF_MEMORY: "Redis is out of memory",
    RedisCondition.READ_ONLY: "Redis is read-only (a replica: a failover may be under way)",
    RedisCondition.NO_REPLICAS: "Redis refuses writes: too few replicas are connected",
    RedisCondition.NOT_CONFIRMED: "the write could not be confirmed durable in time",
}


def classify(exc: BaseException) -> RedisCondition | None:
    """The condition ``exc`` (raised by redis-py) shows.

    None when it is no outage of Redis: a script's own error, a bug.
    """
    if isinstance(exc, redis.BusyLoadingError):
        return RedisCondition.LOADING
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return RedisCondition.UNREACHABLE
    if isinstance(exc, redis.OutOfMemoryError):
        return RedisCondition.OUT_OF_MEMORY
    if isinstance(exc, redis.ReadOnlyError):
        return RedisCondition.READ_ONLY
    if isinstance(exc, WriteNotConfirmed):
        return RedisCondition.NOT_CONFIRMED
    if isinstance(exc, redis.ResponseError):
        head = error_code(exc)
        if head == "NOREPLICAS":
            return RedisCondition.NO_REPLICAS
        if head == "MASTERDOWN":  # a replica that lost its primary (serve-stale-data no)
            return RedisCondition.READ_ONLY
        if head == "UNBLOCKED":  # a blocking read (BLPOP) ended: its server became a replica
            return RedisCondition.READ_ONLY
    return None


def error_code(exc: redis.ResponseError) -> str:
    """The server's error code (the first word of its message).

    redis-py puts ``Command # N (<the command>) of pipeline caused error:`` in front of a
    pipeline's or a transaction's error: the code is the first word after it.
    """
    text = str(exc)
    _, marker, rest = text.rpartition(_PIPELINE_MARK)
    return (rest if marker else text).split(" ", 1)[0]


def probe(client: redis.Redis, keys: Keys) -> RedisCondition:
    """Make one small write through ``client`` and say what it met.

    The write is confirmed at once, as any acknowledged write, in a unit of work or an
    ``unconfirmed`` block too (a worker's loop probes whether writes are confirmed again).
    """
    try:
        with confirmed(client):
            client.register_script(_PROBE_LUA)(keys=[keys.write_probe], args=[PROBE_TTL_MS])
            settle(client)
    except redis.RedisError as exc:
        condition = classify(exc)
        if condition is None:
            raise
        return condition
    return RedisCondition.OK


def memory(client: redis.Redis) -> tuple[int, int]:
    """(used, maximum) bytes of Redis's memory. A maximum of 0 means no limit."""
    info = client.info("memory")
    return int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))

"""Is Redis set up as vmpool's guarantees assume? One check for every process.

vmpool keeps its state, its audit trails and its queues in Redis and relies on two
settings of the server:

- ``maxmemory-policy noeviction``: under memory pressure Redis then refuses writes
  (each script fails whole, changing nothing) instead of evicting keys. An evicting
  policy may drop a request's record, a VM's tombstone or a lock: a request id or VM
  name could then be taken again, a VM leak, a transition run twice.
- ``appendonly yes`` (AOF): a restart loses at most the last second (or nothing, with
  ``appendfsync always``) instead of everything since the last snapshot, which would
  bring back requests in states they already left.

:func:`check_redis` reads both, with ``CONFIG GET`` or, where a managed Redis disables
it, from ``INFO``; what it cannot read is "unknown", never an error. The api, worker,
scheduler and up commands call :func:`startup_check` when they start (a warning per
problem, or a refusal with ``--strict``); ``/api/v3/status`` and ``vmpool audit``
report :meth:`RedisCheck.as_dict`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["UNKNOWN", "RedisCheck", "RedisMisconfigured", "check_redis", "startup_check"]

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
WANT_POLICY = "noeviction"
WANT_AOF = "yes"


class RedisMisconfigured(RuntimeError):
    """Raised by :func:`startup_check` with ``strict`` when a setting is known wrong."""


@dataclass(frozen=True)
class RedisCheck:
    """What the server said: ``maxmemory_policy`` and ``appendonly`` as Redis spells
    them, or ``"unknown"`` when it would not say (CONFIG and INFO refused)."""

    maxmemory_policy: str
    appendonly: str

    def problems(self) -> list[str]:
        """One line per setting known to be wrong (an unknown one is not a problem:
        it is reported as unknown, see :meth:`unknowns`)."""
        out = []
        if self.maxmemory_policy not in (WANT_POLICY, UNKNOWN):
            out.append(
                f"Redis maxmemory-policy is {self.maxmemory_policy}, not {WANT_POLICY}:"
                " under memory pressure Redis may evict vmpool's records, locks and"
                " tombstones"
            )
        if self.appendonly not in (WANT_AOF, UNKNOWN):
            out.append(
                "Redis persistence: appendonly is off: a restart may lose recent state"
                " changes (set appendonly yes)"
            )
        return out

    def unknowns(self) -> list[str]:
        return [
            name
            for name, value in (
                ("maxmemory-policy", self.maxmemory_policy),
                ("appendonly", self.appendonly),
            )
            if value == UNKNOWN
        ]

    @property
    def status(self) -> str:
        """``ok``, ``misconfigured`` (a setting known wrong) or ``unknown``."""
        if self.problems():
            return "misconfigured"
        return UNKNOWN if self.unknowns() else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "maxmemory_policy": self.maxmemory_policy,
            "appendonly": self.appendonly,
            "problems": self.problems(),
        }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _config_get(client: redis.Redis, name: str) -> str | None:
    try:
        reply = client.config_get(name)
    except redis.ResponseError:  # CONFIG disabled or renamed (managed Redis), or NOPERM
        return None
    for key, value in (reply or {}).items():
        if _text(key) == name:
            return _text(value)
    return None


def _info_get(client: redis.Redis, section: str, field: str) -> str | None:
    try:
        info = client.info(section)
    except redis.ResponseError:
        return None
    if field not in info:
        return None
    return _text(info[field])


def check_redis(client: redis.Redis) -> RedisCheck:
    """Read the two settings; "unknown" for what the server will not tell. A lost
    connection (redis.ConnectionError) is raised: that is not a setting."""
    policy = _config_get(client, "maxmemory-policy") or _info_get(
        client, "memory", "maxmemory_policy"
    )
    aof = _config_get(client, "appendonly")
    if aof is None:
        enabled = _info_get(client, "persistence", "aof_enabled")
        aof = None if enabled is None else ("yes" if enabled in ("1", "True") else "no")
    return RedisCheck(policy or UNKNOWN, aof or UNKNOWN)


def startup_check(client: redis.Redis, *, who: str, strict: bool = False) -> RedisCheck:
    """The check every process makes when it starts: a warning per problem (and one
    for what could not be read); with ``strict``, :class:`RedisMisconfigured` (one
    line) when a setting is known wrong. An unknown setting never refuses: a managed
    Redis that hides CONFIG must still run vmpool, and its operator is told."""
    result = check_redis(client)
    problems = result.problems()
    if strict and problems:
        raise RedisMisconfigured(f"{who}: refusing to start (--strict): " + "; ".join(problems))
    for problem in problems:
        log.warning("%s: %s", who, problem)
    unknown = result.unknowns()
    if unknown:
        log.warning(
            "%s: could not read Redis %s (CONFIG GET and INFO refused): make sure of"
            " maxmemory-policy noeviction and appendonly yes",
            who,
            " and ".join(unknown),
        )
    return result

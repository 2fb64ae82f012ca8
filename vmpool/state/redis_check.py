"""Is Redis set up as vmpool's guarantees assume? One check for every process.

vmpool keeps its state, its audit trails and its queues in Redis. It relies on:

- ``maxmemory-policy noeviction``. Under memory pressure Redis then refuses writes
  (each script fails whole, changing nothing) instead of evicting keys. An evicting
  policy may drop a request's record, a VM's tombstone or a lock. A request id or VM
  name could then be taken again, a VM leak, a transition run twice.
- ``appendonly yes`` (AOF). A restart then loses at most what was not fsynced. Without
  it, a restart loses everything since the last snapshot, and brings back requests in
  states they already left.
- The durability of acknowledged writes (:mod:`vmpool.state.durability`). Any
  ``appendfsync`` but ``always`` loses the last second of acknowledged writes on a
  crash or power loss. Through Sentinel, a failover loses the writes the promoted
  replica had not received, unless each write waits (WAIT) for every replica the
  sentinels could promote. A primary with replicas reached by a plain URL and waiting
  for none loses them when a replica is promoted by hand.
- ``min-replicas-to-write`` 1 or more on a primary with replicas: a primary cut off from
  its replicas (or an old primary back on its own data) then refuses every write at
  once (NOREPLICAS), its clients' other writes (RQ's) included.

How: :func:`check_redis` reads the settings with ``CONFIG GET``. Where a managed Redis
disables that, it reads ``INFO``. What it cannot read is "unknown", never an error. On a
client of the connection factory it also reports the durability its writes wait for. It
says by name when an acknowledged write could be lost, or when every write would be
refused.

Who: the api, worker, scheduler and up commands call :func:`startup_check` when they
start: a warning per problem, or a refusal with ``--strict``. ``/api/v3/status`` and
``vmpool audit`` report :meth:`RedisCheck.as_dict` (``--strict``: exit 1 on a problem).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from vmpool.state.durability import ConfirmingRedis, Durability
from vmpool.state.group_watch import FollowingDurability

__all__ = ["UNKNOWN", "RedisCheck", "RedisMisconfigured", "check_redis", "startup_check"]

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
WANT_POLICY = "noeviction"
WANT_AOF = "yes"
WANT_FSYNC = "always"


class RedisMisconfigured(RuntimeError):
    """Raised by :func:`startup_check` with ``strict`` when a setting is known wrong."""


@dataclass(frozen=True)
class RedisCheck:
    """What the server said, and the durability this process's writes wait for.

    Settings are as Redis spells them, or ``"unknown"`` when it would not say. The
    durability is None when not known: a client made outside the connection factory.
    """

    maxmemory_policy: str
    appendonly: str
    appendfsync: str = UNKNOWN
    role: str = UNKNOWN
    replicas: int | None = None
    min_replicas_to_write: str = UNKNOWN
    durability: Durability | None = None
    via_sentinel: bool = False
    promotable: int | None = None  # through Sentinel: the replicas it could promote

    def problems(self) -> list[str]:
        """One line per setting known to be wrong, naming it.

        An unknown setting is not a problem. It is reported as unknown (:meth:`unknowns`).
        """
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
        if self.role == "slave":
            out.append(
                "Redis is a replica (read-only): every write is refused; point vmpool at"
                " the primary, or at the sentinels (redis+sentinel://)"
            )
        return out + self._durability_problems()

    def _durability_problems(self) -> list[str]:
        d = self.durability
        out = []
        if self.appendonly == WANT_AOF and self.appendfsync not in (WANT_FSYNC, UNKNOWN):
            out.append(
                f"Redis appendfsync is {self.appendfsync}: a crash or power loss loses the"
                " acknowledged writes of the last second (set appendfsync always; WAITAOF"
                " does not close this gap: docs/operations.md, Durability)"
            )
        connected = self.replicas if self.role == "master" else None
        if d is not None and d.replicas and connected is not None and connected < d.replicas:
            out.append(
                f"durability waits for {d.replicas} replica(s) (WAIT) and the primary"
                f" has {connected} connected: every write is refused after"
                f" {d.timeout_s:g} s until enough replicas are connected"
            )
        if d is not None:
            out += self._replica_problems(d, connected)
        return out + self._min_replicas_problems(connected)

    def _replica_problems(self, d: Durability, connected: int | None) -> list[str]:
        """A failover (or a promotion by hand) that can lose what the writes waited for."""
        if self.via_sentinel and not d.replicas and (self.promotable or not d.automatic):
            return [
                "Redis is reached through Sentinel and durability waits for no replica"
                " (WAIT): a failover loses the acknowledged writes the promoted replica had"
                " not received (set durability auto or replicas)"
            ]
        if self.via_sentinel and not d.automatic and d.replicas < (self.promotable or 0):
            return [
                f"durability waits for {d.replicas} replica(s) (durability_replicas) and the"
                f" sentinels could promote {self.promotable}: a planned switch (SENTINEL"
                " FAILOVER) or a partition can lose acknowledged writes (unset"
                " durability_replicas; switch with vmpool redis switchover)"
            ]
        if not self.via_sentinel and not d.replicas and connected:
            return [
                f"Redis has {connected} replica(s) and durability waits for none (a"
                " redis:// URL): a replica promoted by hand lacks the acknowledged writes it"
                " had not received (reach the group through Sentinel, redis+sentinel://,"
                " or set durability replicas)"
            ]
        return []

    def _min_replicas_problems(self, connected: int | None) -> list[str]:
        if connected is None or not self.min_replicas_to_write.isdigit():
            return []
        wanted = int(self.min_replicas_to_write)
        if wanted > connected:
            return [
                f"Redis min-replicas-to-write is {wanted} and the primary has {connected}"
                " replica(s) connected: every write is refused (NOREPLICAS)"
            ]
        if wanted == 0 and (connected or self.via_sentinel):
            return [
                "Redis min-replicas-to-write is 0 on a primary with replicas: cut off from"
                " them (or back on its own data after a failover) it takes writes a"
                " failover then drops (set min-replicas-to-write 1)"
            ]
        return []

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

    def durability_text(self) -> str:
        return UNKNOWN if self.durability is None else self.durability.describe()

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "maxmemory_policy": self.maxmemory_policy,
            "appendonly": self.appendonly,
            "appendfsync": self.appendfsync,
            "role": self.role,
            "replicas": self.replicas,
            "min_replicas_to_write": self.min_replicas_to_write,
            "sentinel": self.via_sentinel,
            "durability": self.durability_text(),
            "promotable_replicas": self.promotable,
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


def _info(client: redis.Redis, section: str) -> dict[str, Any]:
    try:
        return dict(client.info(section))
    except redis.ResponseError:
        return {}


def _info_get(client: redis.Redis, section: str, field: str) -> str | None:
    info = _info(client, section)
    return None if field not in info else _text(info[field])


def check_redis(client: redis.Redis) -> RedisCheck:
    """Read the settings. "unknown" for what the server will not tell.

    A lost connection (redis.ConnectionError) is raised: that is not a setting.
    """
    policy = _config_get(client, "maxmemory-policy") or _info_get(
        client, "memory", "maxmemory_policy"
    )
    aof = _config_get(client, "appendonly")
    if aof is None:
        enabled = _info_get(client, "persistence", "aof_enabled")
        aof = None if enabled is None else ("yes" if enabled in ("1", "True") else "no")
    replication = _info(client, "replication")
    return RedisCheck(
        maxmemory_policy=policy or UNKNOWN,
        appendonly=aof or UNKNOWN,
        appendfsync=_config_get(client, "appendfsync") or UNKNOWN,
        role=_text(replication.get("role", UNKNOWN)),
        replicas=_count(replication.get("connected_slaves")),
        min_replicas_to_write=_config_get(client, "min-replicas-to-write") or UNKNOWN,
        durability=client.durability if isinstance(client, ConfirmingRedis) else None,
        via_sentinel=client.via_sentinel if isinstance(client, ConfirmingRedis) else False,
        promotable=_promotable(client),
    )


def _promotable(client: redis.Redis) -> int | None:
    """How many replicas the sentinels could promote, for a client that follows a group."""
    source = client.source if isinstance(client, ConfirmingRedis) else None
    if not isinstance(source, FollowingDurability):
        return None
    return len(source.watch.current().promotable())


def _count(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def startup_check(client: redis.Redis, *, who: str, strict: bool = False) -> RedisCheck:
    """The check every process makes when it starts.

    It logs the durability its writes wait for (a line), and a warning per problem (and one
    for what could not be read). With ``strict`` it raises :class:`RedisMisconfigured`
    (one line) when a setting is known wrong. An unknown setting never refuses: a managed
    Redis that hides CONFIG must still run vmpool, and its operator is told.
    """
    result = check_redis(client)
    problems = result.problems()
    if strict and problems:
        raise RedisMisconfigured(f"{who}: refusing to start (--strict): " + "; ".join(problems))
    log.info("%s: durability of acknowledged writes: %s", who, result.durability_text())
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

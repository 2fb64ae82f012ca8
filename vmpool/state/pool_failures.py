"""Failures in plain sight: each pool's failed creates, and the fleet's latest failures.

A create that fails counts toward its pool's streak; one that goes through ends it (the
store's scripts, in the unit that records the VM created: ``count_made`` in
``scripts/_prelude.lua``, under :func:`streak_key_prefix`). The streak is what
``/status``, ``vmpool pools``, ``/metrics`` and the dashboard show: how many creates
failed in a row, the last error and when.

A **permanent** create error (retrying cannot help: a template that does not exist, an
option the cloud refuses) also backs the pool's top-ups off, so that a warm pool does
not clone a doomed VM every few seconds forever. The back-off is bounded exponential:
:data:`BACKOFF_FIRST_S` after the first round of failures, doubling with each round, at
most :data:`BACKOFF_MAX_S`. A round is one run of failures: the creates that fail while
the pool already backs off (a top-up that reserved ten VMs, all failing) leave its retry
time alone. When the back-off is over the pool's next top-up sends one create, a probe
(vmpool.lifecycle.failures); a success ends the streak and the back-off at once.
On-demand requests are not held back: a permanent error fails its request at once with
the error as its reason.

Every failure the lifecycle notes (a create, a boot, a request out of time) also goes
to the fleet's latest-failures list (``keys.recent_failures``, :data:`RECENT_KEPT`
entries at most) with its reason, for the dashboard. Both are written by one Lua unit,
``scripts/pool_failure.lua``, stamped with Redis server time. Memory is bounded: one
small hash per pool and a capped list.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.records import decode_hash, text

__all__ = [
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "RECENT_KEPT",
    "Failure",
    "FailureKind",
    "PoolFailures",
    "Streak",
    "latest_failures",
    "read_pool_failures",
    "record_failure",
    "streak_key_prefix",
]

BACKOFF_FIRST_S: Final = 10.0  # the first round's back-off (the top-up runs every 5 s)
BACKOFF_MAX_S: Final = 300.0  # the longest: a fixed template is tried within 5 minutes
RECENT_KEPT: Final = 50  # failures the list keeps
MAX_REASON: Final = 500  # characters of a reason kept (a cloud's message may be long)

FailureKind = Literal["create", "boot", "request"]


@dataclass(frozen=True)
class Streak:
    """A pool's streak after a failed create: its length, and its top-ups' retry time."""

    consecutive: int
    retry_at: float | None

    @property
    def started(self) -> bool:
        """This failure began the streak (the one a warning is logged for)."""
        return self.consecutive == 1


@dataclass(frozen=True)
class PoolFailures:
    """A pool's create failures as read: the streak, the last error, the back-off."""

    pool: str
    consecutive: int = 0
    last_error: str = ""
    last_error_at: float | None = None
    retry_at: float | None = None

    @property
    def failing(self) -> bool:
        """The pool's last create failed (none went through since)."""
        return self.consecutive > 0

    def backing_off(self, now: float) -> bool:
        """Its top-ups wait now (a permanent error, until ``retry_at``)."""
        return self.failing and self.retry_at is not None and self.retry_at > now

    def as_dict(self, now: float) -> dict[str, Any]:
        """The form /status, `vmpool pools --json` and the dashboard show."""
        return {
            "failing": self.failing,
            "consecutive_failures": self.consecutive,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "retry_at": self.retry_at if self.backing_off(now) else None,
        }


@dataclass(frozen=True)
class Failure:
    """One entry of the latest-failures list."""

    time: float
    kind: str
    pool: str
    vm: str
    request_id: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def record_failure(
    redis_client: redis.Redis,
    keys: Keys,
    kind: FailureKind,
    *,
    pool: str,
    reason: str,
    vm: str = "",
    request_id: str = "",
    permanent: bool = False,
) -> Streak:
    """Note a failure in the latest-failures list; a create's also in its pool's streak.

    ``permanent`` (a create only): retrying cannot help, the pool's top-ups back off.
    Returns the pool's streak (length 0 for a boot or a request)."""
    entry = {"pool": pool, "vm": vm, "request_id": request_id, "reason": reason[:MAX_REASON]}
    script = redis_client.register_script(read_script("vmpool.state.scripts", "pool_failure.lua"))
    streak_key = keys.pool_failures(pool) if kind == "create" else keys.recent_failures
    reply = script(
        keys=[keys.recent_failures, streak_key],
        args=[
            kind,
            "1" if permanent else "0",
            repr(BACKOFF_FIRST_S),
            repr(BACKOFF_MAX_S),
            RECENT_KEPT,
            json.dumps(entry),
        ],
    )
    retry_at = text(reply[1])
    return Streak(int(reply[0]), float(retry_at) if retry_at else None)


def streak_key_prefix(keys: Keys) -> str:
    """What comes before a pool's name in its failures hash's key (the scripts append it).

    The store's scripts end a pool's streak (its ``consecutive``, ``rounds`` and
    ``retry_at``; the last error stays) where they record a VM created: no round trip of
    its own, and a pool that never failed gains no key."""
    return keys.pool_failures("x")[: -len("x")]


def read_pool_failures(
    redis_client: redis.Redis, keys: Keys, pools: Iterable[str]
) -> tuple[float, dict[str, PoolFailures]]:
    """Redis server time and each pool's failures, in one round trip."""
    names = list(pools)
    pipe = redis_client.pipeline(transaction=False)
    pipe.time()
    for pool in names:
        pipe.hgetall(keys.pool_failures(pool))
    reply = pipe.execute()
    seconds, micros = reply[0]
    now = float(seconds) + float(micros) / 1e6
    return now, {
        pool: _pool_failures(pool, decode_hash(raw))
        for pool, raw in zip(names, reply[1:], strict=True)
    }


def _pool_failures(pool: str, h: dict[str, str]) -> PoolFailures:
    return PoolFailures(
        pool=pool,
        consecutive=int(h.get("consecutive") or 0),
        last_error=h.get("last_error", ""),
        last_error_at=float(h["last_error_at"]) if h.get("last_error_at") else None,
        retry_at=float(h["retry_at"]) if h.get("retry_at") else None,
    )


def latest_failures(
    redis_client: redis.Redis, keys: Keys, limit: int = RECENT_KEPT
) -> list[Failure]:
    """The fleet's latest failures, newest first (an entry that does not parse is left out)."""
    out: list[Failure] = []
    for raw in redis_client.lrange(keys.recent_failures, 0, max(0, limit - 1)):
        try:
            d = json.loads(text(raw))
            out.append(
                Failure(
                    time=float(d["time"]),
                    kind=str(d["kind"]),
                    pool=str(d.get("pool", "")),
                    vm=str(d.get("vm", "")),
                    request_id=str(d.get("request_id", "")),
                    reason=str(d.get("reason", "")),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out

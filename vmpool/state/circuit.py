"""Per-provider circuit breakers, shared through Redis by every worker process.

The breaker: after ``threshold`` consecutive transient create failures at one provider
(a cloud that is down, throttling hard, out of capacity), its pools stop creating for
``cooldown_s``. Reservations wait, and the pending sweep dispatches their creates
again. They do not burn every request's retries against a cloud that cannot answer.

- After the cool-down, creates go through again.
- The first failure then opens the circuit again at once (the count is still at the
  threshold). A success closes it.
- The count and the check are one Lua unit (``vmpool/state/scripts/provider_circuit.lua``),
  so workers failing together open it once.

The quota hold lives in the same hash. A create the cloud refused for quota or capacity
(:class:`vmpool.providers.QuotaExceededError`) stops the provider's creates for a while
(``provider_quota.lua``). It does not count toward the breaker. The waiting
reservations then do not ask a cloud that already said no.

One read tells a create whether either holds it back (:meth:`ProviderCircuit.held_back`).
Time is the Redis server's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.records import decode_hash, text

__all__ = ["CircuitState", "HoldReason", "ProviderCircuit", "read_states"]

# Why a provider's creates are held back ('' when they are not).
HoldReason = Literal["", "circuit_open", "quota"]


@dataclass(frozen=True)
class CircuitState:
    """One provider's breaker as read now: ``open`` while ``open_until`` is ahead."""

    provider: str
    open: bool
    failures: int
    open_until: float | None
    opened: int
    last_error: str
    # the quota hold: creates wait while quota_until is ahead (quota_held: times it held)
    quota: bool = False
    quota_until: float | None = None
    quota_held: int = 0
    quota_error: str = ""

    @property
    def held_back(self) -> HoldReason:
        """Why the provider's creates wait now, '' when they do not."""
        if self.open:
            return "circuit_open"
        return "quota" if self.quota else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "circuit": "open" if self.open else "closed",
            "consecutive_failures": self.failures,
            "open_until": self.open_until if self.open else None,
            "opened_total": self.opened,
            "last_error": self.last_error,
            "quota": "held" if self.quota else "free",
            "quota_until": self.quota_until if self.quota else None,
            "quota_held_total": self.quota_held,
            "quota_error": self.quota_error,
        }


class ProviderCircuit:
    """The breakers of a fleet's providers (one hash per provider)."""

    def __init__(
        self, redis_client: redis.Redis, keys: Keys, threshold: int, cooldown_s: float
    ) -> None:
        if threshold < 1 or cooldown_s <= 0:
            raise ValueError(f"bad circuit settings: threshold {threshold}, cool-down {cooldown_s}")
        self.redis = redis_client
        self.keys = keys
        self.threshold = int(threshold)
        self.cooldown_s = float(cooldown_s)
        self._script = redis_client.register_script(
            read_script("vmpool.state.scripts", "provider_circuit.lua")
        )
        self._quota = redis_client.register_script(
            read_script("vmpool.state.scripts", "provider_quota.lua")
        )

    def failure(self, provider: str, message: str) -> bool:
        """Count a failed create. True when this failure opened the circuit."""
        reply = self._script(
            keys=[self.keys.provider_circuit(provider)],
            args=["failure", self.threshold, repr(self.cooldown_s), message[:500]],
        )
        return int(reply[0]) == 1

    def success(self, provider: str) -> None:
        """A create went through: the circuit closes and the count starts again."""
        self._script(keys=[self.keys.provider_circuit(provider)], args=["success"])

    def is_open(self, provider: str) -> bool:
        return self.states([provider])[0].open

    def hold_for_quota(self, provider: str, message: str, wait_s: float) -> float:
        """The cloud said quota: the provider's creates wait ``wait_s``. Returns its end."""
        reply = self._quota(
            keys=[self.keys.provider_circuit(provider)], args=[repr(float(wait_s)), message[:500]]
        )
        return float(text(reply[0]))

    def held_back(self, provider: str) -> HoldReason:
        """Why a create at ``provider`` must wait now (one read), '' when it may go."""
        return self.states([provider])[0].held_back

    def states(self, providers: Iterable[str]) -> list[CircuitState]:
        """Every named provider's breaker, in one round trip (server time included)."""
        return read_states(self.redis, self.keys, providers)


def read_states(
    redis_client: redis.Redis, keys: Keys, providers: Iterable[str]
) -> list[CircuitState]:
    """The breakers of ``providers`` without a script (the API and /metrics read them)."""
    names = list(providers)
    pipe = redis_client.pipeline(transaction=False)
    pipe.time()
    for name in names:
        pipe.hgetall(keys.provider_circuit(name))
    reply = pipe.execute()
    seconds, micros = reply[0]
    now = float(seconds) + float(micros) / 1e6
    return [_state(name, decode_hash(raw), now) for name, raw in zip(names, reply[1:], strict=True)]


def _state(provider: str, h: dict[str, str], now: float) -> CircuitState:
    until = float(h["open_until"]) if h.get("open_until") else None
    quota_until = float(h["quota_until"]) if h.get("quota_until") else None
    return CircuitState(
        provider=provider,
        open=until is not None and until > now,
        failures=int(h.get("failures", 0) or 0),
        open_until=until,
        opened=int(h.get("opened", 0) or 0),
        last_error=text(h.get("last_error", "")),
        quota=quota_until is not None and quota_until > now,
        quota_until=quota_until,
        quota_held=int(h.get("quota_held", 0) or 0),
        quota_error=text(h.get("quota_error", "")),
    )

"""Per-provider circuit breakers, shared through Redis by every worker process.

After ``threshold`` consecutive transient create failures at one provider (a cloud that
is down, throttling hard, out of capacity), the provider's pools stop creating for
``cooldown_s``: reservations wait (the pending sweep dispatches their creates again)
instead of burning every request's retries against a cloud that cannot answer. After
the cool-down creates go through again; the first failure opens the circuit again at
once (the count is still at the threshold), a success closes it. The count and the
check are one Lua unit (``vmpool/state/scripts/provider_circuit.lua``), so workers
failing together open it once.
Time is the Redis server's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.records import decode_hash, text

__all__ = ["CircuitState", "ProviderCircuit", "read_states"]


@dataclass(frozen=True)
class CircuitState:
    """One provider's breaker as read now: ``open`` while ``open_until`` is ahead."""

    provider: str
    open: bool
    failures: int
    open_until: float | None
    opened: int
    last_error: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "circuit": "open" if self.open else "closed",
            "consecutive_failures": self.failures,
            "open_until": self.open_until if self.open else None,
            "opened_total": self.opened,
            "last_error": self.last_error,
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

    def failure(self, provider: str, message: str) -> bool:
        """Count a failed create; True when this failure opened the circuit."""
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
    return CircuitState(
        provider=provider,
        open=until is not None and until > now,
        failures=int(h.get("failures", 0) or 0),
        open_until=until,
        opened=int(h.get("opened", 0) or 0),
        last_error=text(h.get("last_error", "")),
    )

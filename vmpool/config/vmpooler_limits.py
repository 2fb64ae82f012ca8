"""vmpooler 3.8/3.9's rate limiter, circuit breaker and adaptive timeout keys in `:config:`.

Mapped onto vmpool's own settings where the meaning is the same, else a warning names
the key and what vmpool does instead (:data:`LIMITS` says which, for each key):

- ``circuit_breaker_failure_threshold`` (failures in a row that open a provider's
  circuit) is ``provider_circuit_failures``; ``circuit_breaker_timeout`` (seconds it
  stays open) is ``provider_circuit_cooldown``. vmpool's own key wins when both are given.
- ``circuit_breaker_enabled: false``: vmpool's circuit is always on.
- ``circuit_breaker_half_open_attempts`` other than 1: vmpool closes the circuit on the
  first success after the cool-down.
- ``adaptive_timeout_enabled: true`` and ``connection_pool_timeout_*``: vmpool has no
  adaptive timeout (a provider's own timeout bounds each call).
- ``rate_limiting_enabled: true`` and ``rate_limits``: vmpooler limits requests per
  client address or token and per kind of endpoint, GETs included; vmpool limits a
  user's POST and DELETE calls (``:auth: rate_limit_per_minute``). Not the same limit,
  so not mapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from vmpool.providers.options import show

__all__ = ["LIMITS", "LIMIT_KEYS", "Mapped", "map_limits"]

# vmpooler's key -> vmpool's :config: key of the same meaning.
LIMIT_KEYS: Final = MappingProxyType(
    {
        "circuit_breaker_failure_threshold": "provider_circuit_failures",
        "circuit_breaker_timeout": "provider_circuit_cooldown",
    }
)
_PREFIX = "vmpooler 3.8/3.9's"
_ADAPTIVE = (
    "adaptive_timeout_enabled",
    "connection_pool_timeout_min",
    "connection_pool_timeout_max",
    "connection_pool_timeout_initial",
)
_RATE = ("rate_limiting_enabled", "rate_limits")
# What vmpool does instead of each key whose meaning it has not.
_INSTEAD: Final = MappingProxyType(
    {
        "circuit_breaker_enabled": "its circuit cannot be turned off in vmpool: the provider"
        " circuit is always on (provider_circuit_failures); ignored",
        "circuit_breaker_half_open_attempts": "key ignored: vmpool closes a provider's"
        " circuit on the first success after its cool-down",
        "adaptive_timeout": "adaptive timeout is not in vmpool: a provider's own timeout"
        " option bounds each call; ignored",
        "rate_limiting": "per-address rate limiter is not vmpool's: vmpool limits each"
        " user's POST and DELETE calls with :auth: rate_limit_per_minute; ignored",
    }
)
_GIVEN = "`true` or a value is a warning: "
# Every key, with what vmpool does with it (docs/migrating-from-vmpooler.md's table).
LIMITS: Final = MappingProxyType(
    {
        **{key: f"read as `{ours}`" for key, ours in LIMIT_KEYS.items()},
        "circuit_breaker_enabled": "`false` is a warning: " + _INSTEAD["circuit_breaker_enabled"],
        "circuit_breaker_half_open_attempts": "other than 1 is a warning: vmpool closes a"
        " provider's circuit on the first success after its cool-down",
        **{
            key: "`true` or a value is a warning: " + _INSTEAD["adaptive_timeout"]
            for key in _ADAPTIVE
        },
        **{key: "`true` or a value is a warning: " + _INSTEAD["rate_limiting"] for key in _RATE},
    }
)


@dataclass
class Mapped:
    """The warnings (key, message) and, for each vmpool key set, the key written."""

    warnings: list[tuple[str, str]] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)


def map_limits(config: dict[str, Any]) -> Mapped:
    """Set vmpool's keys in ``config`` (a ``:config:`` section) from vmpooler's."""
    out = Mapped()
    for theirs, ours in LIMIT_KEYS.items():
        value = config.get(theirs)
        if value is None:
            continue
        if config.get(ours) is not None:
            out.warnings.append((theirs, f"{_PREFIX} key ignored: {ours} is given too"))
            continue
        config[ours] = value
        out.origins[ours] = f"config.{theirs}"
    out.warnings += [(key, f"{_PREFIX} {why}") for key, why in _not_honoured(config)]
    return out


def _not_honoured(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The keys whose meaning vmpool has not, each with what vmpool does instead."""
    found: list[tuple[str, str]] = []
    if config.get("circuit_breaker_enabled") is False:
        found.append(("circuit_breaker_enabled", _INSTEAD["circuit_breaker_enabled"]))
    attempts = config.get("circuit_breaker_half_open_attempts")
    if attempts is not None and attempts != 1:
        key = "circuit_breaker_half_open_attempts"
        found.append((key, f"{_INSTEAD[key]} (not after {show(attempts)})"))
    for keys, why in ((_ADAPTIVE, "adaptive_timeout"), (_RATE, "rate_limiting")):
        given = [key for key in keys if config.get(key) not in (None, False)]
        if given:
            found.append((given[0], _INSTEAD[why]))
    return found

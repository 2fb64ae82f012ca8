"""The types of ``:redis:``'s connection settings.

They are the fields of :class:`~vmpool.config.settings.RedisSection`: timeouts, the
durability of acknowledged writes, Sentinel addresses. As in :mod:`vmpool.config.fields`,
each carries its bounds and the line that says what a value must be.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidatorFunctionWrapHandler, WrapValidator

from vmpool.config.fields import text
from vmpool.providers.options import expect, integer, invalid, number, show
from vmpool.state.durability import DURABILITY_MODES, DurabilityMode
from vmpool.state.redis_target import SENTINEL_PORT

__all__ = [
    "DurabilityModeName",
    "HealthCheckSeconds",
    "RedisTimeoutSeconds",
    "ReplicaCount",
    "SentinelHosts",
]

# A reply slower than 0.1 s is not yet a dead connection. One slower than 5 minutes
# leaves a frozen connection unnoticed for longer than any request's TTL should be.
RedisTimeoutSeconds = Annotated[
    float,
    Field(ge=0.1, le=300, allow_inf_nan=False),
    expect("a number of seconds from 0.1 to 300", number),
]
HealthCheckSeconds = Annotated[
    float,
    Field(ge=0, le=3600, allow_inf_nan=False),
    expect("a number of seconds from 0 (never) to 3600", number),
]
# WAIT for more replicas than a group has never succeeds. 16 is far above any.
ReplicaCount = Annotated[int, Field(ge=1, le=16), expect("an integer from 1 to 16", integer)]


def _durability_mode(value: Any) -> str:
    name = text(value).lower()
    if name not in DURABILITY_MODES:
        raise invalid(f"must be one of {', '.join(DURABILITY_MODES)}, got {show(value)}")
    return name


DurabilityModeName = Annotated[DurabilityMode, BeforeValidator(_durability_mode)]


def _sentinel_host(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise invalid(f"must be a 'host:port' string, got {show(value)}")
    host, colon, port = value.strip().rpartition(":")
    if not colon:
        host, port = value.strip(), str(SENTINEL_PORT)
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise invalid(f"must be 'host:port' with a port from 1 to 65535, got {show(value)}")
    return f"{host.strip('[]')}:{int(port)}"


def _host_list(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A single 'host:port' stands for a list of one."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise invalid(f"must be a list of 'host:port' sentinels, got {show(value)}")
    return handler(value)


SentinelHosts = Annotated[
    tuple[Annotated[str, BeforeValidator(_sentinel_host)], ...],
    WrapValidator(_host_list, json_schema_input_type=list[str]),
]

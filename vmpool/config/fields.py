"""The types the settings are made of.

Each type carries its bounds and the one line that says what a value must be. A setting
(:mod:`vmpool.config.settings`) only picks a type and gives a default, a unit and a
description.

Units: vmpooler gives some durations in minutes or hours. A field declares its unit
with :func:`minutes`, :func:`hours` or :func:`seconds`. :func:`in_seconds` reads a value
back in seconds, the unit of every ``_s`` attribute of :class:`vmpool.config.Config`.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from vmpool.config.redis_url import validate_redis_url
from vmpool.ids import (
    POOL_NAME_RE,
    InvalidIdentifier,
    validate_key_prefix,
    validate_pool_name,
)
from vmpool.providers.options import expect, integer, invalid, number, problems, show

__all__ = [
    "DAY_S",
    "NAME_RULE",
    "UNITS",
    "YEAR_S",
    "Aliases",
    "AuthProvider",
    "BatchLanes",
    "CircuitFailures",
    "DataTtlHours",
    "Domain",
    "FleetCount",
    "GraceSeconds",
    "HoldMinutes",
    "HostnamePrefix",
    "InstanceCount",
    "IntervalSeconds",
    "KeyPrefix",
    "LockSeconds",
    "NonNegativeInt",
    "NonNegativeNumber",
    "Password",
    "PasswordHash",
    "PoolName",
    "PoolSize",
    "Port",
    "PositiveInt",
    "PositiveNumber",
    "RedisUrl",
    "RetryCount",
    "Section",
    "Text",
    "TtlHours",
    "TtlMinutes",
    "Weight",
    "hours",
    "in_seconds",
    "minutes",
    "seconds",
    "text",
]

UNITS: Final = MappingProxyType({"seconds": 1.0, "minutes": 60.0, "hours": 3600.0})


class Section(BaseModel):
    """The base of every section of the file: frozen, unknown keys left to the reader."""

    # Defaults are validated too, so that a duration is a float whether given or not.
    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=True)


PositiveNumber = Annotated[
    float, Field(gt=0, allow_inf_nan=False), expect("a positive number", number)
]
NonNegativeNumber = Annotated[
    float, Field(ge=0, allow_inf_nan=False), expect("a non-negative number", number)
]
PositiveInt = Annotated[int, Field(ge=1), expect("a positive integer", integer)]
NonNegativeInt = Annotated[int, Field(ge=0), expect("a non-negative integer", integer)]

# -- bounded durations and counts ----------------------------------------------------------
# Every duration and count the fleet acts on has an upper bound as well as a lower one:
# an unbounded value loads fine and breaks at run time instead (a data_ttl of 1e300 hours
# makes the PEXPIRE inside a transition script fail after the status is written. A
# data_ttl of 1e-9 hours rounds to PEXPIRE 0, which deletes the tombstone at once). A
# year is far below Redis' PEXPIRE limit (2**63 ms) and above any lifetime vmpooler
# users set. Request TTLs, timeouts and lifetimes go down to 0.1 s (the tests use
# sub-second TTLs. Below that the sweeps cannot tell them from 0). A record's tombstone
# (data_ttl) lives at least a minute, longer than the jobs that may still name it.

YEAR_S: Final = 365 * 86400.0
DAY_S: Final = 86400.0

TtlMinutes = Annotated[
    float,
    Field(ge=0.1 / 60, le=YEAR_S / 60, allow_inf_nan=False),
    expect("a number of minutes from 1/600 (0.1 second) to 525600 (a year)", number),
]
# How long a VM whose ready check failed is kept for debugging: 0 (not kept) to a week.
HoldMinutes = Annotated[
    float,
    Field(ge=0, le=7 * DAY_S / 60, allow_inf_nan=False),
    expect("a number of minutes from 0 (none) to 10080 (a week)", number),
]
TtlHours = Annotated[
    float,
    Field(ge=0.1 / 3600, le=YEAR_S / 3600, allow_inf_nan=False),
    expect("a number of hours from 1/36000 (0.1 second) to 8760 (a year)", number),
]
DataTtlHours = Annotated[
    float,
    Field(ge=1 / 60, le=YEAR_S / 3600, allow_inf_nan=False),
    expect("a number of hours from 1/60 (1 minute) to 8760 (a year)", number),
]
# A lock shorter than a second expires under an ordinary pause. One longer than a day
# keeps a dead worker's VM or request locked for that long.
LockSeconds = Annotated[
    float,
    Field(ge=1, le=DAY_S, allow_inf_nan=False),
    expect("a number of seconds from 1 to 86400 (a day)", number),
]
GraceSeconds = Annotated[
    float,
    Field(ge=0, le=DAY_S, allow_inf_nan=False),
    expect("a number of seconds from 0 to 86400 (a day)", number),
]
# Below 0.1 s a periodic job would be queued faster than a worker can take it. Above a
# day the expiry sweep's interval would be the bound of invariant 4 (docs/invariants.md).
IntervalSeconds = Annotated[
    float,
    Field(ge=0.1, le=DAY_S, allow_inf_nan=False),
    expect("a number of seconds from 0.1 to 86400 (a day)", number),
]
MAX_COUNT: Final = 10_000
InstanceCount = Annotated[
    int, Field(ge=1, le=MAX_COUNT), expect(f"an integer from 1 to {MAX_COUNT}", integer)
]
PoolSize = Annotated[
    int,
    Field(ge=0, le=MAX_COUNT),
    expect(f"a non-negative integer (0 to {MAX_COUNT})", integer),
]
# The clone limit is a semaphore's size, not a number of VMs asked for at once: a
# million stands for "no limit" (the benches use that), and still fits a sorted set.
MAX_FLEET_COUNT: Final = 1_000_000
FleetCount = Annotated[
    int,
    Field(ge=1, le=MAX_FLEET_COUNT),
    expect(f"an integer from 1 to {MAX_FLEET_COUNT}", integer),
]
# Backend weights are summed by random.choices, which refuses a total that is not finite
# (two weights of 1e308 loaded, and every request of their alias then failed).
MAX_WEIGHT: Final = 1_000_000.0
Weight = Annotated[
    float,
    Field(ge=0, le=MAX_WEIGHT, allow_inf_nan=False),
    expect("a number from 0 to 1000000", number),
]
# Consecutive failed creates that open a provider's circuit (vmpool/state/circuit.py).
CircuitFailures = Annotated[int, Field(ge=1, le=1000), expect("an integer from 1 to 1000", integer)]
RetryCount = Annotated[int, Field(ge=0, le=100), expect("an integer from 0 to 100", integer)]
# Batch jobs of one kind queued or running at once (workers/batching.py): each dispatch
# checks two job ids per lane, so the bound keeps that a small constant.
MAX_BATCH_LANES: Final = 64
BatchLanes = Annotated[
    int,
    Field(ge=1, le=MAX_BATCH_LANES),
    expect(f"an integer from 1 to {MAX_BATCH_LANES}", integer),
]


def text(value: Any) -> str:
    """A non-empty string, stripped. A number in its place is taken as written."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise invalid(f"must be a string, got {show(value)}")
    stripped = str(value).strip()
    if not stripped:
        raise invalid("must not be empty")
    return stripped


Text = Annotated[str, BeforeValidator(text)]

# -- names ---------------------------------------------------------------------------------

NAME_RULE: Final = "1-128 letters, digits, '-', '_' or '.', starting with a letter or digit"
_NAME_SCHEMA: Final = Field(pattern=f"^{POOL_NAME_RE.pattern}$")


def _name(what: str) -> BeforeValidator:
    """A pool name (or an alias: ``what`` names the thing in the type error)."""

    def validate(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise invalid(f"must be {what}, got {show(value)}")
        try:
            return validate_pool_name(str(value))
        except InvalidIdentifier:
            raise invalid(f"must be {NAME_RULE}, got {show(value)}") from None

    return BeforeValidator(validate)


PoolName = Annotated[str, _NAME_SCHEMA, _name("a string")]
AliasName = Annotated[str, _NAME_SCHEMA, _name("a name")]


def _one_or_list(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A single name stands for a list of one. Its problem is named as the name's."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        try:
            return handler([value])
        except ValidationError as exc:
            raise invalid(problems(exc)[0][1]) from None
    if not isinstance(value, (list, tuple)):
        raise invalid(f"must be a name or a list of names, got {show(value)}")
    return handler(value)


Aliases = Annotated[
    tuple[AliasName, ...],
    WrapValidator(_one_or_list, json_schema_input_type=AliasName | list[AliasName]),
]

_DOMAIN_RE: Final = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


def _domain(value: Any) -> str:
    name = text(value).rstrip(".").lower()
    if not _DOMAIN_RE.fullmatch(name):
        raise invalid(f"must be a DNS domain name, got {show(value)}")
    return name


Domain = Annotated[str, BeforeValidator(_domain)]

_HOSTNAME_PREFIX_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def _hostname_prefix(value: Any) -> str:
    if value == "":
        return ""
    if not isinstance(value, str) or not _HOSTNAME_PREFIX_RE.fullmatch(value):
        raise invalid(
            "must be up to 32 lowercase letters, digits or '-' (it starts every VM"
            f" hostname), got {show(value)}"
        )
    return value


HostnamePrefix = Annotated[
    str,
    Field(pattern=f"^(?:{_HOSTNAME_PREFIX_RE.pattern})?$"),
    BeforeValidator(_hostname_prefix),
]


def _key_prefix(value: Any) -> str:
    try:
        return validate_key_prefix(value)
    except InvalidIdentifier as exc:
        # The rule is worded in vmpool.ids. The value is shown as every message here shows it.
        rule = str(exc).rsplit(", got ", 1)[0]
        raise invalid(f"{rule}, got {show(value)}") from None


KeyPrefix = Annotated[str, BeforeValidator(_key_prefix)]

# -- redis ---------------------------------------------------------------------------------


def _redis_url(value: Any) -> str:
    if not isinstance(value, str):
        raise invalid(f"must be a URL string, got {show(value)}")
    try:
        return validate_redis_url(value)
    except ValueError as exc:
        raise invalid(str(exc)) from None


RedisUrl = Annotated[str, BeforeValidator(_redis_url)]


def _port(value: Any, handler: ValidatorFunctionWrapHandler) -> int:
    try:
        port = integer(value)
    except (TypeError, ValueError):
        port = 0
    if port < 1:
        raise invalid(f"must be a positive integer, got {show(value)}")
    try:
        return int(handler(port))
    except ValidationError:
        raise invalid(f"must be a TCP port (1-65535), got {port}") from None


Port = Annotated[int, Field(ge=1, le=65535), WrapValidator(_port)]


def _password(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise invalid("must be a string")
    return str(value)


Password = Annotated[str, BeforeValidator(_password)]

# -- auth ----------------------------------------------------------------------------------

_SHA256_HASH_RE: Final = re.compile(r"sha256\$[^$]+\$[0-9a-fA-F]{64}")
_PBKDF2_HASH_RE: Final = re.compile(r"pbkdf2_sha256\$[1-9][0-9]*\$[^$]+\$[0-9a-fA-F]{64}")


def _password_hash(value: Any) -> str:
    if not isinstance(value, str) or not (
        _SHA256_HASH_RE.fullmatch(value) or _PBKDF2_HASH_RE.fullmatch(value)
    ):
        raise invalid(
            "must be a password hash ('sha256$<salt>$<hex>' or"
            " 'pbkdf2_sha256$<iterations>$<salt>$<hex>'), not a plain password"
        )
    return value


PasswordHash = Annotated[str, BeforeValidator(_password_hash)]

AUTH_PROVIDERS: Final = ("static", "dummy", "ldap")


def _auth_provider(value: Any) -> str:
    name = text(value)
    if name not in AUTH_PROVIDERS:
        raise invalid(
            f"{name!r} is not implemented: use 'static' (users with password hashes), 'ldap'"
            " or 'dummy'"
        )
    return name


AuthProvider = Annotated[Literal["static", "dummy", "ldap"], BeforeValidator(_auth_provider)]

# -- units ---------------------------------------------------------------------------------


def _duration(default: float | None, unit: str, description: str) -> Any:
    return Field(
        default=default,
        description=f"{description}. Unit: {unit}.",
        json_schema_extra={"unit": unit},
    )


def seconds(default: float | None, description: str) -> Any:
    """A field given in seconds."""
    return _duration(default, "seconds", description)


def minutes(default: float | None, description: str) -> Any:
    """A field given in minutes (vmpooler's unit for timeouts and TTLs)."""
    return _duration(default, "minutes", description)


def hours(default: float | None, description: str) -> Any:
    """A field given in hours (vmpooler's unit for lifetimes and data TTL)."""
    return _duration(default, "hours", description)


def in_seconds(section: BaseModel, name: str) -> float | None:
    """Field ``name`` of ``section`` in seconds, whatever unit the file gives it in."""
    value = getattr(section, name)
    if value is None:
        return None
    extra = type(section).model_fields[name].json_schema_extra
    unit = extra.get("unit") if isinstance(extra, dict) else None
    if not isinstance(unit, str):
        raise TypeError(f"{type(section).__name__}.{name} declares no unit")
    return float(value) * UNITS[unit]

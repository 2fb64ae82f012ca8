"""The ``:quotas:`` section of the configuration file: each user's share of the fleet and
the priority their on-demand requests take, its settings' types, bounds, defaults and
meaning, and its resolution into the :class:`~vmpool.config.model.QuotaConfig` the rest
of vmpool reads.

A part of :mod:`vmpool.config.settings`, which holds the file's other sections and
imports this one: read together, they are the one place a setting is written.

Unlike the other sections, a key nobody knows is an error here, not a warning: a quota
misspelt (``max_vm: 2``) and ignored would limit nobody while its writer believes it
does.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, ConfigDict, Field

from vmpool.config.fields import MAX_FLEET_COUNT, Section, in_seconds, seconds
from vmpool.config.quotas import Quota, QuotaConfig
from vmpool.ids import USER_NAME_RE, InvalidIdentifier, validate_user_name
from vmpool.providers.options import expect, integer, invalid, number, show

__all__ = ["DEFAULT_PRIORITY", "QuotaEntry", "QuotasSection", "build_quotas"]

# ABS's convention: 1 is the highest priority, 3 the lowest; a request that names none
# and whose user has no priority of their own takes 2.
DEFAULT_PRIORITY: Final = 2

_Priority = Annotated[int, Field(ge=1, le=3), expect("1, 2 or 3 (1 is the highest)", integer)]
# 0 is a quota too: the user may hold nothing (every request and checkout refused).
_QuotaCount = Annotated[
    int,
    Field(ge=0, le=MAX_FLEET_COUNT),
    expect(f"an integer from 0 to {MAX_FLEET_COUNT}", integer),
]
# A request's priority rises one level per this wait; below a second the levels would
# mean nothing, above a day no request lives that long (its TTL ends first).
_AgingSeconds = Annotated[
    float,
    Field(ge=1, le=86400, allow_inf_nan=False),
    expect("a number of seconds from 1 to 86400 (a day)", number),
]


def _user_name(value: Any) -> str:
    """A user name as tokens carry it (vmpool.ids): the key of a user's quota."""
    if not isinstance(value, str):
        raise invalid(f"must be a user name, got {show(value)}")
    try:
        return validate_user_name(value)
    except InvalidIdentifier as exc:
        raise invalid(str(exc)) from None


_UserName = Annotated[str, Field(pattern=f"^{USER_NAME_RE.pattern}$"), BeforeValidator(_user_name)]


class QuotaEntry(Section):
    """One user's quota (``:quotas: users: NAME:``) or everyone's (``:quotas: default:``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    max_vms: _QuotaCount | None = Field(
        default=None,
        description="VMs the user may hold or have in the making at once: on-demand VMs"
        " reserved, booting or ready, and warm VMs checked out (default: no limit)",
    )
    max_cores: _QuotaCount | None = Field(
        default=None,
        description="vCPUs those VMs may have in all, as their provider counts a VM's cores"
        " (1 for a provider that does not say; default: no limit)",
    )
    priority: _Priority | None = Field(
        default=None,
        description="The priority of the user's requests that name none, and the highest"
        " they may name (1 highest, 3 lowest; default 2)",
    )


class QuotasSection(Section):
    """``:quotas:`` (vmpool's): quotas per user, and how request priorities age."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    default: QuotaEntry | None = Field(
        default=None,
        description="Every user's quota and priority, unless users names them: {max_vms,"
        " max_cores, priority}, each optional",
    )
    users: dict[_UserName, QuotaEntry] = Field(
        default_factory=dict,
        description="User name -> {max_vms, max_cores, priority}; a key left out takes the"
        " default's",
    )
    priority_aging: _AgingSeconds = seconds(
        300,
        "How long a waiting request takes to rise one priority level: a request of"
        " priority p that has waited k times this long is served as one of priority p - k"
        " arriving now, so none starves",
    )


def _merged(entry: QuotaEntry, default: Quota) -> Quota:
    """``entry`` with every key it leaves out taken from ``default``."""
    return Quota(
        max_vms=entry.max_vms if entry.max_vms is not None else default.max_vms,
        max_cores=entry.max_cores if entry.max_cores is not None else default.max_cores,
        priority=entry.priority if entry.priority is not None else default.priority,
    )


def build_quotas(section: QuotasSection | None, *, lower_case_users: bool) -> QuotaConfig:
    """The resolved quotas of ``section`` (absent: no quota, every priority 2 by default).

    ``lower_case_users``: the users are a directory's (LDAP matches names whatever their
    case, and a login's tokens carry the name lower-cased), so the keys are too.
    """
    section = section or QuotasSection()
    everyone = _merged(section.default or QuotaEntry(), Quota(None, None, DEFAULT_PRIORITY))
    users: dict[str, Quota] = {}
    for name, entry in section.users.items():
        users[name.lower() if lower_case_users else name] = _merged(entry, everyone)
    aging = in_seconds(section, "priority_aging")
    assert aging is not None  # the field has a default
    return QuotaConfig(
        default=everyone,
        users=MappingProxyType(dict(sorted(users.items()))),
        priority_aging_s=aging,
    )

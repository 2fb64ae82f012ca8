"""The ``:auth:`` section of the configuration file: its settings' types, bounds,
defaults and meaning (its ``ldap`` part: :mod:`vmpool.config.ldap`).

A part of :mod:`vmpool.config.settings`, which holds the file's other sections and
imports this one: read together, they are the one place a setting is written.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vmpool.config.fields import (
    AuthProvider,
    PasswordHash,
    PositiveInt,
    Section,
    Text,
    hours,
    seconds,
)
from vmpool.config.ldap import LdapSection
from vmpool.providers.options import expect, integer, number

__all__ = ["AuthSection"]

# The :auth: section's own bounds: a token lives at most a year (Redis' EXPIRE takes it).
# A count or window of 0 would refuse every login.
_TokenTtlHours = Annotated[
    float,
    Field(ge=1 / 3600, le=8760, allow_inf_nan=False),
    expect("a number of hours from 1/3600 (1 second) to 8760 (a year)", number),
]
_AuthCount = Annotated[int, Field(ge=1, le=10_000), expect("an integer from 1 to 10000", integer)]
_WindowSeconds = Annotated[
    float,
    Field(ge=1, le=86400, allow_inf_nan=False),
    expect("a number of seconds from 1 to 86400 (a day)", number),
]


class AuthSection(Section):
    """``:auth:``: who may create and delete requests. Absent: anyone may."""

    provider: AuthProvider = Field(
        default="static", description="'static' users, 'ldap' (a directory), or 'dummy' (anyone)"
    )
    users: dict[str, PasswordHash] = Field(
        default_factory=dict,
        description="User name -> password hash (pbkdf2_sha256$... or sha256$...)",
    )
    users_file: Text | None = Field(
        default=None,
        description="A YAML file mapping more users to password hashes (a mounted Kubernetes"
        " Secret); relative to the config file",
    )
    rate_limit_per_minute: PositiveInt | None = Field(
        default=None, description="POST and DELETE calls per minute per user (default: no limit)"
    )
    token_ttl: _TokenTtlHours | None = hours(
        None, "How long a token minted by POST /token lives (default: no expiry)"
    )
    max_tokens_per_user: _AuthCount = Field(
        default=100, description="Live tokens a user may hold; one more drops the oldest"
    )
    max_failed_logins_per_user: _AuthCount = Field(
        default=10, description="Failed logins of one user name per window before 429"
    )
    max_failed_logins_per_address: _AuthCount = Field(
        default=50, description="Failed logins from one client address per window before 429"
    )
    failed_login_window: _WindowSeconds = seconds(
        300, "How long failed logins are counted (from the first failure)"
    )
    ldap: LdapSection | None = Field(
        default=None,
        description="provider ldap: vmpooler's {host, port, base, user_object, encryption,"
        " service_account_hash}",
    )
    checkout_requires_token: bool = Field(
        default=False,
        description="POST /vm and POST /vm/<pool> need a token too (vmpooler's do not: a"
        " VM handed out without one gets vm_lifetime)",
    )
    admins: list[Text] = Field(
        default_factory=list,
        description="Users whose tokens may change pools at runtime (the experimental"
        " operator endpoints); nobody else may, with auth on",
    )

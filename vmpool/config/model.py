"""The configuration as the rest of vmpool reads it: resolved, immutable, in seconds.

Only :mod:`vmpool.config.build` makes a :class:`Config`, from a validated file (and
:mod:`vmpool.config.public` from its public form). Every default is applied: a pool's
timeout is the global one unless it has its own. The defaults themselves live in the
settings model (:mod:`vmpool.config.settings`) only: no field here has one, so whoever
makes a record gives every field. Every duration is in seconds (the ``_s``
attributes). Every mapping is read-only.

The order of the fields is the order ``vmpool config show`` prints them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vmpool.config.ldap import LdapConfig
from vmpool.config.quotas import Quota, QuotaConfig
from vmpool.config.settings import Schedule
from vmpool.state.connection import RedisOptions

__all__ = ["AuthConfig", "Config", "PoolConfig", "ProviderConfig", "Quota", "QuotaConfig"]


@dataclass(frozen=True)
class PoolConfig:
    name: str
    alias: tuple[str, ...]
    template: str
    size: int
    timeout_s: float
    provider: str
    ready_ttl_s: float | None
    domain: str | None
    clone_target: str | None
    ondemand_from_ready: bool
    hold_failed_s: float  # a VM failing its ready check is held this long (0: not held)
    # the pool's keys for its provider's class (its pool model validated them)
    provider_options: Mapping[str, Any]


@dataclass(frozen=True)
class ProviderConfig:
    """A provider instance: its class and its options as the file gives them.

    The class's options model validated the options. The provider validates them again
    when built.
    """

    name: str
    provider_class: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class AuthConfig:
    provider: str
    users: Mapping[str, str]
    rate_limit_per_minute: int | None
    token_ttl_s: float | None
    max_tokens_per_user: int
    max_failed_logins_per_user: int
    max_failed_logins_per_address: int
    failed_login_window_s: float
    admins: tuple[str, ...]  # sorted
    checkout_requires_token: bool  # else POST /vm hands out VMs without a token
    ldap: LdapConfig | None  # provider ldap


@dataclass(frozen=True)
class Config:
    source: str
    pools: Mapping[str, PoolConfig]
    providers: Mapping[str, ProviderConfig]
    ondemand_request_ttl_s: float
    ondemand_request_grace_s: float
    max_ondemand_instances_per_request: int
    max_ondemand_instances_total: int
    ondemand_clone_limit: int
    max_vm_retries: int
    vm_lifetime_s: float
    vm_lifetime_auth_s: float
    timeout_s: float
    data_ttl_s: float
    hostname_prefix: str
    key_prefix: str
    backend_weight: Mapping[str, float]
    redis_url: str | None
    redis_options: RedisOptions
    lock_expire_s: float
    reconcile_grace_s: float
    schedule: Schedule
    auth: AuthConfig | None
    quotas: QuotaConfig
    warnings: tuple[str, ...]
    task_limit: int
    batch_lanes: int
    max_lifetime_upper_limit_s: float | None
    tagfilter: Mapping[str, str]
    allowed_tags: tuple[str, ...] | None  # None: any tag name
    provider_circuit_failures: int
    provider_circuit_cooldown_s: float
    provider_quota_wait_s: float
    experimental_features: bool
    site_name: str

    def pool(self, name: str) -> PoolConfig:
        """The pool called ``name``. KeyError if there is none (aliases do not count)."""
        return self.pools[name]

    def resolve_name(self, name: str) -> list[str]:
        """The pools a requested name may select, in order.

        First the pool of that name, if any, then every pool that lists it as an alias, in
        file order. ``[]`` when nothing matches.
        """
        return list(self._pools_by_name.get(name, ()))

    @cached_property
    def _pools_by_name(self) -> dict[str, tuple[str, ...]]:
        """Every pool name and alias -> the pools it selects (resolve_name's order).

        Made once per config: every POST looks its names up two or three times, and a
        scan of every pool's aliases grows with the pools."""
        by_name: dict[str, list[str]] = {name: [name] for name in self.pools}
        for pool in self.pools.values():
            for alias in pool.alias:
                selected = by_name.setdefault(alias, [])
                if pool.name not in selected:
                    selected.append(pool.name)
        return {name: tuple(pools) for name, pools in by_name.items()}

"""The configuration as the rest of vmpool reads it: resolved, immutable, in seconds.

Only :mod:`vmpool.config.build` makes a :class:`Config`, from a validated file. Every
default is applied: a pool's timeout is the global one unless it has its own. Every
duration is in seconds (the ``_s`` attributes). Every mapping is read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import SecretStr

from vmpool.config.ldap import LdapConfig
from vmpool.config.redis_url import mask_url_password
from vmpool.config.settings import Schedule
from vmpool.state.connection import RedisOptions

__all__ = ["AuthConfig", "Config", "PoolConfig", "ProviderConfig"]


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
    ondemand_from_ready: bool = True
    # the pool's keys for its provider's class (its pool model validated them)
    provider_options: Mapping[str, Any] = field(default_factory=dict)


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
    token_ttl_s: float | None = None
    max_tokens_per_user: int = 100
    max_failed_logins_per_user: int = 10
    max_failed_logins_per_address: int = 50
    failed_login_window_s: float = 300.0
    admins: tuple[str, ...] = ()  # sorted
    ldap: LdapConfig | None = None  # provider ldap


@dataclass(frozen=True)
class Config:
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
    lock_expire_s: float
    reconcile_grace_s: float
    provider_circuit_failures: int
    provider_circuit_cooldown_s: float
    schedule: Schedule
    auth: AuthConfig | None
    source: str
    redis_options: RedisOptions
    warnings: tuple[str, ...] = field(default=())
    task_limit: int = 10
    batch_lanes: int = 4
    max_lifetime_upper_limit_s: float | None = None
    tagfilter: Mapping[str, str] = field(default_factory=dict)
    experimental_features: bool = False
    provider_quota_wait_s: float = 30.0

    def pool(self, name: str) -> PoolConfig:
        """The pool called ``name``. KeyError if there is none (aliases do not count)."""
        return self.pools[name]

    def resolve_name(self, name: str) -> list[str]:
        """The pools a requested name may select, in order.

        First the pool of that name, if any, then every pool that lists it as an alias, in
        file order. ``[]`` when nothing matches.
        """
        selected = [name] if name in self.pools else []
        for pool in self.pools.values():
            if name in pool.alias and pool.name not in selected:
                selected.append(pool.name)
        return selected

    def to_public_dict(self) -> dict[str, Any]:
        """The effective configuration as plain data, safe to print or serve.

        The Redis password and provider secrets are masked. Auth password hashes are left out.
        """
        return {
            "source": self.source,
            "pools": [_public_pool(pool) for pool in self.pools.values()],
            "providers": {
                name: {
                    "provider_class": prov.provider_class,
                    "options": {k: _mask_option(k, v) for k, v in prov.options.items()},
                }
                for name, prov in self.providers.items()
            },
            "ondemand_request_ttl_s": self.ondemand_request_ttl_s,
            "ondemand_request_grace_s": self.ondemand_request_grace_s,
            "max_ondemand_instances_per_request": self.max_ondemand_instances_per_request,
            "max_ondemand_instances_total": self.max_ondemand_instances_total,
            "ondemand_clone_limit": self.ondemand_clone_limit,
            "max_vm_retries": self.max_vm_retries,
            "vm_lifetime_s": self.vm_lifetime_s,
            "vm_lifetime_auth_s": self.vm_lifetime_auth_s,
            "timeout_s": self.timeout_s,
            "data_ttl_s": self.data_ttl_s,
            "hostname_prefix": self.hostname_prefix,
            "key_prefix": self.key_prefix,
            "backend_weight": dict(self.backend_weight),
            "redis_url": mask_url_password(self.redis_url) if self.redis_url else None,
            "redis_options": _public_redis_options(self.redis_options),
            "lock_expire_s": self.lock_expire_s,
            "reconcile_grace_s": self.reconcile_grace_s,
            "schedule": self.schedule.model_dump(),
            "auth": None if self.auth is None else _public_auth(self.auth),
            "warnings": list(self.warnings),
            "task_limit": self.task_limit,
            "batch_lanes": self.batch_lanes,
            "max_lifetime_upper_limit_s": self.max_lifetime_upper_limit_s,
            "tagfilter": dict(self.tagfilter),
            "provider_quota_wait_s": self.provider_quota_wait_s,
        }


def _public_pool(pool: PoolConfig) -> dict[str, Any]:
    return {
        "name": pool.name,
        "alias": list(pool.alias),
        "template": pool.template,
        "size": pool.size,
        "timeout_s": pool.timeout_s,
        "provider": pool.provider,
        "ready_ttl_s": pool.ready_ttl_s,
        "domain": pool.domain,
        "clone_target": pool.clone_target,
        "ondemand_from_ready": pool.ondemand_from_ready,
        "provider_options": {k: _mask_option(k, v) for k, v in pool.provider_options.items()},
    }


def _public_auth(auth: AuthConfig) -> dict[str, Any]:
    return {
        "provider": auth.provider,
        "users": sorted(auth.users),
        "rate_limit_per_minute": auth.rate_limit_per_minute,
    }


def _public_redis_options(options: RedisOptions) -> dict[str, Any]:
    return {
        "socket_timeout_s": options.socket_timeout_s,
        "connect_timeout_s": options.connect_timeout_s,
        "health_check_interval_s": options.health_check_interval_s,
        "durability": options.durability.mode,
        "durability_replicas": options.durability.replicas,
        "durability_timeout_s": options.durability.timeout_s,
    }


def _mask_option(key: str, value: Any) -> Any:
    """A provider's option as shown, a secret as ``***``.

    A secret is known by its name, or as a SecretStr a model kept. Nested sections count
    too, such as a pool's ``dns``.
    """
    lowered = key.lower()
    words = ("password", "secret", "token", "credential", "access_key")
    if any(word in lowered for word in words) or isinstance(value, SecretStr):
        return "***"
    if isinstance(value, Mapping):
        return {k: _mask_option(str(k), v) for k, v in value.items()}
    return value

"""From a validated file to the :class:`~vmpool.config.Config` vmpool runs with.

Here happens what no single setting can check alone:

- durations turned into seconds (each field declares its unit)
- defaults taken from other settings (a pool's timeout is ``config.timeout`` unless it
  has its own)
- references followed (a pool's provider and dns_plugin)
- each provider's options validated by its class's own model (from the registry)
- the Redis URL composed from its parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from vmpool.config.errors import ConfigError
from vmpool.config.fields import in_seconds
from vmpool.config.ldap import LdapConfig, build_ldap, ssl_version
from vmpool.config.model import AuthConfig, Config, PoolConfig, ProviderConfig
from vmpool.config.quota_settings import build_quotas
from vmpool.config.settings import (
    AuthSection,
    ConfigFile,
    ConfigSection,
    PoolSection,
    RedisSection,
    SentinelSection,
)
from vmpool.config.users_file import read_users_file
from vmpool.config.vmpooler import implemented
from vmpool.config.vmpooler_keys import CONFIG_PROVIDER_DEFAULTS, REDIS_URL_PARTS
from vmpool.providers.options import key_path, problems
from vmpool.providers.registry import DEFAULT_PROVIDER, provider_class
from vmpool.state.connection import RedisOptions
from vmpool.state.durability import DurabilitySetting
from vmpool.state.redis_target import SentinelTarget

__all__ = ["build", "default_redis_options"]


def build(file: ConfigFile, *, source: str, warnings: tuple[str, ...]) -> Config:
    """The configuration ``file`` describes. ConfigError when a reference is broken."""
    cfg = file.config
    vm_lifetime_s = _seconds(cfg, "vm_lifetime")
    data_ttl_s = in_seconds(cfg, "data_ttl") or _seconds(file.redis, "data_ttl")
    providers, unimplemented = _providers(file, source)
    pools = _Pools(file, source, providers, unimplemented).build()
    return Config(
        pools=MappingProxyType(pools),
        providers=MappingProxyType(providers),
        ondemand_request_ttl_s=_seconds(cfg, "ondemand_request_ttl"),
        ondemand_request_grace_s=_seconds(cfg, "ondemand_request_grace"),
        max_ondemand_instances_per_request=cfg.max_ondemand_instances_per_request,
        max_ondemand_instances_total=_total(cfg, len(pools)),
        ondemand_clone_limit=cfg.ondemand_clone_limit,
        max_vm_retries=cfg.max_vm_retries,
        vm_lifetime_s=vm_lifetime_s,
        vm_lifetime_auth_s=in_seconds(cfg, "vm_lifetime_auth") or vm_lifetime_s,
        timeout_s=_seconds(cfg, "timeout"),
        data_ttl_s=data_ttl_s,
        hostname_prefix=cfg.prefix,
        key_prefix=file.redis.key_prefix,
        backend_weight=MappingProxyType(dict(cfg.backend_weight)),
        redis_url=_redis_url(file.redis),
        redis_options=_redis_options(file.redis, source),
        lock_expire_s=_seconds(cfg, "lock_expire"),
        reconcile_grace_s=_seconds(cfg, "reconcile_grace"),
        provider_circuit_failures=cfg.provider_circuit_failures,
        provider_circuit_cooldown_s=_seconds(cfg, "provider_circuit_cooldown"),
        provider_quota_wait_s=_seconds(cfg, "provider_quota_wait"),
        schedule=file.schedule,
        auth=None if file.auth is None else _auth(file.auth, source),
        quotas=build_quotas(file.quotas, lower_case_users=_ldap_users(file.auth)),
        source=source,
        warnings=warnings
        + _unread_provider_defaults(cfg, providers.values(), source)
        + _ldap_warnings(file.auth, source),
        task_limit=cfg.task_limit,
        batch_lanes=cfg.batch_lanes,
        max_lifetime_upper_limit_s=in_seconds(cfg, "max_lifetime_upper_limit"),
        tagfilter=MappingProxyType(_tagfilter(file, source)),
        allowed_tags=None if cfg.allowed_tags is None else tuple(cfg.allowed_tags),
        experimental_features=cfg.experimental_features,
        site_name=cfg.site_name,
    )


def _unread_provider_defaults(
    cfg: ConfigSection, providers: Iterable[ProviderConfig], source: str
) -> tuple[str, ...]:
    """A warning for each of vmpooler's :config: provider keys that no provider reads."""
    classes = [provider_class(p.provider_class) for p in providers]
    read = {name for c in classes if c is not None for name in c.options.model_fields}
    return tuple(
        f"{source}: config.{key}: no provider here reads it (vsphere does); ignored"
        for key in CONFIG_PROVIDER_DEFAULTS
        if getattr(cfg, key) is not None and key not in read
    )


def _ldap_users(auth: AuthSection | None) -> bool:
    """Whether the users are a directory's (their names compared lower-cased)."""
    return auth is not None and auth.provider == "ldap"


def _ldap_warnings(auth: AuthSection | None, source: str) -> tuple[str, ...]:
    """A vmpooler LDAP setting vmpool does not honour as written (an obsolete ssl_version)."""
    if auth is None or auth.provider != "ldap" or auth.ldap is None:
        return ()
    try:
        _, warning = ssl_version(auth.ldap.encryption)
    except ValueError:  # the config error is raised where the LDAP settings are built
        return ()
    return () if warning is None else (f"{source}: auth.ldap.encryption: {warning}",)


def _tagfilter(file: ConfigFile, source: str) -> dict[str, str]:
    """vmpooler's :tagfilter: (tag name -> regular expression), compiled once here.

    A bad expression is then a config error, not a 500 on PUT /vm/<hostname>.
    """
    for name, pattern in file.tagfilter.items():
        try:
            re.compile(pattern)
        except re.error as exc:
            problem = f"not a regular expression: {exc}"
            raise ConfigError(source, f"tagfilter.{name}", problem) from None
    return dict(file.tagfilter)


def _total(cfg: ConfigSection, pools: int) -> int:
    """The most VMs of one request over all its names.

    The setting, else the sum of every pool's maximum: a config without it keeps its
    meaning.
    """
    if cfg.max_ondemand_instances_total is not None:
        return cfg.max_ondemand_instances_total
    return cfg.max_ondemand_instances_per_request * max(1, pools)


def _seconds(section: BaseModel, name: str) -> float:
    value = in_seconds(section, name)
    if value is None:
        raise TypeError(f"{type(section).__name__}.{name} has no default")
    return value


def _providers(file: ConfigFile, source: str) -> tuple[dict[str, ProviderConfig], dict[str, str]]:
    """The instances of implemented classes, and the others' classes by instance name."""
    providers: dict[str, ProviderConfig] = {}
    unimplemented: dict[str, str] = {}
    for name, entry in file.providers.items():
        class_name = str(entry.get("provider_class", name))
        options = {key: value for key, value in entry.items() if key != "provider_class"}
        implementation = provider_class(class_name)
        if implementation is None:
            unimplemented[name] = class_name
            continue
        for key in CONFIG_PROVIDER_DEFAULTS:  # vmpooler's :config: keys for its providers
            value = getattr(file.config, key)
            if value is not None and key in implementation.options.model_fields:
                options.setdefault(key, value)
        try:
            implementation.options.model_validate(options)
        except ValidationError as exc:
            loc, problem = problems(exc)[0]
            raise ConfigError(source, key_path(loc, f"providers.{name}"), problem) from None
        providers[name] = ProviderConfig(name, class_name, MappingProxyType(options))
    return providers, unimplemented


class _Pools:
    """The pools of one file, each with its defaults applied and references followed."""

    def __init__(
        self,
        file: ConfigFile,
        source: str,
        providers: dict[str, ProviderConfig],
        unimplemented: Mapping[str, str],
    ) -> None:
        self.file = file
        self.source = source
        self.providers = providers
        self.unimplemented = unimplemented
        self.timeout_s = _seconds(file.config, "timeout")
        self.ready_ttl_s = in_seconds(file.config, "ready_ttl")
        self.hold_s = _seconds(file.config, "hold_failed_minutes")
        self.domains = {name: dns.domain for name, dns in file.dns_configs.items()}

    def build(self) -> dict[str, PoolConfig]:
        pools: dict[str, PoolConfig] = {}
        index_of: dict[str, int] = {}
        for i, pool in enumerate(self.file.pools):
            path = f"pools[{i}]"
            if pool.name in pools:
                raise ConfigError(
                    self.source,
                    f"{path}.name",
                    f"duplicate pool name {pool.name!r} (also pools[{index_of[pool.name]}])",
                )
            index_of[pool.name] = i
            pools[pool.name] = self.pool(pool, path)
        return pools

    def pool(self, pool: PoolSection, path: str) -> PoolConfig:
        provider = self.provider(pool.provider, f"{path}.provider")
        domain = self.domain(pool, path)
        ready_ttl_s = in_seconds(pool, "ready_ttl")
        hold_s = in_seconds(pool, "hold_failed_minutes")
        resolved: dict[str, Any] = {
            "name": pool.name,
            "alias": tuple(dict.fromkeys(alias for alias in pool.alias if alias != pool.name)),
            "template": pool.template or pool.name,
            "size": pool.size,
            "timeout_s": in_seconds(pool, "timeout") or self.timeout_s,
            "provider": provider,
            "ready_ttl_s": self.ready_ttl_s if ready_ttl_s is None else ready_ttl_s,
            "domain": domain,
            "clone_target": pool.clone_target or self.file.config.clone_target,
            "ondemand_from_ready": pool.ondemand_from_ready,
            "hold_failed_s": self.hold_s if hold_s is None else hold_s,
        }
        options = self.provider_options(resolved, pool, path)
        return PoolConfig(**resolved, provider_options=MappingProxyType(options))

    def provider_options(
        self, resolved: Mapping[str, Any], pool: PoolSection, path: str
    ) -> dict[str, Any]:
        """The pool's keys for its provider's class, validated by the class's pool model.

        ``resolved`` holds the pool's own settings, resolved. The validation context holds
        the provider's options: ``{"provider": ...}``.

        A key the model shares with the pool's own settings (``clone_target``) gets the pool's
        resolved value, unless the pool wrote its own for the provider.
        """
        provider = self.providers[resolved["provider"]]
        implementation = provider_class(provider.provider_class)
        if implementation is None:  # pragma: no cover - provider() refused it already
            return {}
        model = implementation.pool_options
        raw = dict(pool.provider_options)
        for name in model.model_fields:
            value = resolved.get(name)
            if name not in raw and name in PoolSection.model_fields and value is not None:
                raw[name] = value
        try:  # the provider's options are the context of checks spanning both levels
            validated = model.model_validate(raw, context={"provider": dict(provider.options)})
        except ValidationError as exc:
            loc, problem = problems(exc)[0]
            raise ConfigError(self.source, key_path(loc, path), problem) from None
        return validated.model_dump(exclude_none=True)

    def provider(self, name: str, path: str) -> str:
        if name in self.providers:
            return name
        if name in self.unimplemented:
            raise ConfigError(
                self.source,
                path,
                f"provider {name!r} has provider_class {self.unimplemented[name]!r}: only"
                f" {implemented()} implemented",
            )
        if name == DEFAULT_PROVIDER:
            # The default provider needs no :providers: entry: an instance with its
            # default options.
            self.providers[name] = ProviderConfig(name, name, MappingProxyType({}))
            return name
        raise ConfigError(
            self.source,
            path,
            f"provider {name!r} is not under :providers: and only {implemented()} implemented"
            f" (define it there with provider_class: {DEFAULT_PROVIDER})",
        )

    def domain(self, pool: PoolSection, path: str) -> str | None:
        """The pool's own domain, else its dns_plugin's."""
        if pool.dns_plugin is None:
            return pool.domain
        if pool.dns_plugin not in self.domains:
            raise ConfigError(
                self.source,
                f"{path}.dns_plugin",
                f"unknown dns config {pool.dns_plugin!r} (not under :dns_configs:)",
            )
        return pool.domain or self.domains[pool.dns_plugin]


def _redis_url(redis: RedisSection) -> str | None:
    """``url``, else one composed of the parts given, else None.

    A ``redis+sentinel://`` URL is composed from ``sentinel``.
    """
    if redis.url is not None:
        return redis.url
    if redis.sentinel is not None:
        return _sentinel_target(redis, redis.sentinel).url()
    if not redis.model_fields_set & set(REDIS_URL_PARTS):
        return None
    server = redis.server or "localhost"
    if ":" in server and not server.startswith("["):
        server = f"[{server}]"  # an IPv6 literal
    auth = ""
    if redis.password:
        auth = f"{quote(redis.username or '', safe='')}:{quote(redis.password, safe='')}@"
    elif redis.username:
        auth = f"{quote(redis.username, safe='')}@"
    return f"redis://{auth}{server}:{redis.port}/{redis.db}"


def _sentinel_target(redis: RedisSection, sentinel: SentinelSection) -> SentinelTarget:
    hosts = []
    for entry in sentinel.hosts:
        host, _, port = entry.rpartition(":")
        hosts.append((host, int(port)))
    return SentinelTarget(
        master=sentinel.master,
        hosts=tuple(hosts),
        db=redis.db,
        username=redis.username,
        password=sentinel.password,
        sentinel_password=sentinel.sentinel_password,
    )


def default_redis_options() -> RedisOptions:
    """The connection settings of a file that sets none (callers without a config)."""
    return _redis_options(RedisSection(), "defaults")


def _redis_options(redis: RedisSection, source: str) -> RedisOptions:
    """The connection settings.

    ConfigError when a socket timeout would cut a write's durability confirmation short:
    that may wait ``durability_timeout``.
    """
    options = RedisOptions(
        socket_timeout_s=_seconds(redis, "socket_timeout"),
        connect_timeout_s=_seconds(redis, "socket_connect_timeout"),
        health_check_interval_s=_seconds(redis, "health_check_interval"),
        durability=DurabilitySetting(
            mode=redis.durability,
            replicas=redis.durability_replicas,
            timeout_s=_seconds(redis, "durability_timeout"),
        ),
    )
    if options.socket_timeout_s <= options.durability.timeout_s:
        raise ConfigError(
            source,
            "redis.socket_timeout",
            f"{options.socket_timeout_s:g} s must exceed redis.durability_timeout"
            f" ({options.durability.timeout_s:g} s): a write's confirmation may take that long",
        )
    return options


def _auth(auth: AuthSection, source: str) -> AuthConfig:
    users = dict(auth.users)
    if auth.users_file:
        users = read_users_file(auth.users_file, source, users)
    return AuthConfig(
        provider=auth.provider,
        users=MappingProxyType(users),
        rate_limit_per_minute=auth.rate_limit_per_minute,
        token_ttl_s=in_seconds(auth, "token_ttl"),
        max_tokens_per_user=auth.max_tokens_per_user,
        max_failed_logins_per_user=auth.max_failed_logins_per_user,
        max_failed_logins_per_address=auth.max_failed_logins_per_address,
        failed_login_window_s=_seconds(auth, "failed_login_window"),
        # a directory matches names case-insensitively: its users are spelt in lower case
        admins=tuple(sorted({a.lower() if auth.provider == "ldap" else a for a in auth.admins})),
        checkout_requires_token=auth.checkout_requires_token,
        ldap=_ldap(auth, source),
    )


def _ldap(auth: AuthSection, source: str) -> LdapConfig | None:
    """Provider ldap's settings: required then, ignored otherwise."""
    if auth.provider != "ldap":
        return None
    if auth.ldap is None:
        raise ConfigError(source, "auth.ldap", "provider ldap needs an :ldap: section")
    base_dir = Path(source).parent if source and not source.startswith("<") else None
    try:
        return build_ldap(auth.ldap, base_dir)
    except ValueError as exc:
        raise ConfigError(source, "auth.ldap", str(exc)) from None

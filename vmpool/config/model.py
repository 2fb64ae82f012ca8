"""The vmpool configuration: one YAML file in vmpooler's format, validated up front.

vmpooler writes its sections as Ruby symbols (``:config:``, ``:pools:``); YAML gives
Python the string ``":config"``. Every mapping key at every level therefore loses one
leading colon, so ``:config:`` and ``config:`` (and ``:name:`` inside a pool) mean the
same thing.

Units follow vmpooler: ``ondemand_request_ttl``, ``timeout`` and ``ready_ttl`` are
minutes, ``vm_lifetime``, ``vm_lifetime_auth`` and ``data_ttl`` hours. Everything on the
resulting :class:`Config` is in seconds (the ``_s`` fields).

A problem with the file is a :class:`ConfigError` whose text is one line:
``<file>: <key path>: <problem>``. Keys vmpool does not know are warnings
(:attr:`Config.warnings`), never a crash; vmpooler keys vmpool has no use for are
accepted silently, so a vmpooler config loads as it is.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote, urlsplit, urlunsplit

import yaml

from vmpool.ids import DEFAULT_PREFIX, InvalidIdentifier, validate_pool_name

__all__ = [
    "DEMO_CONFIG_YAML",
    "DEMO_SOURCE",
    "SCHEDULE_KEY_ALIASES",
    "AuthConfig",
    "Config",
    "ConfigError",
    "PoolConfig",
    "ProviderConfig",
    "Schedule",
    "demo_config",
    "load_config",
    "mask_url_password",
    "parse_config",
    "validate_redis_url",
]

DEMO_SOURCE: Final = "<built-in demo>"
SIMULATED: Final = "simulated"

# The built-in demo, used when neither --config nor VMPOOL_CONFIG names a file.
DEMO_CONFIG_YAML: Final[str] = """\
# vmpool built-in demo configuration, in vmpooler's format.
:providers:
  :simulated:
    boot_seconds: [2, 5]
    seed: 1
  # A second instance of the simulated cloud, unreliable on purpose: the demo sends
  # some requests here to show failed clones being retried and requests failing.
  :flakycloud:
    provider_class: simulated
    boot_seconds: [2, 5]
    create_fail_percent: 60
    ready_fail_percent: 30
    seed: 7

:redis:
  key_prefix: vmpool
  data_ttl: 1

:config:
  site_name: vmpool demo
  ondemand_request_ttl: 1
  timeout: 0.5
  max_ondemand_instances_per_request: 10
  ondemand_clone_limit: 20
  max_vm_retries: 3
  vm_lifetime: 12
  reconcile_grace: 30

:schedule:
  sweep_expired: 2
  provision_sweep: 1
  check_pending_sweep: 1
  reap_running: 5
  destroy_sweep: 1
  reconcile: 10

:pools:
  - name: debian-12-x86_64
    alias: [debian, debian-12]
    template: debian-12-x86_64
    size: 0
    provider: simulated
    domain: example.com
  - name: centos-9-x86_64
    alias: [centos]
    template: centos-9-x86_64
    size: 0
    provider: simulated
    domain: example.com
  - name: flaky-x86_64
    alias: [flaky]
    template: flaky-x86_64
    size: 0
    provider: flakycloud
    timeout: 0.25
    domain: example.com
"""


# --------------------------------------------------------------------------------------
# The public model
# --------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration problem. ``str(err)`` is one line: ``<file>: <key path>: <problem>``."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        super().__init__(source, key, problem)
        self.source = source
        self.key = key
        self.problem = problem

    def __str__(self) -> str:
        parts = [self.source, self.key, self.problem] if self.key else [self.source, self.problem]
        return _one_line(": ".join(parts))


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


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    provider_class: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class Schedule:
    """Seconds between the periodic jobs (top-level ``:schedule:``, a vmpool extension)."""

    sweep_expired: float = 5
    provision_sweep: float = 5
    check_pending_sweep: float = 2
    reap_running: float = 30
    destroy_sweep: float = 5
    reconcile: float = 30


@dataclass(frozen=True)
class AuthConfig:
    provider: str
    users: Mapping[str, str]
    rate_limit_per_minute: int | None


@dataclass(frozen=True)
class Config:
    pools: Mapping[str, PoolConfig]
    providers: Mapping[str, ProviderConfig]
    ondemand_request_ttl_s: float
    ondemand_request_grace_s: float
    max_ondemand_instances_per_request: int
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
    schedule: Schedule
    auth: AuthConfig | None
    source: str
    warnings: tuple[str, ...] = field(default=())

    def pool(self, name: str) -> PoolConfig:
        """The pool called ``name``; KeyError if there is none (aliases do not count)."""
        return self.pools[name]

    def resolve_name(self, name: str) -> list[str]:
        """The pools a requested name may select: the pool of that name, if any, then
        every pool that lists it as an alias, in file order. [] when nothing matches."""
        selected = [name] if name in self.pools else []
        for pool in self.pools.values():
            if name in pool.alias and pool.name not in selected:
                selected.append(pool.name)
        return selected

    def to_public_dict(self) -> dict[str, Any]:
        """The effective configuration as plain data, safe to print or serve: the Redis
        password is masked, provider secrets are masked, auth password hashes left out."""
        return {
            "source": self.source,
            "pools": [
                {
                    "name": p.name,
                    "alias": list(p.alias),
                    "template": p.template,
                    "size": p.size,
                    "timeout_s": p.timeout_s,
                    "provider": p.provider,
                    "ready_ttl_s": p.ready_ttl_s,
                    "domain": p.domain,
                    "clone_target": p.clone_target,
                }
                for p in self.pools.values()
            ],
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
            "lock_expire_s": self.lock_expire_s,
            "reconcile_grace_s": self.reconcile_grace_s,
            "schedule": {key: getattr(self.schedule, key) for key in _SCHEDULE_KEYS},
            "auth": None
            if self.auth is None
            else {
                "provider": self.auth.provider,
                "users": sorted(self.auth.users),
                "rate_limit_per_minute": self.auth.rate_limit_per_minute,
            },
            "warnings": list(self.warnings),
        }


def mask_url_password(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; fit to print or log."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def validate_redis_url(url: str) -> str:
    """``url`` stripped, if it is a usable redis://, rediss:// or unix:// URL; else
    ValueError with a one-line reason (the password never appears in it)."""
    url = url.strip()
    shown = _show(mask_url_password(url))
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"not a valid URL: {shown}") from None
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {shown}")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"has no socket path: {shown}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"has no host: {shown}")
    return url


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Load and validate a config file.

    ``path`` None means ``env["VMPOOL_CONFIG"]`` when set, else the built-in demo.
    ``env`` (default ``os.environ``) supplies vmpooler's overriding variables.
    """
    environ: Mapping[str, str] = os.environ if env is None else env
    if path is None:
        from_env = environ.get("VMPOOL_CONFIG", "").strip()
        if not from_env:
            return parse_config(
                _load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE), source=DEMO_SOURCE, env=environ
            )
        path = from_env
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, None, "no such file") from None
    except IsADirectoryError:
        raise ConfigError(source, None, "is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(source, None, "permission denied") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, None, f"not UTF-8 text (bad byte at offset {exc.start})"
        ) from None
    except OSError as exc:
        raise ConfigError(source, None, exc.strerror or str(exc)) from None
    return parse_config(_load_yaml(text, source), source=source, env=environ)


def demo_config() -> Config:
    """The built-in demo config, without environment overrides."""
    return parse_config(_load_yaml(DEMO_CONFIG_YAML, DEMO_SOURCE), source=DEMO_SOURCE, env={})


def parse_config(data: Any, *, source: str, env: Mapping[str, str] | None = None) -> Config:
    """Validate already-parsed YAML (``source`` names it in messages)."""
    return _Parser(source, os.environ if env is None else env).parse(data)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(source, where, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, None, f"invalid YAML: {exc}") from None


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------

_SECTIONS: Final = frozenset(
    {"config", "pools", "providers", "redis", "auth", "dns_configs", "schedule"}
)
# vmpooler sections vmpool has no use for: accepted without a word.
_IGNORED_SECTIONS: Final = frozenset(
    {"statsd", "graphite", "graphs", "prometheus", "tracing", "ldap", "tagfilter"}
)

_CONFIG_KEYS: Final = frozenset(
    {
        "ondemand_request_ttl",
        "ondemand_request_grace",
        "max_ondemand_instances_per_request",
        "ondemand_clone_limit",
        "max_vm_retries",
        "vm_lifetime",
        "vm_lifetime_auth",
        "timeout",
        "data_ttl",
        "prefix",
        "backend_weight",
        "lock_expire",
        "reconcile_grace",
        "ready_ttl",
        "clone_target",
        "domain",
    }
)
# vmpooler :config: keys vmpool accepts and ignores.
_CONFIG_IGNORED: Final = frozenset(
    {
        "site_name",
        "logfile",
        "task_limit",
        "timeout_notification",
        "vm_checktime",
        "max_lifetime_upper_limit",
        "migration_limit",
        "max_tries",
        "retry_factor",
        "create_folders",
        "create_template_delta_disks",
        "create_linked_clones",
        "experimental_features",
        "purge_unconfigured_folders",
        "purge_unconfigured_resources",
        "usage_stats",
        "request_logger",
        "extra_config",
        "allowed_tags",
        "manage_host_selection",
        "host_selection_max_age",
        "utilization_limit",
        "check_ready_vm_hostname_for_mismatch",
        "skip_dns_check_before_creating_vm",
        "dlq_enabled",
        "dlq_ttl",
        "dlq_max_entries",
        "purge_enabled",
        "purge_interval",
        "purge_dry_run",
        "max_pending_age",
        "max_ready_age",
        "max_running_age",
        "max_completed_age",
        "max_orphaned_age",
        "health_check_enabled",
        "health_check_interval",
        "health_thresholds",
        "rate_limiting_enabled",
        "rate_limits",
        "connection_pool_monitor_enabled",
        "connection_pool_monitor_interval",
        "connection_pool_timeout_min",
        "connection_pool_timeout_max",
        "connection_pool_timeout_initial",
        "adaptive_timeout_enabled",
    }
)
_CONFIG_IGNORED_PREFIXES: Final = ("check_loop_delay_", "circuit_breaker_", "adaptive_timeout_")

_POOL_KEYS: Final = frozenset(
    {
        "name",
        "alias",
        "template",
        "size",
        "timeout",
        "provider",
        "ready_ttl",
        "domain",
        "dns_plugin",
        "clone_target",
    }
)
_POOL_IGNORED: Final = frozenset(
    {
        "folder",
        "datastore",
        "datacenter",
        "create_linked_clone",
        "timeout_notification",
        "snapshot_mainMem_ioBlockPages",
        "snapshot_mainMem_ioBlockPages_size",
        "check_hostname_for_mismatch",
        "host_filter",
        "network",
        "zone",
        "project",
        "machine_type",
        "network_name",
        "subnetwork_name",
        "disk_type",
    }
)
_POOL_IGNORED_PREFIXES: Final = ("check_loop_delay_",)

_REDIS_KEYS: Final = frozenset(
    {"url", "server", "port", "username", "password", "db", "key_prefix", "data_ttl"}
)
_REDIS_IGNORED: Final = frozenset(
    {"connection_pool_size", "connection_pool_timeout", "reconnect_attempts"}
)

_AUTH_KEYS: Final = frozenset({"provider", "users", "rate_limit_per_minute", "ldap"})
_AUTH_PROVIDERS: Final = ("static", "dummy")

_SIMULATED_OPTIONS: Final = frozenset(
    {
        "boot_seconds",
        "create_fail_percent",
        "ready_fail_percent",
        "destroy_fail_percent",
        "seed",
        "create_latency_seconds",
        "permanent_fail_templates",
    }
)
_PROVIDER_IGNORED: Final = frozenset(
    {
        "connection_pool_size",
        "connection_pool_timeout",
        "purge_unconfigured_folders",
        "folder_whitelist",
    }
)
_PERCENT_OPTIONS: Final = ("create_fail_percent", "ready_fail_percent", "destroy_fail_percent")

_SCHEDULE_KEYS: Final = (
    "sweep_expired",
    "provision_sweep",
    "check_pending_sweep",
    "reap_running",
    "destroy_sweep",
    "reconcile",
)
# The names the :schedule: keys had before each took its periodic job's name.
SCHEDULE_KEY_ALIASES: Final = MappingProxyType(
    {
        "sweep": "sweep_expired",
        "provision": "provision_sweep",
        "check_pending": "check_pending_sweep",
        "reap": "reap_running",
        "destroy": "destroy_sweep",
    }
)

_HOSTNAME_PREFIX_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_KEY_PREFIX_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_DOMAIN_RE: Final = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_SHA256_HASH_RE: Final = re.compile(r"^sha256\$[^$]+\$[0-9a-fA-F]{64}$")
_PBKDF2_HASH_RE: Final = re.compile(r"^pbkdf2_sha256\$[1-9][0-9]*\$[^$]+\$[0-9a-fA-F]{64}$")
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix")

_MINUTE: Final = 60.0
_HOUR: Final = 3600.0


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _show(value: Any) -> str:
    """A value for an error message: short, one line."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, Mapping):
        return "a mapping"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_ignored(key: str, names: frozenset[str], prefixes: tuple[str, ...] = ()) -> bool:
    return key in names or key.startswith(prefixes)


def _mask_option(key: str, value: Any) -> Any:
    lowered = key.lower()
    if any(word in lowered for word in ("password", "secret", "token", "credential")):
        return "***"
    return value


class _Parser:
    """One validation run: the file name for messages, the environment, the warnings."""

    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.warnings: list[str] = []

    # -- reporting ----------------------------------------------------------------------
    def fail(self, key: str | None, problem: str) -> ConfigError:
        return ConfigError(self.source, key, problem)

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(_one_line(f"{self.source}: {key}: {message}"))

    def warn_unknown(
        self,
        section: Mapping[str, Any],
        path: str,
        known: frozenset[str],
        ignored: frozenset[str] = frozenset(),
        prefixes: tuple[str, ...] = (),
    ) -> None:
        for key in section:
            if key not in known and not _is_ignored(key, ignored, prefixes):
                self.warn(_join(path, key), "unknown key, ignored")

    # -- shapes -------------------------------------------------------------------------
    def normalize(self, value: Any, path: str) -> Any:
        """Strip one leading colon from every mapping key, recursively."""
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            seen: dict[str, Any] = {}
            for raw_key, item in value.items():
                if isinstance(raw_key, bool) or not isinstance(raw_key, (str, int)):
                    raise self.fail(
                        path or "top level", f"keys must be strings, got {_show(raw_key)}"
                    )
                key = str(raw_key)
                key = key[1:] if key.startswith(":") else key
                if key in out:
                    raise self.fail(
                        _join(path, key),
                        f"given twice (as {_show(seen[key])} and {_show(raw_key)})",
                    )
                seen[key] = raw_key
                out[key] = self.normalize(item, _join(path, key))
            return out
        if isinstance(value, list):
            return [self.normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return value

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {_show(value)}")
        return value

    def string(self, value: Any, path: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(path, f"must be a string, got {_show(value)}")
        text = str(value).strip()
        if not text:
            raise self.fail(path, "must not be empty")
        return text

    def optional_string(self, section: Mapping[str, Any], key: str, path: str) -> str | None:
        value = section.get(key)
        return None if value is None else self.string(value, _join(path, key))

    # -- numbers ------------------------------------------------------------------------
    def number(self, value: Any, path: str, *, positive: bool) -> float:
        """A finite number (or a numeric string, as environment values are)."""
        what = "a positive number" if positive else "a non-negative number"
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if number is None or not math.isfinite(number) or number < 0 or (positive and number == 0):
            raise self.fail(path, f"must be {what}, got {_show(value)}")
        return number

    def integer(self, value: Any, path: str, *, minimum: int) -> int:
        what = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = None
        if number is None or number < minimum:
            raise self.fail(path, f"must be {what}, got {_show(value)}")
        return number

    def env_value(self, name: str) -> str | None:
        value = self.env.get(name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def duration(
        self,
        section: Mapping[str, Any],
        path: str,
        key: str,
        *,
        unit: float,
        default_s: float,
        positive: bool = True,
        env_var: str | None = None,
    ) -> float:
        """Seconds, given in ``unit`` seconds: the environment, else the file, else
        ``default_s`` (already in seconds)."""
        from_env = self.env_value(env_var) if env_var else None
        if from_env is not None:
            return self.number(from_env, f"environment {env_var}", positive=positive) * unit
        value = section.get(key)
        if value is None:
            return float(default_s)
        return self.number(value, _join(path, key), positive=positive) * unit

    def count(
        self,
        section: Mapping[str, Any],
        path: str,
        key: str,
        *,
        minimum: int,
        default: int,
        env_var: str | None = None,
    ) -> int:
        from_env = self.env_value(env_var) if env_var else None
        if from_env is not None:
            return self.integer(from_env, f"environment {env_var}", minimum=minimum)
        value = section.get(key)
        if value is None:
            return default
        return self.integer(value, _join(path, key), minimum=minimum)

    # -- the whole file -----------------------------------------------------------------
    def parse(self, data: Any) -> Config:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise self.fail("top level", f"must be a mapping of sections, got {_show(data)}")
        top = self.normalize(data, "")
        for key in top:
            if key not in _SECTIONS and key not in _IGNORED_SECTIONS:
                self.warn(key, "unknown section, ignored")

        cfg = self.mapping(top.get("config"), "config")
        self.warn_unknown(cfg, "config", _CONFIG_KEYS, _CONFIG_IGNORED, _CONFIG_IGNORED_PREFIXES)
        if cfg.get("domain") is not None:
            self.warn(
                "config.domain",
                "vmpooler v3 removed the global domain; set `domain` (or `dns_plugin`) on each"
                " pool instead. Ignored",
            )

        redis = self.mapping(top.get("redis"), "redis")
        self.warn_unknown(redis, "redis", _REDIS_KEYS, _REDIS_IGNORED)

        timeout_s = self.duration(
            cfg, "config", "timeout", unit=_MINUTE, default_s=15 * _MINUTE, env_var="TIMEOUT"
        )
        vm_lifetime_s = self.duration(
            cfg, "config", "vm_lifetime", unit=_HOUR, default_s=12 * _HOUR, env_var="VM_LIFETIME"
        )
        vm_lifetime_auth_s = self.duration(
            cfg,
            "config",
            "vm_lifetime_auth",
            unit=_HOUR,
            default_s=vm_lifetime_s,
            env_var="VM_LIFETIME_AUTH",
        )
        # vmpooler keeps data_ttl under :redis:; the contract lists it with :config:.
        if cfg.get("data_ttl") is not None:
            data_ttl_s = self.duration(
                cfg,
                "config",
                "data_ttl",
                unit=_HOUR,
                default_s=168 * _HOUR,
                env_var="REDIS_DATA_TTL",
            )
        else:
            data_ttl_s = self.duration(
                redis,
                "redis",
                "data_ttl",
                unit=_HOUR,
                default_s=168 * _HOUR,
                env_var="REDIS_DATA_TTL",
            )
        config_ready_ttl = cfg.get("ready_ttl")
        default_ready_ttl_s = (
            None
            if config_ready_ttl is None
            else self.number(config_ready_ttl, "config.ready_ttl", positive=True) * _MINUTE
        )
        default_clone_target = self.optional_string(cfg, "clone_target", "config")

        providers, unimplemented = self.providers(top.get("providers"))
        dns_domains = self.dns_configs(top.get("dns_configs"))
        pools = self.pools(
            top.get("pools"),
            timeout_s=timeout_s,
            ready_ttl_s=default_ready_ttl_s,
            clone_target=default_clone_target,
            providers=providers,
            unimplemented=unimplemented,
            dns_domains=dns_domains,
        )
        used = {pool.provider for pool in pools.values()}
        for name, provider_class in unimplemented.items():
            if name not in used:
                self.warn(
                    f"providers.{name}",
                    f"provider_class {provider_class!r} is not implemented (only `simulated`"
                    " is); no pool uses it, ignored",
                )

        return Config(
            pools=MappingProxyType(pools),
            providers=MappingProxyType(providers),
            ondemand_request_ttl_s=self.duration(
                cfg,
                "config",
                "ondemand_request_ttl",
                unit=_MINUTE,
                default_s=5 * _MINUTE,
                env_var="ONDEMAND_REQUEST_TTL",
            ),
            ondemand_request_grace_s=self.duration(
                cfg, "config", "ondemand_request_grace", unit=1.0, default_s=0, positive=False
            ),
            max_ondemand_instances_per_request=self.count(
                cfg,
                "config",
                "max_ondemand_instances_per_request",
                minimum=1,
                default=10,
                env_var="MAX_ONDEMAND_INSTANCES_PER_REQUEST",
            ),
            ondemand_clone_limit=self.count(
                cfg,
                "config",
                "ondemand_clone_limit",
                minimum=1,
                default=10,
                env_var="ONDEMAND_CLONE_LIMIT",
            ),
            max_vm_retries=self.count(cfg, "config", "max_vm_retries", minimum=0, default=3),
            vm_lifetime_s=vm_lifetime_s,
            vm_lifetime_auth_s=vm_lifetime_auth_s,
            timeout_s=timeout_s,
            data_ttl_s=data_ttl_s,
            hostname_prefix=self.hostname_prefix(cfg),
            key_prefix=self.key_prefix(redis),
            backend_weight=MappingProxyType(self.backend_weight(cfg.get("backend_weight"))),
            redis_url=self.redis_url(redis),
            lock_expire_s=self.duration(cfg, "config", "lock_expire", unit=1.0, default_s=60),
            reconcile_grace_s=self.duration(
                cfg, "config", "reconcile_grace", unit=1.0, default_s=120, positive=False
            ),
            schedule=self.schedule(top.get("schedule")),
            auth=self.auth(top.get("auth")),
            source=self.source,
            warnings=tuple(self.warnings),
        )

    # -- sections -----------------------------------------------------------------------
    def hostname_prefix(self, cfg: Mapping[str, Any]) -> str:
        from_env = self.env_value("PREFIX")
        path = "environment PREFIX" if from_env is not None else "config.prefix"
        value: Any = from_env if from_env is not None else cfg.get("prefix")
        if value is None or value == "":
            return ""
        if not isinstance(value, str) or not _HOSTNAME_PREFIX_RE.match(value):
            raise self.fail(
                path,
                "must be up to 32 lowercase letters, digits or '-' (it starts every VM"
                f" hostname), got {_show(value)}",
            )
        return value

    def key_prefix(self, redis: Mapping[str, Any]) -> str:
        value = redis.get("key_prefix")
        if value is None:
            return DEFAULT_PREFIX
        if not isinstance(value, str) or not _KEY_PREFIX_RE.match(value):
            raise self.fail(
                "redis.key_prefix",
                f"must be 1-64 letters, digits, '_', '.', ':' or '-', got {_show(value)}",
            )
        return value

    def backend_weight(self, value: Any) -> dict[str, float]:
        weights = self.mapping(value, "config.backend_weight")
        return {
            str(target): self.number(weight, f"config.backend_weight.{target}", positive=False)
            for target, weight in weights.items()
        }

    def redis_url(self, redis: Mapping[str, Any]) -> str | None:
        from_env = self.env_value("VMPOOL_REDIS_URL")
        if from_env is not None:
            return self.check_redis_url(from_env, "environment VMPOOL_REDIS_URL")
        parts = ("server", "port", "username", "password", "db")
        if redis.get("url") is not None:
            url = self.check_redis_url(redis["url"], "redis.url")
            given = [key for key in parts if redis.get(key) is not None]
            if given:
                self.warn("redis.url", f"set, so {', '.join(given)} ignored")
            return url
        if all(redis.get(key) is None for key in parts):
            return None
        server = self.optional_string(redis, "server", "redis") or "localhost"
        if ":" in server and not server.startswith("["):
            server = f"[{server}]"  # an IPv6 literal
        port = (
            6379
            if redis.get("port") is None
            else self.integer(redis["port"], "redis.port", minimum=1)
        )
        if port > 65535:
            raise self.fail("redis.port", f"must be a TCP port (1-65535), got {port}")
        db = 0 if redis.get("db") is None else self.integer(redis["db"], "redis.db", minimum=0)
        username = self.optional_string(redis, "username", "redis")
        password = redis.get("password")
        if password is not None and (
            isinstance(password, bool) or not isinstance(password, (str, int))
        ):
            raise self.fail("redis.password", "must be a string")
        auth = ""
        if password is not None and str(password) != "":
            auth = f"{quote(username or '', safe='')}:{quote(str(password), safe='')}@"
        elif username:
            auth = f"{quote(username, safe='')}@"
        return f"redis://{auth}{server}:{port}/{db}"

    def check_redis_url(self, value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(path, f"must be a URL string, got {_show(value)}")
        try:
            return validate_redis_url(value)
        except ValueError as exc:
            raise self.fail(path, str(exc)) from None

    def providers(self, value: Any) -> tuple[dict[str, ProviderConfig], dict[str, str]]:
        """The simulated provider instances, and the other instances' classes by name."""
        section = self.mapping(value, "providers")
        providers: dict[str, ProviderConfig] = {}
        unimplemented: dict[str, str] = {}
        for name, raw in section.items():
            path = f"providers.{name}"
            try:
                validate_pool_name(name)
            except InvalidIdentifier:
                raise self.fail(
                    path,
                    "provider names must be 1-128 letters, digits, '-', '_' or '.', starting"
                    " with a letter or digit",
                ) from None
            options = dict(self.mapping(raw, path))
            provider_class = (
                name
                if options.get("provider_class") is None
                else self.string(options["provider_class"], f"{path}.provider_class")
            )
            options.pop("provider_class", None)
            if provider_class != SIMULATED:
                unimplemented[name] = provider_class
                continue
            self.simulated_options(options, path)
            providers[name] = ProviderConfig(
                name=name, provider_class=provider_class, options=MappingProxyType(options)
            )
        return providers, unimplemented

    def simulated_options(self, options: Mapping[str, Any], path: str) -> None:
        """The checks the simulated provider makes at run time, made up front."""

        def real(value: Any, key: str) -> float:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise self.fail(key, f"must be a non-negative number, got {_show(value)}")
            return float(value)

        self.warn_unknown(options, path, _SIMULATED_OPTIONS, _PROVIDER_IGNORED)
        boot = options.get("boot_seconds")
        if isinstance(boot, list):
            key = f"{path}.boot_seconds"
            if len(boot) != 2:
                raise self.fail(key, f"must be a number or [min, max], got {_show(boot)}")
            low = real(boot[0], f"{key}[0]")
            high = real(boot[1], f"{key}[1]")
            if low > high:
                raise self.fail(key, f"[min, max] needs min <= max, got {_show(boot)}")
        elif boot is not None:
            if isinstance(boot, bool) or not isinstance(boot, (int, float)):
                raise self.fail(
                    f"{path}.boot_seconds", f"must be a number or [min, max], got {_show(boot)}"
                )
            real(boot, f"{path}.boot_seconds")
        for name in _PERCENT_OPTIONS:
            value = options.get(name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 100
            ):
                raise self.fail(
                    f"{path}.{name}", f"must be a number from 0 to 100, got {_show(value)}"
                )
        seed = options.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise self.fail(f"{path}.seed", f"must be an integer, got {_show(seed)}")
        latency = options.get("create_latency_seconds")
        if latency is not None:
            real(latency, f"{path}.create_latency_seconds")
        templates = options.get("permanent_fail_templates")
        if templates is not None and (
            not isinstance(templates, list) or not all(isinstance(t, str) for t in templates)
        ):
            raise self.fail(
                f"{path}.permanent_fail_templates",
                f"must be a list of template names, got {_show(templates)}",
            )

    def dns_configs(self, value: Any) -> dict[str, str | None]:
        """dns config name -> its domain."""
        section = self.mapping(value, "dns_configs")
        domains: dict[str, str | None] = {}
        for name, raw in section.items():
            entry = self.mapping(raw, f"dns_configs.{name}")
            domain = entry.get("domain")
            domains[name] = (
                None if domain is None else self.domain(domain, f"dns_configs.{name}.domain")
            )
        return domains

    def domain(self, value: Any, path: str) -> str:
        text = self.string(value, path).rstrip(".").lower()
        if not _DOMAIN_RE.match(text):
            raise self.fail(path, f"must be a DNS domain name, got {_show(value)}")
        return text

    def pools(
        self,
        value: Any,
        *,
        timeout_s: float,
        ready_ttl_s: float | None,
        clone_target: str | None,
        providers: dict[str, ProviderConfig],
        unimplemented: Mapping[str, str],
        dns_domains: Mapping[str, str | None],
    ) -> dict[str, PoolConfig]:
        if value is None:
            self.warn("pools", "no pools configured")
            return {}
        if not isinstance(value, list):
            raise self.fail("pools", f"must be a list of pools, got {_show(value)}")
        pools: dict[str, PoolConfig] = {}
        index_of: dict[str, int] = {}
        for i, raw in enumerate(value):
            path = f"pools[{i}]"
            if not isinstance(raw, dict):
                raise self.fail(path, f"must be a mapping with at least `name`, got {_show(raw)}")
            self.warn_unknown(raw, path, _POOL_KEYS, _POOL_IGNORED, _POOL_IGNORED_PREFIXES)
            name = self.pool_name(raw, path)
            if name in pools:
                raise self.fail(
                    f"{path}.name", f"duplicate pool name {name!r} (also pools[{index_of[name]}])"
                )
            index_of[name] = i

            provider = self.provider_ref(raw, path, providers, unimplemented)
            domain = (
                None if raw.get("domain") is None else self.domain(raw["domain"], f"{path}.domain")
            )
            plugin = raw.get("dns_plugin")
            if plugin is not None:
                plugin_name = self.string(plugin, f"{path}.dns_plugin").lstrip(":")
                if plugin_name not in dns_domains:
                    raise self.fail(
                        f"{path}.dns_plugin",
                        f"unknown dns config {plugin_name!r} (not under :dns_configs:)",
                    )
                domain = domain or dns_domains[plugin_name]

            pools[name] = PoolConfig(
                name=name,
                alias=self.aliases(raw.get("alias"), f"{path}.alias", name),
                template=self.optional_string(raw, "template", path) or name,
                size=self.count(raw, path, "size", minimum=0, default=0),
                timeout_s=self.duration(raw, path, "timeout", unit=_MINUTE, default_s=timeout_s),
                provider=provider,
                ready_ttl_s=ready_ttl_s
                if raw.get("ready_ttl") is None
                else self.number(raw["ready_ttl"], f"{path}.ready_ttl", positive=True) * _MINUTE,
                domain=domain,
                clone_target=self.optional_string(raw, "clone_target", path) or clone_target,
            )
        return pools

    def pool_name(self, raw: Mapping[str, Any], path: str) -> str:
        value = raw.get("name")
        if value is None:
            raise self.fail(f"{path}.name", "missing: every pool needs a name")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.fail(f"{path}.name", f"must be a string, got {_show(value)}")
        try:
            return validate_pool_name(str(value))
        except InvalidIdentifier:
            raise self.fail(
                f"{path}.name",
                "must be 1-128 letters, digits, '-', '_' or '.', starting with a letter or"
                f" digit, got {_show(value)}",
            ) from None

    def aliases(self, value: Any, path: str, own_name: str) -> tuple[str, ...]:
        if value is None:
            return ()
        items = [value] if isinstance(value, (str, int)) and not isinstance(value, bool) else value
        if not isinstance(items, list):
            raise self.fail(path, f"must be a name or a list of names, got {_show(value)}")
        aliases: list[str] = []
        for j, item in enumerate(items):
            item_path = path if items is not value else f"{path}[{j}]"
            if isinstance(item, bool) or not isinstance(item, (str, int)):
                raise self.fail(item_path, f"must be a name, got {_show(item)}")
            try:
                alias = validate_pool_name(str(item))
            except InvalidIdentifier:
                raise self.fail(
                    item_path,
                    "must be 1-128 letters, digits, '-', '_' or '.', starting with a letter or"
                    f" digit, got {_show(item)}",
                ) from None
            if alias != own_name and alias not in aliases:
                aliases.append(alias)
        return tuple(aliases)

    def provider_ref(
        self,
        raw: Mapping[str, Any],
        path: str,
        providers: dict[str, ProviderConfig],
        unimplemented: Mapping[str, str],
    ) -> str:
        value = raw.get("provider")
        name = SIMULATED if value is None else self.string(value, f"{path}.provider").lstrip(":")
        if name in providers:
            return name
        if name in unimplemented:
            raise self.fail(
                f"{path}.provider",
                f"provider {name!r} has provider_class {unimplemented[name]!r}: only `simulated`"
                " is implemented",
            )
        if name == SIMULATED:
            providers[name] = ProviderConfig(
                name=SIMULATED, provider_class=SIMULATED, options=MappingProxyType({})
            )
            return name
        raise self.fail(
            f"{path}.provider",
            f"provider {name!r} is not under :providers: and only `simulated` is implemented"
            " (define it there with provider_class: simulated)",
        )

    def schedule(self, value: Any) -> Schedule:
        section = dict(self.mapping(value, "schedule"))
        self.warn_unknown(
            section, "schedule", frozenset(_SCHEDULE_KEYS) | set(SCHEDULE_KEY_ALIASES)
        )
        for old, new in SCHEDULE_KEY_ALIASES.items():
            if old in section and new in section:
                raise self.fail(f"schedule.{new}", f"given twice (as {old!r} and {new!r})")
        defaults = Schedule()
        values = {}
        for key in _SCHEDULE_KEYS:
            old = next(
                (o for o, n in SCHEDULE_KEY_ALIASES.items() if n == key and o in section), key
            )
            values[key] = self.duration(
                section, "schedule", old, unit=1.0, default_s=getattr(defaults, key)
            )
        return Schedule(**values)

    def auth(self, value: Any) -> AuthConfig | None:
        if value is None:
            return None
        section = self.mapping(value, "auth")
        self.warn_unknown(section, "auth", _AUTH_KEYS)
        provider = (
            "static"
            if section.get("provider") is None
            else self.string(section["provider"], "auth.provider")
        )
        if provider not in _AUTH_PROVIDERS:
            raise self.fail(
                "auth.provider",
                f"{provider!r} is not implemented: use 'static' (users with password hashes)"
                " or 'dummy'",
            )
        if provider == "dummy":
            self.warn("auth.provider", "dummy authentication accepts anyone; for testing only")
        users: dict[str, str] = {}
        for user, hashed in self.mapping(section.get("users"), "auth.users").items():
            path = f"auth.users.{user}"
            if not isinstance(hashed, str) or not (
                _SHA256_HASH_RE.match(hashed) or _PBKDF2_HASH_RE.match(hashed)
            ):
                raise self.fail(
                    path,
                    "must be a password hash ('sha256$<salt>$<hex>' or"
                    " 'pbkdf2_sha256$<iterations>$<salt>$<hex>'), not a plain password",
                )
            users[user] = hashed
        limit = section.get("rate_limit_per_minute")
        return AuthConfig(
            provider=provider,
            users=MappingProxyType(users),
            rate_limit_per_minute=None
            if limit is None
            else self.integer(limit, "auth.rate_limit_per_minute", minimum=1),
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key

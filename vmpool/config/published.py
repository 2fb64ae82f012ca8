"""The running fleet's config, published to Redis for commands given only its URL.

A command given only the Redis URL then works on the fleet's pools, as vmpooler keeps
its config in Redis.

Who: the processes that run the fleet (``vmpool up``, ``api``, ``worker``,
``scheduler``) publish the config they run with when they start. The other commands
read it when no config file is named. When one is named, they compare the two.

What: the config's public form. No Redis URL (the reader has one). No password hash
(users by name only). Every provider option whose name says secret is masked as
``***``, as ``vmpool config show`` does. A command that needs a provider's secrets
(``vmpool audit`` on a real cloud) still needs the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, Final

import redis
from pydantic import SecretStr

from vmpool.config.build import default_redis_options
from vmpool.config.ldap import LdapConfig
from vmpool.config.model import AuthConfig, Config, PoolConfig, ProviderConfig
from vmpool.config.settings import Schedule
from vmpool.ids import DEFAULT_PREFIX
from vmpool.state.connection import RedisOptions
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys

__all__ = [
    "MASK",
    "PublishedConfig",
    "PublishedConfigError",
    "config_differences",
    "find_published",
    "public_form",
    "publish_config",
    "read_published",
]

MASK: Final = "***"
# Words that make an option a secret, wherever it is nested.
_SECRET_WORDS: Final = ("password", "secret", "token", "credential", "access_key", "private_key")
# What may differ between two processes running the same config.
_NOT_COMPARED: Final = frozenset({"source", "warnings", "redis_url"})
FORMAT: Final = 1


class PublishedConfigError(ValueError):
    """The published config cannot be read (another vmpool version wrote it)."""


@dataclass(frozen=True)
class PublishedConfig:
    """The fleet's config as it was published, and by whom, when."""

    config: Config
    form: Mapping[str, Any]
    publisher: str
    published_at: float
    digest: str

    def origin(self) -> str:
        """ "<file>, published by <process> at <UTC time>", for messages."""
        when = datetime.fromtimestamp(self.published_at, tz=timezone.utc)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{self.form.get('source', '?')}, published by {self.publisher} at {stamp}"

    def masked_secrets(self) -> list[str]:
        """The providers whose options were published with a secret masked."""
        return [name for name, prov in self.config.providers.items() if _has_mask(prov.options)]


def _plain(value: Any) -> Any:
    """A config value as JSON data. A secret a model kept (a pool's dns key) is masked."""
    if isinstance(value, SecretStr):
        return MASK
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return value


def _masked(value: Any, key: str = "") -> Any:
    if any(word in key.lower() for word in _SECRET_WORDS):
        return MASK
    if isinstance(value, Mapping):
        return {k: _masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _has_mask(value: Any) -> bool:
    if value == MASK:
        return True
    if isinstance(value, Mapping):
        return any(_has_mask(v) for v in value.values())
    return isinstance(value, list) and any(_has_mask(v) for v in value)


def public_form(config: Config) -> dict[str, Any]:
    """Every setting of ``config`` as JSON data, without a secret."""
    form: dict[str, Any] = _plain(config)
    form["redis_url"] = None
    form["providers"] = _masked(form["providers"])
    form["pools"] = _masked(form["pools"])  # a pool's keys for its provider too
    if config.auth is not None:
        form["auth"]["ldap"] = _masked(form["auth"]["ldap"])  # its service account's password
        form["auth"]["users"] = sorted(config.auth.users)
    return form


def _digest(form: Mapping[str, Any]) -> str:
    compared = {k: v for k, v in form.items() if k not in _NOT_COMPARED}
    return hashlib.sha256(json.dumps(compared, sort_keys=True).encode()).hexdigest()


def config_differences(a: Config, b: Mapping[str, Any]) -> list[str]:
    """The settings in which ``a`` differs from the published form ``b``.

    Settings are named by their top-level names, as ``vmpool config show --json`` has them.
    """
    form = public_form(a)
    return sorted(
        key
        for key in form.keys() | b.keys()
        if key not in _NOT_COMPARED and form.get(key) != b.get(key)
    )


def publish_config(client: redis.Redis, config: Config, *, publisher: str) -> str | None:
    """Publish ``config`` as the fleet's.

    Returns the origin of the different config it replaced, if any. The caller warns: two
    processes of one fleet run different configs.
    """
    keys = Keys(config.key_prefix)
    form = public_form(config)
    digest = _digest(form)
    before = client.hmget(keys.fleet_config, ["digest", "publisher", "source"])
    now = _server_time(client)
    pipe = client.pipeline(transaction=True)
    pipe.hset(
        keys.fleet_config,
        mapping={
            "format": FORMAT,
            "config": json.dumps(form),
            "digest": digest,
            "publisher": publisher,
            "published_at": repr(now),
            "source": config.source,
        },
    )
    pipe.hset(Keys.fleets_index(), config.key_prefix, repr(now))
    pipe.execute()
    old_digest, old_publisher, old_source = (_text(v) for v in before)
    if old_digest and old_digest != digest:
        return f"{old_source} (published by {old_publisher})"
    return None


def read_published(client: redis.Redis, keys: Keys) -> PublishedConfig | None:
    """The config the fleet of ``keys``' prefix published. None if none did."""
    fields = {_text(k): _text(v) for k, v in client.hgetall(keys.fleet_config).items()}
    if not fields:
        return None
    try:
        if int(fields.get("format", "0")) != FORMAT:
            raise PublishedConfigError(f"format {fields.get('format')!r}, not {FORMAT}")
        form = json.loads(fields["config"])
        config = config_from_form(form)
        return PublishedConfig(
            config=config,
            form=form,
            publisher=fields.get("publisher", "?"),
            published_at=float(fields.get("published_at", "0")),
            digest=fields.get("digest", ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PublishedConfigError(f"{keys.fleet_config}: {exc}") from None


def find_published(client: redis.Redis) -> PublishedConfig | None:
    """The published config of the one fleet in this Redis database.

    That is the default prefix's, else the only prefix that published one.
    PublishedConfigError when several fleets (prefixes) published and none is the default.
    """
    found = read_published(client, Keys(DEFAULT_PREFIX))
    if found is not None:
        return found
    prefixes = sorted(_text(p) for p in client.hkeys(Keys.fleets_index()))
    if len(prefixes) > 1:
        raise PublishedConfigError(
            f"several fleets publish their config in this Redis database (key prefixes"
            f" {', '.join(prefixes)})"
        )
    return read_published(client, Keys(prefixes[0])) if prefixes else None


def config_from_form(form: Mapping[str, Any]) -> Config:
    """The :class:`Config` a public form describes (its secrets stay masked)."""
    data = dict(form)
    data["pools"] = MappingProxyType(
        {pool["name"]: _dataclass(PoolConfig, pool) for pool in data.get("pools", {}).values()}
    )
    data["providers"] = MappingProxyType(
        {name: _dataclass(ProviderConfig, prov) for name, prov in data["providers"].items()}
    )
    auth = data.get("auth")
    if auth is not None:
        ldap = auth.get("ldap") and _dataclass(LdapConfig, auth["ldap"])
        users = dict.fromkeys(auth["users"], "")
        data["auth"] = _dataclass(AuthConfig, {**auth, "users": users, "ldap": ldap or None})
    data["schedule"] = Schedule.model_validate(
        {k: v for k, v in data["schedule"].items() if k in Schedule.model_fields}
    )
    data["redis_options"] = _redis_options(data.get("redis_options"))
    return _dataclass(Config, data)


def _redis_options(form: Mapping[str, Any] | None) -> RedisOptions:
    """The connection settings of a published form.

    The defaults when the publisher predates them and published none.
    """
    if not form:
        return default_redis_options()
    durability = _dataclass(DurabilitySetting, form["durability"])
    return _dataclass(RedisOptions, {**form, "durability": durability})


_T = typing.TypeVar("_T")


def _dataclass(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """``cls`` from ``data``, as the field types say.

    Unknown names are dropped (a newer publisher). Lists become tuples, mappings read-only
    mappings.
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        value = data[f.name]
        origin = typing.get_origin(hints[f.name])
        if origin is tuple and isinstance(value, list):
            value = tuple(value)
        elif origin is Mapping and isinstance(value, dict):
            value = MappingProxyType(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)

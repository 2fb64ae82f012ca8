"""The config's public form: every setting as JSON data, and no secret.

One form for every reader. ``vmpool config show`` prints it (YAML, or JSON with
``--json``), and the fleet's processes publish it to Redis
(:mod:`vmpool.config.published`), where :func:`config_from_form` reads it back.

The form follows :class:`~vmpool.config.Config` field for field, and so does every
record in it (a pool, a provider, auth and its LDAP settings, the Redis connection), so a
setting added to any of them is in the form with no change here. Spellings:

- ``pools``: a list, in file order. ``providers``: keyed by name.
- ``redis_options``: the durability spelt flat, as the file spells it: ``durability``,
  ``durability_replicas``, ``durability_timeout_s``.
- ``auth.users``: the user names, sorted, never a password hash.

Secrets, one rule (:func:`is_secret`): in a provider's options, a pool's options and the
LDAP settings, every key whose name holds one of :data:`SECRET_WORDS`, however deeply
nested, is shown as ``***``; anywhere, a value a model kept as a ``SecretStr``. The
Redis URL's passwords are ``***`` too. The config's own settings are not masked by
their names (``token_ttl_s`` is no secret).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, Final

from pydantic import BaseModel, SecretStr

from vmpool.config.build import build
from vmpool.config.ldap import LdapConfig
from vmpool.config.model import AuthConfig, Config, PoolConfig, ProviderConfig
from vmpool.config.quotas import Quota, QuotaConfig
from vmpool.config.settings import AuthSection, ConfigFile, PoolSection, Schedule
from vmpool.state.connection import RedisOptions
from vmpool.state.redis_target import MASK, mask_url_password

__all__ = ["MASK", "SECRET_WORDS", "config_from_form", "is_secret", "public_form"]

_T = typing.TypeVar("_T")

# Words that make an option a secret, wherever it is nested.
SECRET_WORDS: Final = ("password", "secret", "token", "credential", "access_key", "private_key")


def is_secret(name: str, value: Any) -> bool:
    """Whether the option ``name`` with ``value`` is a secret (see the module's rule)."""
    return isinstance(value, SecretStr) or any(word in name.lower() for word in SECRET_WORDS)


def _form(value: Any, name: str = "", *, options: bool = False) -> Any:
    """``value`` as JSON data. A SecretStr is masked, and, among ``options``, a secret."""
    if isinstance(value, SecretStr) or (options and is_secret(name, value)):
        return MASK
    if isinstance(value, BaseModel):
        value = value.model_dump()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _form(v, str(k), options=options) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_form(v, options=options) for v in value]
    return value


_options: Final = partial(_form, options=True)


def _record(record: Any, spelt: Mapping[str, Callable[[Any], Any]]) -> dict[str, Any]:
    """A record's fields as JSON data: each as ``spelt`` says, else plainly."""
    return {
        f.name: spelt.get(f.name, _form)(getattr(record, f.name))
        for f in dataclasses.fields(record)
    }


def _flat(record: Any) -> dict[str, Any]:
    """A record's fields, a record among them spelt flat beside them, as the file spells it.

    Its first field under its own name, the others prefixed with it: ``durability``,
    ``durability_replicas``.
    """
    form: dict[str, Any] = {}
    for name, value in _form(record).items():
        if isinstance(value, dict):
            first, *others = value
            form[name] = value[first]
            form.update({f"{name}_{key}": value[key] for key in others})
        else:
            form[name] = value
    return form


def _auth(auth: AuthConfig | None) -> dict[str, Any] | None:
    return None if auth is None else _record(auth, {"users": sorted, "ldap": _options})


_CONFIG_SPELT: Final[Mapping[str, Callable[[Any], Any]]] = {
    "pools": lambda pools: [_options(pool) for pool in pools.values()],
    "providers": lambda providers: {
        name: {k: v for k, v in _options(provider).items() if k != "name"}
        for name, provider in providers.items()
    },
    "redis_url": lambda url: None if url is None else mask_url_password(url),
    "redis_options": _flat,
    "auth": _auth,
}


def public_form(config: Config) -> dict[str, Any]:
    """Every setting of ``config`` as JSON data, without a secret."""
    return _record(config, _CONFIG_SPELT)


def _default_form() -> dict[str, Any]:
    """The public form of a file that sets nothing but one pool and auth: the defaults."""
    file = ConfigFile(pools=[PoolSection(name="default")], auth=AuthSection())
    return public_form(build(file, source="defaults", warnings=()))


# The LDAP settings a publisher may predate, as it meant them (no settings-model default:
# they are made from vmpooler's `encryption` hash).
_LDAP_BEFORE: Final[Mapping[str, Any]] = {"tls_version": None}


def config_from_form(form: Mapping[str, Any]) -> Config:
    """The :class:`Config` a public form describes.

    Its secrets stay masked, and it has no Redis URL: its reader has its own. A setting
    the form lacks (its publisher predates it) has its default, from the settings model.
    Names the form has and Config lacks (a newer publisher's) are dropped.
    """
    defaults = _default_form()
    data = {**defaults, **form, "redis_url": None}
    data["pools"] = MappingProxyType(
        {
            pool["name"]: _dataclass(PoolConfig, {**defaults["pools"][0], **pool})
            for pool in data["pools"]
        }
    )
    data["providers"] = MappingProxyType(
        {
            name: _dataclass(ProviderConfig, {**provider, "name": name})
            for name, provider in data["providers"].items()
        }
    )
    if data["auth"] is not None:
        auth = {**defaults["auth"], **data["auth"]}
        auth["users"] = dict.fromkeys(auth["users"], "")
        auth["ldap"] = auth["ldap"] and _dataclass(LdapConfig, {**_LDAP_BEFORE, **auth["ldap"]})
        data["auth"] = _dataclass(AuthConfig, auth)
    data["quotas"] = _quotas({**defaults["quotas"], **data["quotas"]})
    data["schedule"] = Schedule.model_validate(
        {k: v for k, v in data["schedule"].items() if k in Schedule.model_fields}
    )
    redis_options = {**defaults["redis_options"], **data["redis_options"]}
    data["redis_options"] = _unflat(RedisOptions, redis_options)
    return _dataclass(Config, data)


def _quotas(form: Mapping[str, Any]) -> QuotaConfig:
    """The quotas a form describes."""
    users = {user: _dataclass(Quota, quota) for user, quota in form["users"].items()}
    return QuotaConfig(
        default=_dataclass(Quota, form["default"]),
        users=MappingProxyType(users),
        priority_aging_s=float(form["priority_aging_s"]),
    )


def _unflat(cls: type[_T], form: Mapping[str, Any]) -> _T:
    """``cls`` from a form :func:`_flat` spelt."""
    hints = typing.get_type_hints(cls)
    data = dict(form)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        inner = hints[f.name]
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            first, *others = (g.name for g in dataclasses.fields(inner))
            spelt = {first: f.name} | {other: f"{f.name}_{other}" for other in others}
            data[f.name] = _dataclass(inner, {k: form[key] for k, key in spelt.items()})
    return _dataclass(cls, data)


def _dataclass(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """``cls`` from ``data``, as the field types say.

    Unknown names are dropped. Lists become tuples, mappings read-only mappings.
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = data[f.name]
        origin = typing.get_origin(hints[f.name])
        if origin is tuple and isinstance(value, list):
            value = tuple(value)
        elif origin is Mapping and isinstance(value, dict):
            value = MappingProxyType(value)
        kwargs[f.name] = value
    return cls(**kwargs)

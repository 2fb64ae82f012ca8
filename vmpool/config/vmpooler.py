"""vmpooler's file format: what is taken off a file before its settings are validated.

Rules:

- Leading colons. vmpooler writes its keys as Ruby symbols (``:config:``, ``:pools:``),
  and YAML gives Python the string ``":config"``. Every mapping key at every level
  loses one leading colon. So ``:config:`` and ``config:`` mean the same thing, and so
  do ``:name:`` and ``name:`` in a pool. A pool's ``provider`` and ``dns_plugin`` may
  name their target as a symbol too.
- Unknown keys are warnings, never a crash. vmpooler's keys that vmpool has no use for
  are accepted, so a vmpooler config loads as it is. They pass silently in the sections
  that do not change where VMs go. On a pool, a warning names the key: a ``zone`` on a
  simulated pool would otherwise put the VMs where the operator did not ask, unsaid.
- A null value is an absent one.
- Some settings are overridden by environment variables, as in vmpooler.
- The ``:schedule:`` keys are their periodic jobs' names. The earlier names still load.

Returns: :func:`read` gives the sections ready for
:class:`vmpool.config.settings.ConfigFile`, the warnings, and where each overridden or
renamed setting came from. A message then names the key or variable the user wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import AliasChoices, BaseModel
from pydantic_core import PydanticCustomError

from vmpool.config.errors import ConfigError, one_line
from vmpool.config.extra import LoadFile, strip_colons, with_extra_files
from vmpool.config.fields import NAME_RULE, text
from vmpool.config.settings import (
    AuthSection,
    ConfigFile,
    ConfigSection,
    PoolSection,
    RedisSection,
    Schedule,
    SentinelSection,
)
from vmpool.config.vmpooler_keys import (
    AUTH_IGNORED,
    CONFIG_IGNORED,
    CONFIG_IGNORED_PREFIXES,
    CONFIG_REMOVED,
    ENVIRONMENT,
    IGNORED_SECTIONS,
    POOL_IGNORED,
    POOL_IGNORED_PREFIXES,
    PROVIDER_IGNORED,
    REDIS_IGNORED,
    REDIS_URL_PARTS,
    SCHEDULE_KEY_ALIASES,
)
from vmpool.config.vmpooler_limits import LIMITS, map_limits
from vmpool.ids import InvalidIdentifier, validate_pool_name
from vmpool.providers.options import key_path, show
from vmpool.providers.registry import DEFAULT_PROVIDER, PROVIDER_CLASSES, provider_class

__all__ = ["FileData", "implemented", "read", "where"]

Loc = tuple[int | str, ...]


def _fields(model: type[Any]) -> frozenset[str]:
    return frozenset(model.model_fields)


def _accepted(model: type[BaseModel]) -> frozenset[str]:
    """The keys a model takes: its fields' names and their validation aliases."""
    names = set(model.model_fields)
    for field in model.model_fields.values():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
    return frozenset(names)


# Filled by the reader from a pool's other keys. A file that writes it is warned about.
_POOL_OPTIONS = "provider_options"


@dataclass(frozen=True)
class FileData:
    """A file read in vmpooler's format.

    Holds its sections for :class:`~vmpool.config.settings.ConfigFile`, its warnings, and
    the key (or environment variable) each renamed or overridden setting was given as.
    """

    sections: dict[str, Any]
    warnings: tuple[str, ...]
    origins: Mapping[Loc, str]


def read(
    data: Any,
    *,
    source: str,
    env: Mapping[str, str],
    load: LoadFile | None = None,
    base_dir: Path | None = None,
) -> FileData:
    """Take vmpooler's spelling off already-parsed YAML. ConfigError on a shape problem.

    ``load`` reads the extra files the config names (``extra_config``, ``EXTRA_CONFIG``),
    relative to ``base_dir``. None: the config is text, with no extra files
    (:mod:`vmpool.config.extra`)."""
    reader = _Reader(source)
    merged, notes = with_extra_files(
        reader.top(data), source=source, env=env, load=load, base_dir=base_dir
    )
    reader.warnings += notes
    top = reader.sections(merged)
    reader.config(top)
    reader.section(top, "redis", _fields(RedisSection), REDIS_IGNORED)
    reader.data_ttl(top)
    reader.environment(top, env)
    reader.providers(top)
    reader.dns_configs(top)
    reader.pools(top)
    reader.unused_providers(top)
    reader.redis_url_parts(top)
    reader.schedule(top)
    reader.auth(top)
    return FileData(top, tuple(reader.warnings), MappingProxyType(reader.origins))


def where(loc: Loc, origins: Mapping[Loc, str]) -> str:
    """The key path a message about ``loc`` names: as the user wrote it."""
    return origins.get(tuple(loc)) or key_path(loc)


def implemented() -> str:
    """The provider classes vmpool implements, for messages: "`simulated` is"."""
    names = [f"`{name}`" for name in PROVIDER_CLASSES]
    if len(names) == 1:
        return f"{names[0]} is"
    return f"{', '.join(names[:-1])} and {names[-1]} are"


class _Reader:
    """One read of one file: its name for messages, the warnings, the origins."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.warnings: list[str] = []
        self.origins: dict[Loc, str] = {}

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.source, key, problem)

    def warn(self, key: str, message: str) -> None:
        self.warnings.append(one_line(f"{self.source}: {key}: {message}"))

    def text(self, value: Any, path: str) -> str:
        try:
            return text(value)
        except PydanticCustomError as exc:
            raise self.fail(path, exc.message()) from None

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {show(value)}")
        return value

    def known(
        self,
        mapping: Mapping[str, Any],
        path: str,
        known: frozenset[str],
        ignored: frozenset[str] = frozenset(),
        prefixes: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """The known keys that have a value. A warning for each key nobody knows."""
        for key in mapping:
            if key not in known and key not in ignored and not key.startswith(prefixes):
                self.warn(f"{path}.{key}", "unknown key, ignored")
        return {key: value for key, value in mapping.items() if key in known and value is not None}

    def section(
        self,
        top: dict[str, Any],
        name: str,
        known: frozenset[str],
        ignored: frozenset[str] = frozenset(),
        prefixes: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        top[name] = self.known(self.mapping(top.get(name), name), name, known, ignored, prefixes)
        return top[name]  # type: ignore[no-any-return]

    # -- the sections, in the order their warnings come --------------------------------------
    def top(self, data: Any) -> dict[str, Any]:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise self.fail("top level", f"must be a mapping of sections, got {show(data)}")
        top = strip_colons(data, self.source)
        return top  # type: ignore[no-any-return]

    def sections(self, top: dict[str, Any]) -> dict[str, Any]:
        """The sections vmpool reads; a warning for each it does not know."""
        sections = _fields(ConfigFile)
        for key in top:
            if key not in sections and key not in IGNORED_SECTIONS:
                self.warn(key, "unknown section, ignored")
        return {key: value for key, value in top.items() if key in sections}

    def config(self, top: dict[str, Any]) -> None:
        ignored = CONFIG_IGNORED | frozenset(CONFIG_REMOVED) | frozenset(LIMITS)
        raw = self.mapping(top.get("config"), "config")
        mapped = map_limits(raw)  # vmpooler 3.8/3.9's circuit and rate-limit keys
        for key, message in mapped.warnings:
            self.warn(f"config.{key}", message)
        self.origins.update({("config", key): given for key, given in mapped.origins.items()})
        self.section(top, "config", _fields(ConfigSection), ignored, CONFIG_IGNORED_PREFIXES)
        for key, message in CONFIG_REMOVED.items():
            if raw.get(key) is not None:
                self.warn(f"config.{key}", message)

    def data_ttl(self, top: dict[str, Any]) -> None:
        """Where data_ttl is read: ``:config:`` wins over ``:redis:``.

        vmpooler keeps data_ttl under ``:redis:``, its docs list it under ``:config:``. When
        both are given, the ``:redis:`` one is neither used nor checked.
        """
        if "data_ttl" in top["config"]:
            top["redis"].pop("data_ttl", None)

    def environment(self, top: dict[str, Any], env: Mapping[str, str]) -> None:
        for variable, section, key in ENVIRONMENT:
            value = (env.get(variable) or "").strip()
            if not value:
                continue
            if variable == "REDIS_DATA_TTL" and "data_ttl" in top["config"]:
                section = "config"
            if variable == "VMPOOL_REDIS_URL":
                for part in REDIS_URL_PARTS:
                    top["redis"].pop(part, None)
            top[section][key] = value
            self.origins[(section, key)] = f"environment {variable}"

    def providers(self, top: dict[str, Any]) -> None:
        """Each entry with its ``provider_class`` made explicit.

        Unknown options of an implemented class are warned about, and kept: the class ignores
        them.
        """
        section = self.mapping(top.get("providers"), "providers")
        for name, raw in section.items():
            path = f"providers.{name}"
            try:
                validate_pool_name(name)
            except InvalidIdentifier:
                raise self.fail(path, f"provider names must be {NAME_RULE}") from None
            entry = dict(self.mapping(raw, path))
            given = entry.get("provider_class")
            entry["provider_class"] = (
                name if given is None else self.text(given, f"{path}.provider_class")
            )
            implementation = provider_class(entry["provider_class"])
            if implementation is not None:
                known = _accepted(implementation.options) | {"provider_class"}
                self.known(entry, path, known, PROVIDER_IGNORED)
            section[name] = entry
        top["providers"] = section

    def dns_configs(self, top: dict[str, Any]) -> None:
        section = self.mapping(top.get("dns_configs"), "dns_configs")
        top["dns_configs"] = {name: {} if raw is None else raw for name, raw in section.items()}

    def pools(self, top: dict[str, Any]) -> None:
        pools = top.get("pools")
        if pools is None:
            top.pop("pools", None)
            self.warn("pools", "no pools configured")
            return
        if not isinstance(pools, list):
            raise self.fail("pools", f"must be a list of pools, got {show(pools)}")
        if not pools:
            self.warn("pools", "no pools configured")
        known = _fields(PoolSection) - {_POOL_OPTIONS}
        for i, raw in enumerate(pools):
            path = f"pools[{i}]"
            if not isinstance(raw, dict):
                raise self.fail(path, f"must be a mapping with at least `name`, got {show(raw)}")
            for ref in ("provider", "dns_plugin"):
                if raw.get(ref) is not None:
                    raw[ref] = self.text(raw[ref], f"{path}.{ref}").lstrip(":")
            class_name, accepted = self.pool_class_keys(top, raw)
            own = accepted - known
            self.not_honoured(raw, path, known | own, class_name)
            pool = self.known(raw, path, known | own, POOL_IGNORED, POOL_IGNORED_PREFIXES)
            if pool.get("name") is None:
                raise self.fail(f"{path}.name", "missing: every pool needs a name")
            pool[_POOL_OPTIONS] = {key: pool.pop(key) for key in list(pool) if key in own}
            pools[i] = pool

    def pool_class_keys(
        self, top: dict[str, Any], pool: Mapping[str, Any]
    ) -> tuple[str, frozenset[str]]:
        """The pool's provider class, and the keys that class reads of a pool.

        No keys when the class is unknown.
        """
        name = pool.get("provider") or DEFAULT_PROVIDER
        entry = top["providers"].get(name)
        class_name = str(entry["provider_class"] if entry else name)
        implementation = provider_class(class_name)
        if implementation is None:
            return class_name, frozenset()
        return class_name, _accepted(implementation.pool_options)

    def not_honoured(
        self, pool: Mapping[str, Any], path: str, read: frozenset[str], class_name: str
    ) -> None:
        """A warning for each vmpooler pool key that nothing reads for this pool."""
        for key, value in pool.items():
            vmpooler = key in POOL_IGNORED or key.startswith(POOL_IGNORED_PREFIXES)
            if vmpooler and key not in read and value is not None:
                self.warn(
                    f"{path}.{key}",
                    f"a vmpooler key provider class {class_name!r} does not honour; ignored",
                )

    def unused_providers(self, top: dict[str, Any]) -> None:
        used = {pool.get("provider", DEFAULT_PROVIDER) for pool in top.get("pools", [])}
        for name, entry in top["providers"].items():
            if provider_class(entry["provider_class"]) is None and name not in used:
                self.warn(
                    f"providers.{name}",
                    f"provider_class {entry['provider_class']!r} is not implemented (only"
                    f" {implemented()}); no pool uses it, ignored",
                )

    def redis_url_parts(self, top: dict[str, Any]) -> None:
        """A URL makes the separate parts irrelevant: they are neither used nor checked."""
        redis = top["redis"]
        if redis.get("url") is None:
            self.sentinel(redis)
            return
        given = [part for part in REDIS_URL_PARTS if part in redis]
        if given:
            self.warn("redis.url", f"set, so {', '.join(given)} ignored")
        for part in given:
            del redis[part]

    def sentinel(self, redis: dict[str, Any]) -> None:
        """``sentinel`` names the servers: ``server`` and ``port`` are then ignored."""
        if redis.get("sentinel") is None:
            return
        path = "redis.sentinel"
        redis["sentinel"] = self.known(
            self.mapping(redis["sentinel"], path), path, _fields(SentinelSection)
        )
        given = [part for part in ("server", "port", "password") if part in redis]
        if given:
            self.warn(path, f"set, so {', '.join(given)} ignored (give the password in it)")
        for part in given:
            del redis[part]

    def schedule(self, top: dict[str, Any]) -> None:
        known = _fields(Schedule) | frozenset(SCHEDULE_KEY_ALIASES)
        section = self.section(top, "schedule", known)
        for old, new in SCHEDULE_KEY_ALIASES.items():
            if old not in section:
                continue
            if new in section:
                raise self.fail(f"schedule.{new}", f"given twice (as {old!r} and {new!r})")
            section[new] = section.pop(old)
            self.origins[("schedule", new)] = f"schedule.{old}"

    def auth(self, top: dict[str, Any]) -> None:
        """``:auth:`` checked: absent means no authentication at all.

        One present but empty (null, ``{}``, every line commented out) is an error. A
        commented-out section must not quietly turn auth off.
        """
        if "auth" not in top:
            return
        section = self.section(top, "auth", _fields(AuthSection), AUTH_IGNORED)
        if not section:
            raise self.fail(
                "auth",
                "present but empty (no key with a value); give its provider and users, or remove"
                " the section to run without authentication",
            )
        provider = section.get("provider")
        if isinstance(provider, str) and provider.strip() == "dummy":
            self.warn("auth.provider", "dummy authentication accepts anyone; for testing only")

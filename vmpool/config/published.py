"""The running fleet's config, published to Redis for commands given only its URL.

A command given only the Redis URL then works on the fleet's pools, as vmpooler keeps
its config in Redis.

Who: the processes that run the fleet (``vmpool up``, ``api``, ``worker``,
``scheduler``) publish the config they run with when they start. The other commands
read it when no config file is named. When one is named, they compare the two.

What: the config's public form (:mod:`vmpool.config.public`), the very form
``vmpool config show --json`` prints: every setting, every secret masked as ``***``
(users by name only, the Redis URL's password masked). A reader takes its own Redis
URL, never the published one. A command that needs a provider's secrets (``vmpool
audit`` on a real cloud) still needs the file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Final

import redis

from vmpool.config.model import Config
from vmpool.config.public import MASK, config_from_form, public_form
from vmpool.ids import DEFAULT_PREFIX
from vmpool.state.keys import Keys

__all__ = [
    "PublishedConfig",
    "PublishedConfigError",
    "config_differences",
    "find_published",
    "publish_config",
    "read_published",
]

# What may differ between two processes running the same config.
_NOT_COMPARED: Final = frozenset({"source", "warnings", "redis_url"})
# The layout of the published form: a reader refuses any other, as written by another
# vmpool version.
FORMAT: Final = 2


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


def _has_mask(value: Any) -> bool:
    if value == MASK:
        return True
    if isinstance(value, Mapping):
        return any(_has_mask(v) for v in value.values())
    return isinstance(value, list) and any(_has_mask(v) for v in value)


def _digest(form: Mapping[str, Any]) -> str:
    compared = {k: v for k, v in form.items() if k not in _NOT_COMPARED}
    return hashlib.sha256(json.dumps(compared, sort_keys=True).encode()).hexdigest()


def config_differences(a: Config, b: Mapping[str, Any]) -> list[str]:
    """The settings in which ``a`` differs from the published form ``b``.

    Settings are named by their top-level names, those ``vmpool config show --json``
    prints.
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


def _server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)

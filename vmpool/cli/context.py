"""The options every command shares, declared once, and the one context built from them.

A command asks for them with ``@with_context()`` (``@with_context(json=True)`` where it
prints data), placed right under ``@click.command``; it then receives a
:class:`CliContext` as its first argument::

    @click.command("pools")
    @with_context(json=True)
    def pools_command(cli: CliContext) -> None:
        rows = pool_table(cli.store, cli.config)
        ...

``--config PATH`` (``VMPOOL_CONFIG``) and ``--redis-url URL`` (``VMPOOL_REDIS_URL``) go
to every such command, ``--json`` to those that ask for it. The context loads the config
and opens Redis only when the command first touches ``.config``, ``.redis`` (and what is
built on them), so a command that never needs Redis never connects, and a bad config or
an unreachable Redis is one line on stderr (exit 2 and 1) whichever command met it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from functools import cached_property
from json import dumps
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import click

from vmpool.cli.errors import CliError, CliFailure
from vmpool.config import Config, ConfigError, load_config, mask_url_password, validate_redis_url
from vmpool.state.keys import Keys

if TYPE_CHECKING:  # imported on first use only: `vmpool config check` needs none of them
    from redis import Redis

    from vmpool.state.store import Store
    from vmpool.state.tokens import TokenStore

__all__ = ["CliContext", "echo_json", "load_with_redis_url", "with_context"]

P = ParamSpec("P")
R = TypeVar("R")

# Where `vmpool api` and `vmpool token` look when no Redis is configured, as the API's
# own factory does; the other commands refuse to guess.
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def load_with_redis_url(config_path: str | None, redis_url: str | None) -> Config:
    """The config with ``--redis-url`` applied; ConfigError when either is bad."""
    config = load_config(config_path or None)
    if redis_url is not None and redis_url.strip():
        try:
            url = validate_redis_url(redis_url)
        except ValueError as exc:
            raise ConfigError("--redis-url", None, str(exc)) from None
        config = dataclasses.replace(config, redis_url=url)
    return config


class CliContext:
    """The shared options of one command run, and what is built from them on first use.

    Every client it opened is closed by :meth:`close`, which ``with_context`` calls when
    the command returns.
    """

    def __init__(
        self,
        *,
        config_path: str | None = None,
        redis_url: str | None = None,
        as_json: bool = False,
        fallback_redis_url: str | None = None,
    ) -> None:
        self.config_path = config_path
        self.redis_url_option = redis_url
        self.as_json = as_json
        self._fallback_redis_url = fallback_redis_url

    def load_config(self) -> Config:
        """The config, raising :class:`ConfigError` (for callers that report it themselves)."""
        return load_with_redis_url(self.config_path, self.redis_url_option)

    @cached_property
    def config(self) -> Config:
        """The config with ``--redis-url`` applied; a bad one: one line, exit 2."""
        try:
            return self.load_config()
        except ConfigError as exc:
            raise CliError(str(exc)) from None

    @property
    def redis_url(self) -> str:
        """The Redis URL to use; one line and exit 2 when there is none."""
        url = self.config.redis_url or self._fallback_redis_url
        if not url:
            raise CliError(
                "no Redis to use: pass --redis-url URL, set VMPOOL_REDIS_URL,"
                " or set :redis: url in the config"
            )
        return url

    @cached_property
    def redis(self) -> Redis:
        """A client decoding replies to str (the store, tokens), checked with PING."""
        return self._connect(decode_responses=True)

    @cached_property
    def rq_redis(self) -> Redis:
        """A client leaving replies as bytes, as RQ needs, checked with PING."""
        return self._connect(decode_responses=False)

    @cached_property
    def keys(self) -> Keys:
        return Keys(self.config.key_prefix)

    @cached_property
    def store(self) -> Store:
        from vmpool.state.store import Store

        return Store(self.redis, self.keys)

    @cached_property
    def tokens(self) -> TokenStore:
        from vmpool.state.tokens import TokenStore

        return TokenStore(self.redis, self.keys)

    def check_redis(self) -> str:
        """The Redis URL once it answers PING (else one line, exit 1); no client kept."""
        self._connect(decode_responses=False).close()
        return self.redis_url

    def wait_for_redis(
        self, seconds: float, *, tick: Callable[[], None] | None = None, every_s: float = 10.0
    ) -> str:
        """:meth:`check_redis`, but a Redis that does not answer yet is waited for up to
        ``seconds`` (a pod started before its Redis, or during a restart), with a line on
        stderr every ``every_s``; ``tick`` runs between attempts (the alive file)."""
        import time

        from redis import RedisError

        from vmpool.state.connection import connect

        url = self.redis_url
        deadline = time.monotonic() + seconds
        next_note = time.monotonic()
        delay = 0.25
        while True:
            client = connect(url, self.config.redis_options, decode_responses=False)
            try:
                client.ping()
                return url
            except RedisError as exc:
                now = time.monotonic()
                if now >= deadline:
                    raise CliFailure(
                        f"cannot reach Redis at {mask_url_password(url)}: {exc}"
                        + (f" (waited {seconds:g}s)" if seconds > 0 else "")
                    ) from None
                if now >= next_note:
                    click.echo(f"waiting for Redis at {mask_url_password(url)}: {exc}", err=True)
                    next_note = now + every_s
            finally:
                client.close()
            if tick is not None:
                tick()
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(5.0, delay * 2)

    def _connect(self, *, decode_responses: bool) -> Redis:
        from redis import RedisError

        from vmpool.state.connection import connect

        url = self.redis_url
        client = connect(url, self.config.redis_options, decode_responses=decode_responses)
        try:
            client.ping()
        except RedisError as exc:
            client.close()
            raise CliFailure(f"cannot reach Redis at {mask_url_password(url)}: {exc}") from None
        return client

    def close(self) -> None:
        """Close the clients this context opened (only those: nothing is built here)."""
        for name in ("redis", "rq_redis"):
            client = self.__dict__.pop(name, None)
            if client is not None:
                client.close()


def echo_json(data: Any) -> None:
    click.echo(dumps(data, indent=2, sort_keys=False))


def with_context(
    *, json: bool = False, fallback_redis_url: str | None = None
) -> Callable[[Callable[Concatenate[CliContext, P], R]], Callable[P, R]]:
    """Give a command the shared options and its :class:`CliContext` as first argument.

    ``json`` adds ``--json``; ``fallback_redis_url`` is the Redis to use when neither
    option, environment nor config names one (else that is an error, exit 2).
    """

    def decorate(func: Callable[Concatenate[CliContext, P], R]) -> Callable[P, R]:
        @functools.wraps(func)
        def command(*args: P.args, **kwargs: P.kwargs) -> R:
            cli = CliContext(
                config_path=_text(kwargs.pop("config_path")),
                redis_url=_text(kwargs.pop("redis_url")),
                as_json=bool(kwargs.pop("as_json", False)),
                fallback_redis_url=fallback_redis_url,
            )
            try:
                return func(cli, *args, **kwargs)
            finally:
                cli.close()

        # click lists the options in the reverse order of application: these come first.
        shared: Callable[P, R] = _json_option(command) if json else command
        return _config_options(shared)

    return decorate


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _config_options(func: Callable[P, R]) -> Callable[P, R]:
    func = click.option(
        "--redis-url",
        "redis_url",
        metavar="URL",
        envvar="VMPOOL_REDIS_URL",
        default=None,
        help="Redis to use: redis://[:password@]host:port/db, rediss:// for TLS,"
        " redis+sentinel://[:password@]h1:26379,h2:26379/MASTER[/db] through Sentinel"
        " [env VMPOOL_REDIS_URL; default: from the config file].",
    )(func)
    return click.option(
        "--config",
        "config_path",
        metavar="PATH",
        envvar="VMPOOL_CONFIG",
        default=None,
        help="vmpool/vmpooler YAML config file [env VMPOOL_CONFIG; default: built-in demo].",
    )(func)


def _json_option(func: Callable[P, R]) -> Callable[P, R]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)

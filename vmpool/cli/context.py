"""The options every command shares, declared once, and the one context built from them.

A command asks for them with ``@with_context()`` (``@with_context(json=True)`` where it
prints data), placed right under ``@click.command``. It then receives a
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

The config of a command that names no file is the running fleet's, as its processes
published it to Redis (vmpool/config/published.py), when a Redis URL is given. Else the
built-in demo (a warning when that Redis has no fleet). vmpooler's VMPOOLER_CONFIG and
VMPOOLER_CONFIG_FILE name a config as --config does. A config named while a fleet
publishes a different one: a warning on stderr, and the command uses the one named. The
fleet's own processes (``follow_fleet=False``: up, api, worker, scheduler) never follow:
they run with their own config and publish it.
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
from vmpool.config import (
    Config,
    ConfigError,
    default_redis_options,
    load_config,
    mask_url_password,
    validate_redis_url,
)
from vmpool.config.loader import named_by_environment
from vmpool.config.published import (
    PublishedConfig,
    PublishedConfigError,
    config_differences,
    find_published,
    read_published,
)
from vmpool.state.keys import Keys

if TYPE_CHECKING:  # imported on first use only: `vmpool config check` needs none of them
    from redis import Redis

    from vmpool.state.connection import RedisOptions
    from vmpool.state.store import Store
    from vmpool.state.tokens import TokenStore

__all__ = ["CliContext", "echo_json", "load_with_redis_url", "with_context"]

P = ParamSpec("P")
R = TypeVar("R")

# Where `vmpool api` and `vmpool token` look when no Redis is configured, as the API's
# own factory does. The other commands refuse to guess.
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"


def load_with_redis_url(config_path: str | None, redis_url: str | None) -> Config:
    """The config with ``--redis-url`` applied. ConfigError when either is bad."""
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
        follow_fleet: bool = True,
    ) -> None:
        self.config_path = config_path
        self.redis_url_option = redis_url
        self.as_json = as_json
        self._fallback_redis_url = fallback_redis_url
        self.follow_fleet = follow_fleet
        # the fleet's published config, when the command runs with it
        self.fleet: PublishedConfig | None = None
        self._unreachable: CliFailure | None = None

    def load_config(self) -> Config:
        """The config, raising :class:`ConfigError` (for callers that report it themselves)."""
        return load_with_redis_url(self.config_path, self.redis_url_option)

    @cached_property
    def config(self) -> Config:
        """The config with ``--redis-url`` applied.

        The file named, else the running fleet's (given a Redis URL), else the demo. A bad
        one: one line, exit 2."""
        try:
            if self._follows_fleet():
                url = self._valid_url_option()
                fleet = self._fleet_config(url)
                if fleet is not None:
                    return fleet
                if self._unreachable is None:
                    click.echo(
                        f"warning: no fleet has published its config at {mask_url_password(url)}"
                        " (no `vmpool up`, api, worker or scheduler has run on it): this"
                        " command uses the built-in demo config; pass --config FILE",
                        err=True,
                    )
            return self.load_config()
        except ConfigError as exc:
            raise CliError(str(exc)) from None

    def _follows_fleet(self) -> bool:
        """Whether the config is the fleet's: no file named, a Redis URL given."""
        named = self.config_path or named_by_environment()
        return self.follow_fleet and not named and bool(self.redis_url_option)

    def _valid_url_option(self) -> str:
        try:
            return validate_redis_url(str(self.redis_url_option))
        except ValueError as exc:
            raise ConfigError("--redis-url", None, str(exc)) from None

    def _fleet_config(self, url: str) -> Config | None:
        """The config the fleet at ``url`` published, if one did.

        An unreachable Redis is said when the command first needs it (a command may fail
        on its input first)."""
        try:
            # the config (and its :redis: settings) comes from there: the defaults meanwhile
            client = self._connect_url(url, decode_responses=True, options=default_redis_options())
        except CliFailure as exc:
            self._unreachable = exc
            return None
        self.__dict__["redis"] = client  # the command's own client from now on
        try:
            self.fleet = find_published(client)
        except PublishedConfigError as exc:
            raise CliError(f"{exc}: pass --config with the fleet's config file") from None
        if self.fleet is None:
            return None
        return dataclasses.replace(self.fleet.config, redis_url=url, source=self.fleet.origin())

    def _warn_if_the_fleet_differs(self, client: Redis) -> None:
        """A config file named while the fleet runs another: say so, once, on stderr."""
        try:  # the fleet of this config's key prefix, else the one in this database
            published = read_published(client, self.keys) or find_published(client)
        except PublishedConfigError:
            return
        if published is None:
            return
        differ = config_differences(self.config, published.form)
        if differ:
            click.echo(
                f"warning: {self.config.source} differs from the running fleet's config"
                f" ({published.origin()}) in: {', '.join(differ)}; this command uses"
                f" {self.config.source}",
                err=True,
            )

    @property
    def redis_url(self) -> str:
        """The Redis URL to use. One line and exit 2 when there is none."""
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
        client = self._connect(decode_responses=True)
        if self.follow_fleet and (self.config_path or named_by_environment()):
            self._warn_if_the_fleet_differs(client)
        return client

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
        """The Redis URL once it answers PING (else one line, exit 1). No client kept."""
        self._connect(decode_responses=False).close()
        return self.redis_url

    def wait_for_redis(
        self, seconds: float, *, tick: Callable[[], None] | None = None, every_s: float = 10.0
    ) -> str:
        """:meth:`check_redis`, waiting up to ``seconds`` for a Redis that does not answer yet.

        For a pod started before its Redis, or during a restart: a line on stderr every
        ``every_s``. ``tick`` runs between attempts (the alive file)."""
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

    def publish_config(self, who: str, url: str | None = None, *, warn: bool = True) -> None:
        """What the fleet's own processes do at start.

        Say the config's warnings, and publish the config to the Redis at ``url``
        (default: the command's) as the running fleet's. A warning on stderr when it
        replaces a different one."""
        import os
        import socket

        from redis import RedisError

        from vmpool.config.published import publish_config

        for warning in self.config.warnings if warn else ():  # a misspelt key: its default
            click.echo(f"warning: {warning}", err=True)
        client = self._connect_url(url or self.redis_url, decode_responses=True)
        publisher = f"{who} on {socket.gethostname()} (pid {os.getpid()})"
        try:
            replaced = publish_config(client, self.config, publisher=publisher)
        except RedisError as exc:  # the fleet runs without it. The CLI then needs --config
            click.echo(f"warning: {who}: could not publish the config: {exc}", err=True)
            return
        finally:
            client.close()
        if replaced:
            click.echo(
                f"warning: {who}: the fleet published another config ({replaced}); this"
                f" process runs with {self.config.source} and publishes it: do all of the"
                " fleet's processes run one config?",
                err=True,
            )

    def _connect(self, *, decode_responses: bool) -> Redis:
        if self._unreachable is not None:
            raise self._unreachable
        return self._connect_url(self.redis_url, decode_responses=decode_responses)

    def _connect_url(
        self, url: str, *, decode_responses: bool, options: RedisOptions | None = None
    ) -> Redis:
        from redis import RedisError

        from vmpool.state.connection import connect

        options = options or self.config.redis_options
        client = connect(url, options, decode_responses=decode_responses)
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
    *, json: bool = False, fallback_redis_url: str | None = None, follow_fleet: bool = True
) -> Callable[[Callable[Concatenate[CliContext, P], R]], Callable[P, R]]:
    """Give a command the shared options and its :class:`CliContext` as first argument.

    ``json`` adds ``--json``. ``fallback_redis_url`` is the Redis to use when neither
    option, environment nor config names one (else that is an error, exit 2).
    ``follow_fleet=False`` for the fleet's own processes (they publish their config).
    """

    def decorate(func: Callable[Concatenate[CliContext, P], R]) -> Callable[P, R]:
        @functools.wraps(func)
        def command(*args: P.args, **kwargs: P.kwargs) -> R:
            cli = CliContext(
                config_path=_text(kwargs.pop("config_path")),
                redis_url=_text(kwargs.pop("redis_url")),
                as_json=bool(kwargs.pop("as_json", False)),
                fallback_redis_url=fallback_redis_url,
                follow_fleet=follow_fleet,
            )
            try:
                return func(cli, *args, **kwargs)
            finally:
                cli.close()

        # click lists the options in the reverse order of application: these come first.
        shared: Callable[P, R] = _json_option(command) if json else command
        return _config_options(shared, follow_fleet=follow_fleet)

    return decorate


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _config_options(func: Callable[P, R], *, follow_fleet: bool) -> Callable[P, R]:
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
        help="vmpool/vmpooler YAML config file [env VMPOOL_CONFIG; default: "
        + (
            "the running fleet's, read from Redis, else the built-in demo]."
            if follow_fleet
            else "built-in demo]."
        ),
    )(func)


def _json_option(func: Callable[P, R]) -> Callable[P, R]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)

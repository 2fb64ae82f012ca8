"""The ``vmpool`` command line (click).

Conventions every command follows (see CONTRACT.md, "Command line"):

* ``@common_options`` gives a command ``--config PATH`` (``VMPOOL_CONFIG``) and
  ``--redis-url URL`` (``VMPOOL_REDIS_URL``), passed as ``config_path`` and ``redis_url``;
  ``@json_option`` gives ``--json``, passed as ``as_json``.
* ``load_cli_config(config_path, redis_url)`` loads the configuration; a bad file becomes
  one line on stderr, ``vmpool: error: <file>: <key>: <problem>``, and exit status 2.
* Raise :class:`CliError` for bad usage or input (one line on stderr, exit status 2)
  and :class:`CliFailure` for a failed check or a failed request (one line, exit 1).
  Never a traceback.
* Anything unexpected that escapes a command: ``main`` prints one line and exits 1
  (set ``VMPOOL_DEBUG=1`` to get the traceback instead).

Command groups that live in other modules are registered in ``_LAZY_COMMANDS`` below
and imported only when invoked, so those modules may import this one freely (no import
cycle) and ``vmpool config check`` does not pay for importing the API server.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import IO, Any, Final, TypeVar

import click
import redis
import yaml

from vmpool import __version__
from vmpool.config import (
    Config,
    ConfigError,
    load_config,
    mask_url_password,
    validate_redis_url,
)

__all__ = [
    "CliError",
    "CliFailure",
    "cli",
    "common_options",
    "echo_json",
    "json_option",
    "load_cli_config",
    "main",
    "open_redis",
    "require_redis_url",
]

F = TypeVar("F", bound=Callable[..., Any])

# --------------------------------------------------------------------------------------
# Commands defined in other modules: "command name" -> "module:attribute" (a click
# command or group). Add one line per module, e.g.
#     "request": "vmpool.cli.request:request_group",
# Expected here: request, pools, token, audit, worker, scheduler, enqueue, api, up.
# (A module may instead call ``cli.add_command(...)`` at import, or decorate with
# ``@cli.command()``; it must then be imported at the bottom of this file.)
# --------------------------------------------------------------------------------------
_LAZY_COMMANDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "request": "vmpool.cli.request:request_group",
        "up": "vmpool.cli.up:up_command",
        "pools": "vmpool.cli.admin:pools_command",
        "audit": "vmpool.cli.admin:audit_command",
        "worker": "vmpool.cli.fleet:worker_command",
        "scheduler": "vmpool.cli.fleet:scheduler_command",
        "enqueue": "vmpool.cli.fleet:enqueue_command",
        "api": "vmpool.cli.api:api_command",
        "token": "vmpool.cli.api:token_group",
    }
)


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no message)"


class CliError(click.ClickException):
    """Bad usage or input: ``vmpool: error: <message>`` on stderr, one line, exit 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(_one_line(message))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"vmpool: error: {self.format_message()}", err=True, file=file)


class CliFailure(CliError):
    """A failed check or a failed request: the same one line, exit 1."""

    exit_code = 1


# --------------------------------------------------------------------------------------
# Shared options and helpers for every command
# --------------------------------------------------------------------------------------


def common_options(func: F) -> F:
    """Add ``--config PATH`` and ``--redis-url URL`` (as ``config_path``, ``redis_url``)."""
    func = click.option(
        "--redis-url",
        "redis_url",
        metavar="URL",
        envvar="VMPOOL_REDIS_URL",
        default=None,
        help="Redis to use: redis://[:password@]host:port/db, rediss:// for TLS"
        " [env VMPOOL_REDIS_URL; default: from the config file].",
    )(func)
    func = click.option(
        "--config",
        "config_path",
        metavar="PATH",
        envvar="VMPOOL_CONFIG",
        default=None,
        help="vmpool/vmpooler YAML config file [env VMPOOL_CONFIG; default: built-in demo].",
    )(func)
    return func


def json_option(func: F) -> F:
    """Add ``--json`` (as ``as_json``): print machine-readable JSON instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)


def _load(config_path: str | None, redis_url: str | None) -> Config:
    """The config with ``--redis-url`` applied; ConfigError when either is bad."""
    config = load_config(config_path or None)
    if redis_url is not None and redis_url.strip():
        try:
            url = validate_redis_url(redis_url)
        except ValueError as exc:
            raise ConfigError("--redis-url", None, str(exc)) from None
        config = dataclasses.replace(config, redis_url=url)
    return config


def load_cli_config(config_path: str | None, redis_url: str | None = None) -> Config:
    """Load the configuration for a command; a bad file or URL exits 2 with one line."""
    try:
        return _load(config_path, redis_url)
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def require_redis_url(config: Config) -> str:
    """The Redis URL a command must use; one line and exit 2 when there is none."""
    if not config.redis_url:
        raise CliError(
            "no Redis to use: pass --redis-url URL, set VMPOOL_REDIS_URL,"
            " or set :redis: url in the config"
        )
    return config.redis_url


def open_redis(config: Config, *, decode_responses: bool = True) -> redis.Redis:
    """A client for the configured Redis, checked with PING; unreachable: one line, exit 1.

    The store works with either kind of client; RQ needs ``decode_responses=False``.
    """
    url = require_redis_url(config)
    client = redis.Redis.from_url(
        url, decode_responses=decode_responses, socket_connect_timeout=5, socket_timeout=30
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        raise CliFailure(f"cannot reach Redis at {mask_url_password(url)}: {exc}") from None
    return client


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# --------------------------------------------------------------------------------------
# The group
# --------------------------------------------------------------------------------------


class _LazyGroup(click.Group):
    """A click group that imports the commands named in ``lazy_commands`` on first use."""

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands: Mapping[str, str] = lazy_commands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            self.add_command(self._import(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def _import(self, cmd_name: str) -> click.Command:
        module_name, _, attribute = self.lazy_commands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}:{attribute} is not a click command")
        return command


@click.group(
    cls=_LazyGroup,
    lazy_commands=_LAZY_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="vmpool")
def cli() -> None:
    """vmpool: an on-demand VM pool manager, compatible with vmpooler's API.

    Every command takes --config PATH and --redis-url URL (or VMPOOL_CONFIG and
    VMPOOL_REDIS_URL). Exit status: 0 success, 1 a failed check or request, 2 bad usage
    or input.
    """


# --------------------------------------------------------------------------------------
# vmpool config ...
# --------------------------------------------------------------------------------------


@cli.group("config")
def config_group() -> None:
    """Validate or show the configuration."""


@config_group.command("check")
@common_options
@json_option
def config_check(config_path: str | None, redis_url: str | None, as_json: bool) -> None:
    """Validate a config file: exit 0 when usable (warnings on stderr), else 2."""
    try:
        config = _load(config_path, redis_url)
    except ConfigError as exc:
        if as_json:
            echo_json({"ok": False, "source": exc.source, "error": str(exc)})
        raise CliError(str(exc)) from None
    if as_json:
        echo_json(
            {
                "ok": True,
                "source": config.source,
                "pools": list(config.pools),
                "providers": list(config.providers),
                "warnings": list(config.warnings),
            }
        )
        return
    click.echo(
        f"OK: {config.source}: {_plural(len(config.pools), 'pool')},"
        f" {_plural(len(config.providers), 'provider')}"
    )
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)


@config_group.command("show")
@common_options
@json_option
def config_show(config_path: str | None, redis_url: str | None, as_json: bool) -> None:
    """Print the effective configuration (secrets masked, durations in seconds)."""
    config = load_cli_config(config_path, redis_url)
    data = config.to_public_dict()
    if as_json:
        echo_json(data)
        return
    click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def main() -> None:
    """The ``vmpool`` console script."""
    try:
        cli.main(prog_name="vmpool")
    except Exception as exc:  # click has handled usage errors and CliError already
        if os.environ.get("VMPOOL_DEBUG"):
            raise
        click.echo(f"vmpool: error: {type(exc).__name__}: {_one_line(str(exc))}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

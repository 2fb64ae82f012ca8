"""``vmpool config check|show|schema``.

Validate a config file, print the effective config, print the JSON Schema of the file
format."""

from __future__ import annotations

import click
import yaml

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError
from vmpool.config import ConfigError, json_schema, public_form

__all__ = ["config_group"]


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@click.group("config")
def config_group() -> None:
    """Validate or show the configuration, or print its JSON Schema."""


@config_group.command("check")
@with_context(json=True)
def config_check(cli: CliContext) -> None:
    """Validate a config file: exit 0 when usable (warnings on stderr), else 2."""
    try:
        config = cli.load_config()
    except ConfigError as exc:
        if cli.as_json:  # the JSON on stdout, and the one line on stderr all the same
            echo_json({"ok": False, "source": exc.source, "error": str(exc)})
        raise CliError(str(exc)) from None
    if cli.as_json:
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
    for warning in config.warnings:  # before the verdict, which is the last line
        click.echo(f"warning: {warning}", err=True)
    warned = f" ({_plural(len(config.warnings), 'warning')} above)" if config.warnings else ""
    click.echo(
        f"OK: {config.source}: {_plural(len(config.pools), 'pool')},"
        f" {_plural(len(config.providers), 'provider')}{warned}"
    )


@config_group.command("show")
@with_context(json=True)
def config_show(cli: CliContext) -> None:
    """Print the effective configuration (secrets masked, durations in seconds).

    The same form the fleet's processes publish to Redis.
    """
    data = public_form(cli.config)
    if cli.as_json:
        echo_json(data)
        return
    click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())


@config_group.command("schema")
@with_context(json=True)
def config_schema(cli: CliContext) -> None:
    """Print the JSON Schema of the config file (JSON, --json or not). No file is read."""
    echo_json(json_schema())

"""The ``vmpool`` command line: the root group and the console script's ``main``.

Each command group lives in its own module and is imported only when invoked (the
table below), so ``vmpool config check`` does not pay for importing the API server.
Command modules get their options and their config and Redis from
:mod:`vmpool.cli.context` and report failures with :mod:`vmpool.cli.errors`. None of
them imports this module.

Exit status: 0 success, 1 a failed check or request, 2 bad usage or input. Anything
unexpected is one line and status 1 (``VMPOOL_DEBUG=1`` shows the traceback instead).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import click

from vmpool import __version__
from vmpool.cli.errors import one_line

__all__ = ["cli", "main"]

# "command name" -> "module:attribute" (a click command or group).
COMMANDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "config": "vmpool.cli.config:config_group",
        "request": "vmpool.cli.request:request_group",
        "pools": "vmpool.cli.pools:pools_command",
        "audit": "vmpool.cli.audit:audit_command",
        "token": "vmpool.cli.token:token_group",
        "api": "vmpool.cli.api:api_command",
        "worker": "vmpool.cli.fleet:worker_command",
        "scheduler": "vmpool.cli.fleet:scheduler_command",
        "enqueue": "vmpool.cli.enqueue:enqueue_command",
        "up": "vmpool.cli.up:up_command",
        "probe": "vmpool.cli.probe:probe_group",
        "vm": "vmpool.cli.vm:vm_group",
        "fleet-id": "vmpool.cli.fleet_id:fleet_id_command",
        "redis": "vmpool.cli.redis_admin:redis_group",
    }
)


class LazyGroup(click.Group):
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
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="vmpool")
def cli() -> None:
    """vmpool: an on-demand VM pool manager, compatible with vmpooler's API.

    Every command takes --config PATH and --redis-url URL (or VMPOOL_CONFIG and
    VMPOOL_REDIS_URL). Exit status: 0 success, 1 a failed check or request, 2 bad usage
    or input.
    """


def main() -> None:
    """The ``vmpool`` console script."""
    try:
        cli.main(prog_name="vmpool")
    except Exception as exc:  # click has handled usage errors and CliError already
        if os.environ.get("VMPOOL_DEBUG"):
            raise
        click.echo(f"vmpool: error: {type(exc).__name__}: {one_line(str(exc))}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()

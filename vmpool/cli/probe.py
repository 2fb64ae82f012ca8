"""``vmpool probe worker|scheduler``: is the loop alive? For Kubernetes' exec probes.

``worker`` reads the modification time of the file ``vmpool worker --alive-file``
touches on every turn of its loop, while a job runs (up to the job's timeout plus a
minute) and while it waits out a Redis outage (workers/loop.py). ``scheduler`` the file
``vmpool scheduler --alive-file`` touches on every tick (at most ``--interval`` apart)
and while it waits for Redis. Neither connects to Redis: a process waiting for Redis is
alive, and an unreachable Redis has its own alert.

Exit status: 0 the file is fresher than ``--max-age``. 1 it is older (one line
naming its age). 2 bad usage or no file (one line).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure, OneLineCommand, OneLineGroup

__all__ = ["ALIVE_FILE_ENV", "SCHEDULER_ALIVE_FILE_ENV", "probe_group"]

# Where `vmpool worker` and this probe find the file when no --alive-file is given.
ALIVE_FILE_ENV: Final = "VMPOOL_WORKER_ALIVE_FILE"
# The same for `vmpool scheduler`.
SCHEDULER_ALIVE_FILE_ENV: Final = "VMPOOL_SCHEDULER_ALIVE_FILE"


F = TypeVar("F", bound=Callable[..., Any])


def _alive_options(env: str, who: str) -> Callable[[F], F]:
    """The two options of a liveness probe: --max-age, and --alive-file (or ``env``)."""

    def decorate(command: F) -> F:
        command = click.option(
            "--alive-file",
            "path",
            metavar="PATH",
            envvar=env,
            default=None,
            help=f"The file `vmpool {who}` touches [env {env}].",
        )(command)
        return click.option(
            "--max-age",
            type=click.FloatRange(min=0, min_open=True),
            default=60.0,
            show_default=True,
            metavar="SECONDS",
            help="Alive while the file was touched less than this long ago.",
        )(command)

    return decorate


@click.group("probe", cls=OneLineGroup)
def probe_group() -> None:
    """Health checks for Kubernetes' probes (no Redis needed)."""


@probe_group.command("worker", cls=OneLineCommand)
@with_context(follow_fleet=False)
@_alive_options(ALIVE_FILE_ENV, "worker")
def probe_worker_command(cli: CliContext, max_age: float, path: str | None) -> None:
    """Exit 0 when the worker loop touched its alive file within --max-age seconds."""
    # ``cli`` is never touched: the config is not loaded and Redis never connected.
    check_alive("worker", path, max_age, ALIVE_FILE_ENV)


@probe_group.command("scheduler", cls=OneLineCommand)
@with_context()
@_alive_options(SCHEDULER_ALIVE_FILE_ENV, "scheduler")
def probe_scheduler_command(cli: CliContext, max_age: float, path: str | None) -> None:
    """Exit 0 when the scheduler ticked (touched its alive file) within --max-age seconds."""
    # ``cli`` is never touched: the config is not loaded and Redis never connected.
    check_alive("scheduler", path, max_age, SCHEDULER_ALIVE_FILE_ENV)


def check_alive(what: str, path: str | None, max_age: float, env: str) -> None:
    """One line and exit 0 when ``path`` was touched within ``max_age`` seconds.

    Exit 1 when it is older, 2 when there is no file to read."""
    if not path:
        raise CliError(f"no alive file to read: pass --alive-file PATH or set {env}")
    try:
        touched = os.stat(path).st_mtime
    except FileNotFoundError:
        raise CliError(f"no alive file at {path}: the {what} loop has not started") from None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    age = max(0.0, time.time() - touched)
    if age >= max_age:
        raise CliFailure(
            f"{what} loop stale: {path} last touched {age:.0f} s ago (max {max_age:g} s)"
        )
    click.echo(f"{what} loop alive: {path} touched {age:.1f} s ago")

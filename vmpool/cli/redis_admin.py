"""``vmpool redis``: an operator's commands on the Redis group itself.

``vmpool redis switchover`` switches a Sentinel group's primary to a replica without
losing a write (vmpool/state/switchover.py): writes paused, every replica caught up,
``SENTINEL FAILOVER``, the old primary made a replica of the new one, writes resumed.
It says each step on stderr as it happens, and the outcome on stdout (``--json``: one
object).

Exit status: 0 switched. 1 the switch failed (one line naming the step; writes were
resumed). 2 bad usage, or a Redis not reached through Sentinel.
"""

from __future__ import annotations

from typing import Final

import click
import redis

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError, CliFailure, OneLineCommand, OneLineGroup
from vmpool.config import mask_url_password
from vmpool.state.switchover import SwitchoverFailed, group_access, show, switchover

__all__ = ["redis_group"]

DEFAULT_TIMEOUT_S: Final = 30.0


@click.group("redis", cls=OneLineGroup)
def redis_group() -> None:
    """Operate the Redis group vmpool keeps its state in."""


@redis_group.command("switchover", cls=OneLineCommand)
@with_context(json=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1, max=300),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="How long the replicas may take to catch up and the sentinels to promote one,"
    " together; writes wait at most this long (plus 5 s).",
)
def switchover_command(cli: CliContext, timeout_s: float) -> None:
    """Switch the primary to a replica, losing no write (a planned failover).

    Pauses writes on the primary (CLIENT PAUSE WRITE), waits until every replica the
    sentinels could promote holds all of them, asks a sentinel to fail over (SENTINEL
    FAILOVER), makes the old primary a replica of the new one, and resumes writes.
    Clients see their writes wait for about a second, then go on against the new
    primary. Needs Redis reached through Sentinel (redis+sentinel://).
    """
    url = cli.redis_url
    try:
        group = group_access(url, cli.config.redis_options)
    except ValueError as exc:
        raise CliError(f"redis switchover: {exc}") from None
    try:
        done = switchover(group, timeout_s=timeout_s, report=_progress)
    except SwitchoverFailed as exc:
        raise CliFailure(f"redis switchover: {exc}") from None
    except redis.RedisError as exc:
        raise CliFailure(
            f"redis switchover: {type(exc).__name__}: {exc} (redis {mask_url_password(url)})"
        ) from None
    if cli.as_json:
        echo_json(
            {
                "old_primary": show(done.old),
                "new_primary": show(done.new),
                "offset": done.offset,
                "writes_paused_s": round(done.paused_s, 3),
                "took_s": round(done.took_s, 3),
            }
        )
    else:
        click.echo(
            f"switched {show(done.old)} -> {show(done.new)} in {done.took_s:.2f} s"
            f" (writes paused {done.paused_s:.2f} s; every replica held offset {done.offset})"
        )


def _progress(line: str) -> None:
    click.echo(f"switchover: {line}", err=True)

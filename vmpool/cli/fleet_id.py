"""``vmpool fleet-id``: the fleet's identity, its other marks, and each provider's mark.

The identity is made once per Redis (docs/providers.md, "Fleet identity"); a provider's
``fleet_id`` option overrides it. ``--adopt MARK`` makes every VM under MARK the fleet's
(those no record holds are then destroyed as leaks); ``--forget MARK`` stops listing
MARK's VMs. Either ends the condition a lost mark puts the fleet in (docs/operations.md,
"Redis lost its data").
"""

from __future__ import annotations

import re

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError
from vmpool.providers.identity import fleet_ids
from vmpool.state.fleet_identity import (
    MARK_PATTERN,
    FleetMarks,
    MarkAction,
    MarkRole,
    read_marks,
    set_mark,
    settle_identity,
)

__all__ = ["fleet_id_command"]

_ROLES = {
    MarkRole.LOST: "lost: Redis lost the fleet's data; its VMs are neither adopted nor destroyed",
    MarkRole.LEGACY: "legacy: the key prefix of older versions; its VMs are the fleet's only"
    " where a record holds them",
    MarkRole.ADOPTED: "adopted: every VM under it is the fleet's",
}
_DONE = {
    "adopted": "adopted {mark}: every VM marked with it is the fleet's; reconcile destroys"
    " those no record holds after reconcile_grace",
    "forgotten": "forgot {mark}: its VMs are no longer listed (find them by the tag"
    " vmpool-fleet={mark})",
}
_REFUSED = {
    "identity": "{mark} is the fleet's identity: nothing to {action}",
    "unknown": "the fleet has no mark {mark} (`vmpool fleet-id` lists them)",
}


@click.command("fleet-id")
@with_context(json=True)
@click.option("--adopt", "adopt", metavar="MARK", help="Own every VM marked MARK.")
@click.option("--forget", "forget", metavar="MARK", help="Stop listing the VMs marked MARK.")
def fleet_id_command(cli: CliContext, adopt: str | None, forget: str | None) -> None:
    """The fleet's identity (kept in Redis), its other marks and each provider's fleet tag.

    With --adopt or --forget, the operator's word on one of its marks first."""
    if adopt and forget:
        raise CliError("--adopt and --forget: one at a time")
    if adopt or forget:
        _set(cli, "adopt" if adopt else "forget", adopt or forget or "")
    marks = read_marks(cli.redis, cli.keys) or settle_identity(cli.redis, cli.keys)[0]
    providers = fleet_ids(cli.redis, cli.keys, cli.config.providers)
    problem = marks.problem()
    if problem:
        click.echo(f"warning: {problem}", err=True)
    if cli.as_json:
        others = {mark: str(role) for mark, role in marks.others.items()}
        echo_json({"id": marks.identity, "providers": providers, "marks": others})
        return
    _show(marks, providers)


def _set(cli: CliContext, action: MarkAction, mark: str) -> None:
    if not re.fullmatch(MARK_PATTERN, mark):
        raise CliError(f"--{action} {mark!r}: a mark is 1 to 63 letters, digits, '-', '_' or '.'")
    outcome = set_mark(cli.redis, cli.keys, action, mark)
    if outcome in _REFUSED:
        raise CliError(_REFUSED[outcome].format(mark=mark, action=action))
    click.echo(_DONE[outcome].format(mark=mark), err=True)


def _show(marks: FleetMarks, providers: dict[str, str]) -> None:
    click.echo(f"fleet identity: {marks.identity}")
    for mark, role in sorted(marks.others.items()):
        click.echo(f"mark {mark}: {_ROLES[role]}")
    for name, mark in providers.items():
        own = "" if mark == marks.identity else "  (its fleet_id option)"
        click.echo(f"provider {name}: vmpool-fleet={mark}{own}")

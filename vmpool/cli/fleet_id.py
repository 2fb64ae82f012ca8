"""``vmpool fleet-id``: the fleet's identity and the mark each provider tags its VMs with.

The identity is generated once per Redis (docs/providers.md, "Fleet identity"). A
provider's ``fleet_id`` option overrides it. Note it before moving the fleet to a new
Redis: the new one must be given the same mark, or the VMs already made are orphaned.
"""

from __future__ import annotations

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.providers.identity import fleet_ids
from vmpool.state.fleet_identity import fleet_identity

__all__ = ["fleet_id_command"]


@click.command("fleet-id")
@with_context(json=True)
def fleet_id_command(cli: CliContext) -> None:
    """The fleet's identity (kept in Redis) and each provider's fleet tag."""
    identity = fleet_identity(cli.redis, cli.keys)
    providers = fleet_ids(cli.redis, cli.keys, cli.config.providers)
    if cli.as_json:
        echo_json({"id": identity, "providers": providers})
        return
    click.echo(f"fleet identity: {identity}")
    for name, mark in providers.items():
        own = "" if mark == identity else "  (its fleet_id option)"
        click.echo(f"provider {name}: vmpool-fleet={mark}{own}")

"""``vmpool pools --set-size POOL=N | --unset-size POOL | --reset POOL``.

Change pools at runtime from the shell, as an admin, through the same operations as the
API's ``POST /config/poolsize``, ``DELETE /config/poolsize/<pool>`` and ``POST
/poolreset`` (:mod:`vmpool.lifecycle.overrides`): the overrides live in Redis, the workers
honour them at once, and a reset's destroys go on the fleet's queues."""

from __future__ import annotations

from collections.abc import Sequence

import click
import redis

from vmpool.cli.context import CliContext
from vmpool.cli.errors import CliError
from vmpool.config.fields import MAX_COUNT
from vmpool.lifecycle.overrides import reset_pools, revert_setting, set_setting
from workers.queues import RQDispatcher

__all__ = ["apply_pool_changes", "parse_sizes"]


def _pool(cli: CliContext, name: str, option: str) -> str:
    if name not in cli.config.pools:
        raise CliError(f"{option}: no pool named {name!r}")
    return name


def parse_sizes(cli: CliContext, given: Sequence[str]) -> dict[str, str]:
    """``POOL=N`` arguments of ``--set-size``: pool -> size (0 to 10000), checked."""
    sizes: dict[str, str] = {}
    for arg in given:
        name, sep, raw = arg.partition("=")
        if not sep or not raw.isdigit() or not raw.isascii() or int(raw) > MAX_COUNT:
            raise CliError(f"--set-size {arg!r}: expected POOL=N, N from 0 to {MAX_COUNT}")
        sizes[_pool(cli, name, "--set-size")] = str(int(raw))
    return sizes


def apply_pool_changes(
    cli: CliContext, set_size: Sequence[str], unset_size: Sequence[str], reset: Sequence[str]
) -> None:
    """Check every argument, then apply them and say what changed.

    Nothing changes on a bad argument. One line per change."""
    sizes = parse_sizes(cli, set_size)
    unset = [_pool(cli, name, "--unset-size") for name in unset_size]
    resets = [_pool(cli, name, "--reset") for name in reset]
    dispatch = RQDispatcher(cli.rq_redis, cli.keys)
    try:
        if sizes:
            set_setting(cli.store, cli.config, "poolsize", sizes, actor="cli")
            for name, size in sizes.items():
                click.echo(f"{name}: size {size} (configured {cli.config.pools[name].size})")
        for name in unset:
            out = revert_setting(cli.store, cli.config, "poolsize", name, actor="cli")
            click.echo(f"{name}: size {out.configured} (was {out.before})")
        for name, names in reset_pools(cli.store, resets, actor="cli", dispatch=dispatch).items():
            click.echo(f"{name}: reset, {len(names)} ready VMs replaced")
    except redis.RedisError as exc:
        raise CliError(f"Redis: {exc}") from None

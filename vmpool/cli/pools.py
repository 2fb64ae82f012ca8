"""``vmpool pools``: per pool, its size and its VMs by state, read from the live state.

With ``--set-size`` / ``--unset-size`` / ``--reset``, change pools at runtime first
(:mod:`vmpool.cli.pool_admin`)."""

from __future__ import annotations

from collections.abc import Mapping

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.output import echo_table
from vmpool.config import Config, PoolConfig
from vmpool.lifecycle.overrides import pools_with_overrides
from vmpool.state.pool_failures import read_pool_failures
from vmpool.state.store import Store
from vmpool.state.transitions import RequestStatus, VMState

__all__ = ["pool_table", "pools_command"]

COLUMNS = (
    "pool",
    "alias",
    "size",
    "ready",
    "pending",
    "running",
    "completed",
    "on_hold",
    "ondemand_queue",
    "failing",
)
FAILING_SHOWN = 100  # characters of the last error the table shows (JSON: all of it)


def pool_table(store: Store, config: Config) -> list[dict[str, object]]:
    """The rows of `vmpool pools`: each pool's size, its VMs by state, its on-demand queue.

    One row per configured pool, then one per pool the config no longer names that
    still has VMs (removed or renamed: size None, ``configured`` false) until the reap
    pass has finished them."""
    retired = sorted(store.pools.indexed_pools() - set(config.pools))
    counts = store.pool_counts([*config.pools, *retired])
    queued = _ondemand_queue(store, config)
    now, failures = read_pool_failures(store.redis, store.keys, config.pools)
    counted = {name: _counted(counts[name]) for name in counts}
    rows: list[dict[str, object]] = []
    for name, pool in pools_with_overrides(store.redis, store.keys, config).items():
        rows.append(
            {
                "pool": name,
                "alias": list(pool.alias),
                "size": pool.size,
                **counted[name],
                "ondemand_queue": queued[name],
                "overrides": _overrides(pool, config.pools[name]),
                "configured": True,
                "create_failures": failures[name].as_dict(now),
            }
        )
    for name in retired:
        rows.append(
            {
                "pool": name,
                "alias": [],
                "size": None,
                **counted[name],
                "ondemand_queue": 0,
                "overrides": {},
                "configured": False,
                "create_failures": None,
            }
        )
    return rows


def _ondemand_queue(store: Store, config: Config) -> dict[str, int]:
    """Per pool, the VMs pending requests ask for and have not reserved yet."""
    queued: dict[str, int] = dict.fromkeys(config.pools, 0)
    for rid in store.provision_candidates():
        record = store.get_request(rid)
        if record is None or record.status != RequestStatus.PENDING:
            continue
        for slot in record.slots:
            if slot.pool in queued:
                queued[slot.pool] += max(0, slot.want - slot.live)
    return queued


def _counted(c: Mapping[str, int]) -> dict[str, int]:
    """A pool's VMs by the table's columns (``pending``: reserved plus booting)."""
    return {
        "ready": c[VMState.READY],
        "pending": c[VMState.RESERVED] + c[VMState.PENDING],
        "running": c[VMState.RUNNING],
        "completed": c[VMState.COMPLETED],
        "on_hold": c[VMState.ON_HOLD],  # failed their ready check, kept for debugging
    }


def _overrides(effective: PoolConfig, configured: PoolConfig) -> dict[str, object]:
    """The settings changed at runtime: setting -> its value now."""
    return {
        key: getattr(effective, key)
        for key in ("size", "template", "clone_target")
        if getattr(effective, key) != getattr(configured, key)
    }


@click.command("pools")
@with_context(json=True)
@click.option(
    "--set-size",
    "set_size",
    multiple=True,
    metavar="POOL=N",
    help="Keep N ready VMs in POOL from now on (a runtime override; repeatable).",
)
@click.option(
    "--unset-size",
    "unset_size",
    multiple=True,
    metavar="POOL",
    help="Drop POOL's runtime size: back to the configured one (repeatable).",
)
@click.option(
    "--reset",
    "reset",
    multiple=True,
    metavar="POOL",
    help="Replace POOL's ready VMs with new ones; held VMs stay (repeatable).",
)
def pools_command(
    cli: CliContext,
    set_size: tuple[str, ...],
    unset_size: tuple[str, ...],
    reset: tuple[str, ...],
) -> None:
    """Per pool: aliases, size, VMs by state (on hold: kept for debugging), on-demand queue.

    A size set at runtime is marked with '*' (JSON: ``overrides``). A pool the config no
    longer names is listed (size "removed") while it still has VMs. A pool whose creates
    fail says how many in a row and the last error (JSON: ``create_failures``)."""
    if set_size or unset_size or reset:
        from vmpool.cli.pool_admin import apply_pool_changes

        apply_pool_changes(cli, set_size, unset_size, reset)
    rows = pool_table(cli.store, cli.config)
    if cli.as_json:
        echo_json(rows)
        return
    echo_table([{**r, "size": _size_shown(r), "failing": _failing(r)} for r in rows], COLUMNS)


def _failing(row: dict[str, object]) -> str:
    """The table's word on a pool whose creates fail: how many in a row, the last error."""
    failures = row["create_failures"]
    if not isinstance(failures, dict) or not failures["failing"]:
        return ""
    text = f"{failures['consecutive_failures']} in a row: {failures['last_error']}"
    return text if len(text) <= FAILING_SHOWN else text[: FAILING_SHOWN - 3] + "..."


def _size_shown(row: dict[str, object]) -> object:
    if row["size"] is None:
        return "removed"
    return f"{row['size']}*" if "size" in row["overrides"] else row["size"]  # type: ignore[operator]

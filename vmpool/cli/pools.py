"""``vmpool pools``: per pool, its size and its VMs by state, read from the live state."""

from __future__ import annotations

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.output import echo_table
from vmpool.config import Config
from vmpool.state.store import Store

__all__ = ["pool_table", "pools_command"]

COLUMNS = ("pool", "alias", "size", "ready", "pending", "running", "completed", "ondemand_queue")


def pool_table(store: Store, config: Config) -> list[dict[str, object]]:
    """One row per configured pool: its size and its VMs by state, plus the on-demand
    queue (VMs asked for by pending requests and not reserved yet); then one row per
    pool the config no longer names that still has VMs (removed or renamed: size None,
    ``configured`` false) until the reap pass has finished them."""
    retired = sorted(store.indexed_pools() - set(config.pools))
    counts = store.pool_counts([*config.pools, *retired])
    queued: dict[str, int] = dict.fromkeys(config.pools, 0)
    for rid in store.provision_candidates():
        record = store.get_request(rid)
        if record is None or record.status != "pending":
            continue
        for slot in record.slots:
            if slot.pool in queued:
                queued[slot.pool] += max(0, slot.want - slot.live)
    rows: list[dict[str, object]] = []
    for name, pool in config.pools.items():
        c = counts[name]
        rows.append(
            {
                "pool": name,
                "alias": list(pool.alias),
                "size": pool.size,
                "ready": c["ready"],
                "pending": c["reserved"] + c["pending"],
                "running": c["running"],
                "completed": c["completed"],
                "ondemand_queue": queued[name],
                "configured": True,
            }
        )
    for name in retired:
        c = counts[name]
        rows.append(
            {"pool": name, "alias": [], "size": None, "ready": c["ready"],
             "pending": c["reserved"] + c["pending"], "running": c["running"],
             "completed": c["completed"], "ondemand_queue": 0, "configured": False}
        )  # fmt: skip
    return rows


@click.command("pools")
@with_context(json=True)
def pools_command(cli: CliContext) -> None:
    """Per pool: aliases, size, ready, pending, running, completed, on-demand queue. A
    pool the config no longer names is listed (size "removed") while it still has VMs."""
    rows = pool_table(cli.store, cli.config)
    if cli.as_json:
        echo_json(rows)
        return
    shown = [{**row, "size": "removed" if row["size"] is None else row["size"]} for row in rows]
    echo_table(shown, COLUMNS)

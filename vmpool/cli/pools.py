"""Operator commands that read the live state: `vmpool pools` and `vmpool audit`."""

from __future__ import annotations

import click

from vmpool.cli.main import (
    common_options,
    echo_json,
    json_option,
    load_cli_config,
    open_redis,
)
from vmpool.config import Config
from vmpool.providers import providers_from_config
from vmpool.state.audit import INVARIANTS, audit_state
from vmpool.state.keys import Keys
from vmpool.state.store import Store


def pool_table(store: Store, config: Config) -> list[dict[str, object]]:
    """One row per configured pool: its size and its VMs by state, plus the on-demand
    queue (VMs asked for by pending requests and not reserved yet)."""
    counts = store.pool_counts(config.pools)
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
                "ready": 0,  # warm pools (size > 0) are not provisioned yet
                "pending": c["reserved"] + c["pending"],
                "running": c["running"],
                "completed": c["completed"],
                "ondemand_queue": queued[name],
            }
        )
    return rows


@click.command("pools")
@common_options
@json_option
def pools_command(config_path: str | None, redis_url: str | None, as_json: bool) -> None:
    """Per pool: size, ready, pending, running, completed, on-demand queue."""
    config = load_cli_config(config_path, redis_url)
    store = Store(open_redis(config), Keys(config.key_prefix))
    rows = pool_table(store, config)
    if as_json:
        echo_json(rows)
        return
    headers = ["pool", "size", "ready", "pending", "running", "completed", "ondemand_queue"]
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) if rows else len(h)
              for h in headers}
    click.echo("  ".join(h.upper().ljust(widths[h]) for h in headers))
    for row in rows:
        click.echo("  ".join(str(row[h]).ljust(widths[h]) for h in headers))


@click.command("audit")
@common_options
@json_option
def audit_command(config_path: str | None, redis_url: str | None, as_json: bool) -> None:
    """Check invariants 1-5 of CONTRACT.md over the live state and the providers.

    Exit 0 when every invariant holds; exit 1 and one line per violation otherwise.
    """
    config = load_cli_config(config_path, redis_url)
    client = open_redis(config)
    store = Store(client, Keys(config.key_prefix))
    providers = providers_from_config(client, store.keys, config)
    violations = audit_state(store, providers, sweep_interval_s=config.schedule.sweep)
    if as_json:
        echo_json(
            {
                "ok": not violations,
                "invariants": {str(k): v for k, v in INVARIANTS.items()},
                "violations": [v.as_dict() for v in violations],
            }
        )
    else:
        for violation in violations:
            click.echo(violation.line())
        if not violations:
            click.echo("audit: clean (invariants 1-5 hold)")
    if violations:
        raise SystemExit(1)

"""`vmpool vm get|list|show|extend|delete`: warm-pool VMs and held VMs from the shell.

Straight to Redis through the store, as an admin: the same atomic transitions the API
uses (checkout, give back, lifetime extension), without an owner check. A VM given back
is destroyed by the fleet's destroy sweep.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.output import echo_table, iso, relative
from vmpool.ids import InvalidIdentifier, is_address, validate_vm_name
from vmpool.state.records import VMRecord
from vmpool.state.transitions import VMState

__all__ = ["vm_group"]

# Why the store refused to act on a VM, in words (the codes of its scripts).
REFUSALS = {
    "no_vm": "no such VM",
    "vm_reserved": "not held: it is still being created",
    "vm_pending": "not held: it is still booting",
    "vm_ready": "not held: it is ready in its pool (check it out with `vmpool vm get`)",
    "vm_completed": "already given back: it is being destroyed",
    "vm_destroyed": "already given back and destroyed",
}
# Giving a VM back twice is no error, as deleting a request twice is not.
ALREADY_GIVEN_BACK = frozenset({"vm_completed", "vm_destroyed"})
# The times of a VM record, printed as ISO 8601.
TIMES = ("state_since", "reserved_at", "created_at", "ready_at", "lifetime_end", "checkout_at")


def _name(cli: CliContext, raw: str) -> str:
    """The VM a hostname names: a cloud address (the address index), an FQDN or a name."""
    if is_address(raw):
        found = cli.store.vm_at_address(raw)
        if found is None:
            raise CliFailure(f"no VM at {raw}")
        return found
    try:
        return validate_vm_name(raw.split(".", 1)[0].lower())
    except InvalidIdentifier as exc:
        raise CliError(str(exc)) from None


def _record(cli: CliContext, name: str) -> VMRecord:
    vm = cli.store.get_vm(name)
    if vm is None:
        raise CliFailure(f"no VM {name}")
    return vm


def _counts(cli: CliContext, pools: tuple[str, ...]) -> dict[str, int]:
    """POOL or POOL=N arguments (a repeated pool adds up) -> pool -> count."""
    counts: dict[str, int] = {}
    for arg in pools:
        name, _, n = arg.partition("=")
        try:
            count = int(n) if n else 1
        except ValueError:
            raise CliError(f"{arg!r}: the count after '=' is not an integer") from None
        if count <= 0:
            raise CliError(f"{arg!r}: the count must be positive")
        chosen = cli.config.resolve_name(name)
        if not chosen:
            raise CliError(f"unknown pool {name!r}")
        counts[chosen[0]] = counts.get(chosen[0], 0) + count
    return counts


@click.group("vm")
def vm_group() -> None:
    """Check VMs out of warm pools, list, show, extend and give back held VMs."""


@vm_group.command("get")
@with_context(json=True)
@click.argument("pools", nargs=-1, required=True, metavar="POOL[=N] ...")
@click.option("--owner", default="", help="Record this user as the owner.")
def vm_get(cli: CliContext, pools: tuple[str, ...], owner: str) -> None:
    """Check ready VMs out: all or nothing (exit 1 when a pool is short)."""
    counts = _counts(cli, pools)
    out = cli.store.pools.checkout(
        counts, owner=owner, owner_hash="", lifetime_s=cli.config.vm_lifetime_s, actor="cli"
    )
    if not out.ok:
        raise CliFailure(f"not enough ready VMs in pool {out.short or '?'}: nothing checked out")
    # each record's hostname: name.domain, or the cloud's address in a pool without one
    hosts = [vm.hostname for vm in cli.store.get_vms(name for name, _ in out.vms)]
    if cli.as_json:
        echo_json({"ok": True, "hostnames": hosts})
    else:
        for host in hosts:
            click.echo(host)


def _row(vm: VMRecord, now: float) -> dict[str, Any]:
    """A VM as a row of `vm list`: null where there is nothing (JSON), numbers as such."""
    held = vm.state == VMState.RUNNING
    remaining = vm.lifetime_end - now if held and vm.lifetime_end is not None else None
    return {
        "name": vm.name,
        "pool": vm.pool,
        "state": vm.state,
        "holder": f"request {vm.request_id}" if vm.request_id else (vm.owner or None),
        "request_id": vm.request_id or None,
        "owner": vm.owner or None,
        "lifetime_end": vm.lifetime_end if held else None,
        "remaining_s": None if remaining is None else round(remaining, 3),
    }


@vm_group.command("list")
@with_context(json=True)
def vm_list(cli: CliContext) -> None:
    """Ready and held VMs of every configured pool."""
    pools = list(cli.config.pools)
    names = [
        name
        for state in (VMState.READY, VMState.RUNNING)
        for by_pool in cli.store.pools_vms(pools, state).values()
        for name in by_pool
    ]
    now = cli.store.server_time()
    rows = [_row(vm, now) for vm in cli.store.get_vms(names)]
    if cli.as_json:
        echo_json(rows)
        return
    for row in rows:
        row["ends"] = relative(row["remaining_s"])
    echo_table(rows, ("name", "pool", "state", "ends", "holder"))


@vm_group.command("show")
@with_context(json=True)
@click.argument("host")
def vm_show(cli: CliContext, host: str) -> None:
    """One VM's record, and its own trail while no request holds it."""
    vm = _record(cli, _name(cli, host))
    trail = cli.store.pools.vm_history(vm.name)
    if cli.as_json:
        data = asdict(vm)
        data["tags"] = dict(vm.tags)
        data["trail"] = [
            {
                "version": e.version,
                "from": e.src,
                "to": e.dst,
                "actor": e.actor,
                "reason": e.reason,
                "time": e.time,
            }
            for e in trail
        ]
        echo_json(data)
        return
    now = cli.store.server_time()
    for key, value in asdict(vm).items():
        if value in (None, "", {}):
            continue
        if key in TIMES:
            value = f"{iso(value)} ({relative(value - now)})"
        click.echo(f"{key}: {dict(value) if key == 'tags' else value}")
    if trail:
        click.echo("trail:")
        for e in trail:
            click.echo(
                f"  v{e.version:<3} {iso(e.time, millis=True)}  {e.src:>9} -> {e.dst:<9}"
                f"  {e.actor}  {e.reason}"
            )


@vm_group.command("extend")
@with_context(json=True)
@click.argument("host")
@click.argument("hours", type=click.IntRange(min=1))
def vm_extend(cli: CliContext, host: str, hours: int) -> None:
    """Set a held VM's lifetime to HOURS from its checkout."""
    name = _name(cli, host)
    limit = cli.config.max_lifetime_upper_limit_s
    if limit is not None and hours * 3600 >= limit:
        raise CliError(f"a lifetime of {hours}h exceeds the maximum of {int(limit // 3600)}h")
    out = cli.store.pools.extend_vm(name, hours, actor="cli")
    if not out.ok:
        raise CliFailure(f"{name}: not extended: {REFUSALS.get(out.code, out.code)}")
    if cli.as_json:
        echo_json({"ok": True, "name": name, "lifetime_hours": hours})
    else:
        click.echo(f"{name}: lifetime {hours}h")


@vm_group.command("delete")
@with_context(json=True)
@click.argument("host")
def vm_delete(cli: CliContext, host: str) -> None:
    """Give a held VM back: it is destroyed (its request, if any, is left as it is).

    A VM given back already is no error (exit 0), as a request deleted twice is not.
    """
    name = _name(cli, host)
    out = cli.store.pools.give_back(name, actor="cli")
    if not out.ok and out.code not in ALREADY_GIVEN_BACK:
        raise CliFailure(f"{name}: not given back: {REFUSALS.get(out.code, out.code)}")
    result = "given_back" if out.ok else "already_given_back"
    if cli.as_json:
        echo_json({"ok": True, "name": name, "result": result})
    elif out.ok:
        click.echo(f"{name}: given back; it is being destroyed")
    else:
        click.echo(f"{name}: {REFUSALS[out.code]}")

"""`vmpool request create|get|delete|history`: on-demand requests from the shell.

These go straight to Redis through the store (the same atomic transitions the API
uses), so an operator can work without the API running. Provisioning is enqueued on
the fleet's queues exactly as the API does it.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

import click
import redis

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.output import echo_table, iso, relative
from vmpool.ids import InvalidIdentifier, Job, validate_request_id
from vmpool.lifecycle.overrides import pools_with_overrides
from vmpool.lifecycle.plan import RequestRejected, parse_pool_counts, plan_slots
from vmpool.state.records import RequestRecord, RequestSettings
from vmpool.state.store import Store
from vmpool.state.timeline import request_timeline
from vmpool.state.transitions import RequestStatus

__all__ = ["request_group", "request_view", "wait_for"]


def _request_id(raw: str) -> str:
    try:
        return validate_request_id(raw)
    except InvalidIdentifier as exc:
        raise CliError(str(exc)) from None


def _record(store: Store, rid: str) -> RequestRecord:
    record = store.get_request(rid)
    if record is None:
        raise CliFailure(f"no request found for request_id '{rid}'")
    return record


def request_view(
    store: Store, record: RequestRecord, clone_limit: int | None = None
) -> dict[str, Any]:
    """The request as data: status, per-alias counts or hostnames, failure reason, its
    priority, and, given the fleet's ``clone_limit``, where a pending one stands
    (``position``, ``eta_s``: as GET /ondemandvm/<id> shows them)."""
    hostnames = store.hostnames(record.id)
    aliases: dict[str, Any] = {}
    for slot in record.slots:
        entry = aliases.setdefault(slot.alias, {"requested": 0, "ready": 0, "hostname": []})
        entry["requested"] += slot.want
        entry["ready"] += slot.have
    for alias, names in hostnames.items():
        aliases.setdefault(alias, {"requested": 0, "ready": 0, "hostname": []})["hostname"] = names
    view: dict[str, Any] = {
        "request_id": record.id,
        "status": record.status,
        "version": record.version,
        "created": record.created,
        "deadline": record.deadline,
        "fail_at": record.fail_at,
        "retries": record.retries,
        "pools": aliases,
    }
    if record.failure_reason:
        view["failure_reason"] = record.failure_reason
    view["priority"] = record.priority
    place = None
    if record.status == RequestStatus.PENDING and clone_limit is not None:
        place = store.quotas.place(record.id, clone_limit)
    if place is not None:
        view.update(place.fields())
    return view


def _progress_line(record: RequestRecord, elapsed: float) -> str:
    return (
        f"{record.id}: {record.status}, {record.have}/{record.need} ready"
        f" ({elapsed:.0f}s, retries {record.retries})"
    )


def wait_for(store: Store, rid: str, timeout_s: float, interval_s: float = 0.5) -> RequestRecord:
    """Poll until the request leaves ``pending`` or the timeout. Show progress on stderr."""
    start = time.monotonic()
    tty = sys.stderr.isatty()
    last = ""
    while True:
        record = _record(store, rid)
        line = _progress_line(record, time.monotonic() - start)
        if line != last:
            click.echo(("\r" + line) if tty else line, err=True, nl=not tty)
            last = line
        if record.status != RequestStatus.PENDING:
            if tty:
                click.echo("", err=True)
            return record
        if time.monotonic() - start > timeout_s:
            if tty:
                click.echo("", err=True)
            raise CliFailure(f"request {rid} still pending after {timeout_s:.0f}s")
        time.sleep(interval_s)


@click.group("request")
def request_group() -> None:
    """Create, inspect and delete on-demand requests."""


@request_group.command("create")
@with_context(json=True)
@click.argument("pools", nargs=-1, required=True, metavar="POOL=N [POOL=N ...]")
@click.option("--request-id", default=None, help="Use this id instead of a new uuid4.")
@click.option("--wait", is_flag=True, help="Show progress until ready or failed.")
@click.option(
    "--priority",
    type=click.IntRange(1, 3),
    default=2,
    show_default=True,
    help="Its priority: 1 highest, 3 lowest (ABS's; a request without a user).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=None,
    help="Seconds --wait waits [default: the request's TTL + grace + 30].",
)
def request_create(
    cli: CliContext,
    pools: tuple[str, ...],
    request_id: str | None,
    wait: bool,
    priority: int,
    timeout_s: float | None,
) -> None:
    """Ask for VMs: prints the request id. With --wait, then the hostnames."""
    rid = _create(cli, pools, request_id, priority)
    _enqueue_provision(cli, rid)
    if not wait:
        if cli.as_json:
            echo_json({"ok": True, "request_id": rid})
        else:
            click.echo(rid)
        return
    click.echo(f"request {rid} created", err=True)
    config = cli.config
    limit = (
        timeout_s
        if timeout_s is not None
        else (config.ondemand_request_ttl_s + config.ondemand_request_grace_s + 30)
    )
    record = wait_for(cli.store, rid, limit)
    view = request_view(cli.store, record)
    if cli.as_json:
        echo_json(view)
    elif any(entry["hostname"] for entry in view["pools"].values()):
        echo_table(
            [
                {"pool": alias, "hostname": hostname}
                for alias, entry in view["pools"].items()
                for hostname in entry["hostname"]
            ],
            ("pool", "hostname"),
        )
    if record.status != RequestStatus.READY:
        raise CliFailure(f"request {rid} {record.status}: {record.failure_reason or 'no VMs'}")


def _create(cli: CliContext, pools: tuple[str, ...], request_id: str | None, priority: int) -> str:
    """Create the request (input checked before Redis is touched). Its id."""
    try:
        counts = parse_pool_counts(pools)
        slots = plan_slots(cli.config, counts, random.SystemRandom())
    except (ValueError, RequestRejected) as exc:
        raise CliError(str(exc)) from None
    if cli.config.backend_weight:  # weights follow the pools' runtime clone targets
        live = pools_with_overrides(cli.store.redis, cli.keys, cli.config)
        slots = plan_slots(replace(cli.config, pools=live), counts, random.SystemRandom())
    rid = _request_id(request_id) if request_id else str(uuid.uuid4())
    settings = RequestSettings.from_config(cli.config, priority=priority)
    outcome = cli.store.create_request(
        rid, slots, settings, actor="cli", clone_limit=cli.config.ondemand_clone_limit
    )
    if not outcome.ok:
        if outcome.code == "exists":
            raise CliError(f"request_id '{rid}' has already been created")
        raise CliError(f"request refused: {outcome.code}")
    return rid


def _enqueue_provision(cli: CliContext, rid: str) -> None:
    """Start provisioning now. If RQ is unreachable the provision sweep still finds it."""
    from workers.queues import enqueue

    try:
        enqueue(cli.rq_redis, cli.keys, Job.PROVISION_REQUEST, rid)
    except redis.RedisError as exc:
        click.echo(f"warning: could not enqueue provisioning ({exc}); the sweep will", err=True)


@request_group.command("get")
@with_context(json=True)
@click.argument("request_id")
def request_get(cli: CliContext, request_id: str) -> None:
    """Show a request: status, VMs ready per pool, hostnames, priority, and where a pending
    one stands (its position in line and ETA). Also `vmpool request show`."""
    rid = _request_id(request_id)
    view = request_view(cli.store, _record(cli.store, rid), cli.config.ondemand_clone_limit)
    if cli.as_json:
        echo_json(view)
        return
    now = cli.store.server_time()
    status = view["status"]
    click.echo(f"request {rid}: {status} (version {view['version']})")
    click.echo(f"  created: {iso(view['created'])} ({relative(view['created'] - now)})")
    if status == RequestStatus.PENDING:
        click.echo(
            f"  fails:   {iso(view['fail_at'])} ({relative(view['fail_at'] - now)})"
            " unless ready by then"
        )
    if "failure_reason" in view:
        click.echo(f"  reason:  {view['failure_reason']}")
    click.echo(f"  priority: {view['priority']}")
    if "position" in view:
        click.echo(f"  place:   {_place_line(view['position'], view['eta_s'])}")
    for alias, entry in view["pools"].items():
        click.echo(f"  {alias}: {_counts(status, entry['ready'], entry['requested'])}")
        for hostname in (
            entry["hostname"] if status in (RequestStatus.PENDING, RequestStatus.READY) else ()
        ):
            click.echo(f"    {hostname}")


def _place_line(position: int, eta_s: float | None) -> str:
    """Where a pending request stands, in words (GET /ondemandvm/<id>'s position, eta_s)."""
    where = "being provisioned" if position == 0 else f"position {position} in line"
    if eta_s is None:
        return f"{where}, waiting for its user's quota (no ETA)"
    return f"{where}, ready in about {eta_s:.0f}s"


def _counts(status: str, ready: int, requested: int) -> str:
    """A pool's VMs in words that fit the request's status.

    A deleted request's VMs are no longer "ready"."""
    if status == RequestStatus.DELETED:
        return f"{requested} asked, {ready} were ready; given back, its VMs are destroyed"
    if status == RequestStatus.FAILED:
        return f"{requested} asked, {ready} were ready when it failed"
    return f"{ready}/{requested} ready"


request_group.add_command(request_get, "show")

_DELETE_MESSAGES = {
    "deleted": "deleted; its VMs are being destroyed",
    "already_deleted": "the request has already been deleted",
    "request_failed": "the request failed; it stays failed",
}


@request_group.command("delete")
@with_context(json=True)
@click.argument("request_id")
def request_delete(cli: CliContext, request_id: str) -> None:
    """Give a request back: it turns deleted and its VMs are destroyed."""
    rid = _request_id(request_id)
    outcome = cli.store.delete_request(rid, actor="cli")
    if outcome.code == "no_request":
        raise CliFailure(f"no request found for request_id '{rid}'")
    if cli.as_json:
        ok = outcome.code in _DELETE_MESSAGES
        echo_json({"ok": ok, "request_id": rid, "result": outcome.code})
    else:
        click.echo(f"request {rid}: {_DELETE_MESSAGES.get(outcome.code, outcome.code)}")


@request_group.command("history")
@with_context(json=True)
@click.argument("request_id")
def request_history(cli: CliContext, request_id: str) -> None:
    """The request's timeline: every transition of it and its VMs, with actor and time.

    The same entries as GET /api/v3/ondemandvm/<id>/timeline; a failure is marked '!'.
    """
    rid = _request_id(request_id)
    _record(cli.store, rid)
    entries = request_timeline(cli.store, rid) or []
    if cli.as_json:
        echo_json([e.as_dict() for e in entries])
        return
    echo_table(
        [
            {
                "version": e.version,
                "time": iso(e.time, millis=True),
                "entity": e.entity,
                "transition": f"{e.src} -> {e.dst}",
                "actor": e.actor,
                "reason": f"! {e.reason}" if e.error else e.reason,
            }
            for e in entries
        ],
        ("version", "time", "entity", "transition", "actor", "reason"),
    )

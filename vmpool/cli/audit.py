"""``vmpool audit``: the invariants (docs/invariants.md) over the live state and the providers."""

from __future__ import annotations

from dataclasses import asdict

import click

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError
from vmpool.providers import Provider, providers_from_config
from vmpool.state.audit import CHECKED, INVARIANTS, audit_state, quota_peaks, retired_pool_notes
from vmpool.state.counters import record_audit
from vmpool.state.fleet_identity import FleetMarks, read_marks
from vmpool.state.redis_check import RedisCheck, check_redis
from vmpool.state.semaphore import CloneSemaphore, SlotStats

__all__ = ["audit_command"]


@click.command("audit")
@with_context(json=True)
@click.option(
    "--metrics",
    "record",
    is_flag=True,
    help="Also record the result in Redis for /metrics (vmpool_audit_violations,"
    " vmpool_audit_last_run_timestamp_seconds), as the Kubernetes CronJob runs it.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Also exit 1 when Redis is not set up as vmpool assumes: an acknowledged write"
    " could be lost (appendfsync everysec, Sentinel without replica durability, ...) or"
    " every write would be refused; one line per problem.",
)
def audit_command(cli: CliContext, record: bool, strict: bool) -> None:
    """Check invariants 1-8 and 11 (docs/invariants.md) over the live state.

    Exit 0 when every invariant holds and the fleet's Redis has not lost its data (no
    lost mark: docs/operations.md). Exit 1 and one line per violation otherwise (with
    --strict, also per Redis setting that puts acknowledged writes at risk).
    """
    violations = audit_state(
        cli.store,
        _providers(cli),
        sweep_interval_s=cli.config.schedule.sweep_expired,
        reap_interval_s=cli.config.schedule.reap_running,
        quota_of=cli.config.quotas.limits,
    )
    quotas = _quota_lines(cli)
    redis_settings = check_redis(cli.redis)
    marks = read_marks(cli.redis, cli.keys)
    lost = marks.problem() if marks is not None else None
    notes = retired_pool_notes(cli.store, cli.config.pools)
    limit = cli.config.ondemand_clone_limit
    slots = CloneSemaphore(cli.redis, cli.keys, limit, 2.0 * cli.config.lock_expire_s).stats()
    if record:  # before the exit status, so an alert sees a failing run too
        record_audit(cli.redis, cli.keys, len(violations))
    if cli.as_json:
        echo_json(
            {
                "ok": not violations,
                "invariants": {str(k): v for k, v in INVARIANTS.items()},
                "violations": [v.as_dict() for v in violations],
                "redis": redis_settings.as_dict(),
                "notes": notes,
                "clone_slots": {**asdict(slots), "limit": limit, "exceeded": slots.peak > limit},
                "quotas": quotas,
                "fleet": _fleet(marks, lost),
            }
        )
    else:
        # Not an invariant (the exit status is the invariants'), but what they rest on.
        lines = [_redis_line(redis_settings), _slots_line(slots, limit)]
        lines += [_quota_line(user, figures) for user, figures in quotas.items()]
        for line in [*lines, *(f"note: {note}" for note in notes)]:
            click.echo(line, err=True)
        for violation in violations:
            click.echo(violation.line())
        if lost:
            click.echo(lost)
        elif not violations:
            click.echo(f"audit: clean (invariants {CHECKED} hold)")
    if violations or lost or (strict and redis_settings.problems()):
        raise SystemExit(1)


def _fleet(marks: FleetMarks | None, lost: str | None) -> dict[str, object]:
    """The fleet's identity and other marks, and the lost marks' line (or None)."""
    if marks is None:
        return {"id": None, "marks": {}, "problem": None}
    others = {mark: str(role) for mark, role in marks.others.items()}
    return {"id": marks.identity, "marks": others, "problem": lost}


def _providers(cli: CliContext) -> dict[str, Provider]:
    """The fleet's providers, with credentials: the audit lists every provider's VMs."""
    masked = cli.fleet.masked_secrets() if cli.fleet is not None else []
    if masked:
        raise CliError(
            f"the running fleet publishes its config without secrets, and provider"
            f" {', '.join(masked)} needs them to list its VMs: pass --config with the"
            " fleet's config file"
        )
    return providers_from_config(cli.redis, cli.keys, cli.config)


def _redis_line(check: RedisCheck) -> str:
    head = (
        f"redis: {check.status} (maxmemory-policy {check.maxmemory_policy},"
        f" appendonly {check.appendonly}, appendfsync {check.appendfsync},"
        f" role {check.role}, replicas {check.replicas if check.replicas is not None else '?'};"
        f" durability {check.durability_text()})"
    )
    return "; ".join([head, *check.problems()])


def _slots_line(slots: SlotStats, limit: int) -> str:
    """The clone limit as the semaphore recorded it.

    Whether the fleet ever ran more clones at once than its limit (a create that went on
    past its lapsed lease)."""
    line = (
        f"clone slots: {slots.live} live, limit {limit}, peak {slots.peak},"
        f" overruns {slots.overruns}"
    )
    return line + (" (the limit was exceeded)" if slots.peak > limit else "")


def _quota_lines(cli: CliContext) -> dict[str, dict[str, int | None]]:
    """Per user counted now or in the trails: what they hold, the most they held at once
    (by the trails), and their quota."""
    held = cli.store.quotas.held()
    peaks = quota_peaks(cli.store)
    out: dict[str, dict[str, int | None]] = {}
    for user in sorted(set(held) | set(peaks)):
        max_vms, max_cores = cli.config.quotas.limits(user)
        now, peak = held.get(user), peaks.get(user)
        out[user] = {
            "vms": now.vms if now else 0,
            "cores": now.cores if now else 0,
            "peak_vms": peak.vms if peak else 0,
            "peak_cores": peak.cores if peak else 0,
            "max_vms": max_vms,
            "max_cores": max_cores,
        }
    return out


def _quota_line(user: str, f: dict[str, int | None]) -> str:
    """One user's quota as the audit found it: held now, the trails' peak, the limits."""
    limits = ", ".join(
        f"{name} {f[name]}" for name in ("max_vms", "max_cores") if f[name] is not None
    )
    return (
        f"quota: user {user} holds {f['vms']} VMs ({f['cores']} cores), peak"
        f" {f['peak_vms']} VMs ({f['peak_cores']} cores) by the trails;"
        f" {limits or 'no quota'}"
    )

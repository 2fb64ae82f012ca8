"""``vmpool enqueue``: put one job on the queues now, as the scheduler or a worker would.

The jobs it knows are the rows of the job table (:mod:`workers.table`), by their name or
an older alias (``sweep``, ``provision``, ``check-pending``, ... as earlier releases
named them). ``check-pending`` keeps its older meaning: with a VM name it checks that VM, with
``--pool`` every booting VM of the pool, with neither the whole check-pending sweep.
"""

from __future__ import annotations

from typing import Any

import click
import redis

from vmpool.cli.context import CliContext, echo_json, with_context
from vmpool.cli.errors import CliError
from vmpool.ids import InvalidIdentifier, Job, validate
from vmpool.state.transitions import VMState
from workers.queues import enqueue
from workers.table import JOBS, JobSpec, job_id, lookup

__all__ = ["enqueue_command"]

# Every name `vmpool enqueue` accepts: the table's names, then the older aliases.
_CHOICES = (*(job.value for job in JOBS), *(a for spec in JOBS.values() for a in spec.aliases))
_CHECK_PENDING = JOBS[Job.CHECK_PENDING_VM]


def _usage() -> str:
    rows = [f"  {spec.name:<20} {spec.summary}" for spec in JOBS.values()]
    return "\n".join(rows)


@click.command("enqueue", epilog="\b\nJobs:\n" + _usage())
@with_context(json=True)
@click.argument("job", metavar="JOB", type=click.Choice(_CHOICES))
@click.argument("subject", required=False)
@click.option(
    "--pool",
    default=None,
    help="check_pending_vm only: a check for every booting VM of this pool (or alias).",
)
def enqueue_command(cli: CliContext, job: str, subject: str | None, pool: str | None) -> None:
    """Put one JOB on the queues now, as the scheduler or a worker would.

    \b
      vmpool enqueue sweep_expired | reap_running | reconcile | provision_sweep | ...
      vmpool enqueue provision_request ID | check_request ID
      vmpool enqueue check_pending_vm [NAME] [--pool P]  (neither: the pending sweep)
      vmpool enqueue create_vm NAME | destroy_vm NAME | vm_task NAME:KIND:ID
    Older names work too (sweep, provision ID, check-pending, reap, ...).

    A job already queued or running is not queued again ("already queued", exit 0).
    """
    plan = _plan(cli, lookup(job), subject, pool)
    rows: list[dict[str, Any]] = []
    try:
        for spec, subj in plan:
            rows.append(
                {
                    "job": spec.name,
                    "subject": subj,
                    "job_id": job_id(cli.keys, spec.name, subj),
                    "queue": cli.keys.queue(spec.queue),
                    "enqueued": enqueue(cli.rq_redis, cli.keys, spec.name, subj),
                }
            )
    except redis.RedisError as exc:
        raise CliError(f"enqueue failed: {exc}") from None
    if cli.as_json:
        echo_json({"jobs": rows})
        return
    if not rows:
        click.echo(f"no booting VMs in pool {pool}")
    for row in rows:
        state = "enqueued" if row["enqueued"] else "already queued"
        click.echo(f"{state}: {row['job_id']} on {row['queue']}")


def _plan(
    cli: CliContext, spec: JobSpec, subject: str | None, pool: str | None
) -> list[tuple[JobSpec, str | None]]:
    """What to enqueue: [(job, subject)]. Every usage error as one line (exit 2)."""
    if pool is not None and spec is not _CHECK_PENDING:
        raise CliError(f"--pool goes with {_CHECK_PENDING.name} only")
    if spec is _CHECK_PENDING and subject is None:
        if pool is None:
            return [(JOBS[Job.CHECK_PENDING_SWEEP], None)]
        pools = cli.config.resolve_name(pool)  # a pool's name or one of its aliases
        if not pools:
            raise CliError(f"--pool: no pool or alias named {pool!r}")
        return [
            (spec, name) for chosen in pools for name in cli.store.pool_vms(chosen, VMState.PENDING)
        ]
    if spec is _CHECK_PENDING and pool is not None:
        raise CliError(f"{spec.name} takes a VM name or --pool, not both")
    if spec.subject is None and subject is not None:
        raise CliError(f"{spec.name} takes no argument (got {subject!r})")
    if spec.subject is not None and subject is None:
        what = {"request": "request id", "vm": "VM name"}.get(spec.subject, "VM task")
        raise CliError(f"{spec.name} needs a {what}")
    if spec.subject is not None and subject is not None:
        try:
            validate(spec.subject, subject)
        except InvalidIdentifier as exc:
            raise CliError(str(exc)) from None
    return [(spec, subject)]

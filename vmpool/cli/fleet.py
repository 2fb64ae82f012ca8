"""``vmpool worker`` and ``vmpool scheduler``: the fleet's long-running processes.

Redis URL: ``--redis-url``, else ``VMPOOL_REDIS_URL``, else the config's ``:redis:``
url. With none, one line and exit 2. See docs/architecture.md for what runs where.

A worker waits out a Redis outage of any length inside its loop (workers/loop.py),
finishes its job on SIGTERM and exits 0 (RQ's warm shutdown, where a second SIGTERM is
a cold one), and exits 1 only on a real error. ``--alive-file`` is what
``vmpool probe worker`` reads for Kubernetes' liveness probe.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click
import redis

from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.identity_check import lost_marks_at_start
from vmpool.cli.probe import ALIVE_FILE_ENV, SCHEDULER_ALIVE_FILE_ENV
from vmpool.cli.strict import check_redis_at_start, strict_option
from vmpool.config import Config

if TYPE_CHECKING:
    from workers.loop import AliveFile, SteadyLoop

__all__ = ["WAIT_FOR_REDIS_ENV", "scheduler_command", "worker_command"]

log = logging.getLogger(__name__)

WAIT_FOR_REDIS_ENV = "VMPOOL_WAIT_FOR_REDIS"
F = TypeVar("F", bound=Callable[..., object])


def wait_for_redis_option(func: F) -> F:
    """``--wait-for-redis SECONDS``.

    How long a starting process waits for a Redis that does not answer yet. 0 (the
    default) fails at once, one line. The Kubernetes manifests set it, so a pod started
    before Redis (or during its restart) waits instead of entering CrashLoopBackOff, whose
    back-off outlasts the outage."""
    return click.option(
        "--wait-for-redis",
        "wait_s",
        type=click.FloatRange(min=0, max=86400),
        default=0.0,
        envvar=WAIT_FOR_REDIS_ENV,
        show_default=True,
        metavar="SECONDS",
        help="At start, wait this long for Redis to answer (a line every 10 s)"
        f" [env {WAIT_FOR_REDIS_ENV}].",
    )(func)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )


@click.command("worker")
@with_context(follow_fleet=False)
@click.option("--burst", is_flag=True, help="Quit when the queues are empty.")
@click.option(
    "--queues",
    "queues_text",
    metavar="Q,...",
    default=None,
    help="Queues to listen to: sweeps, requests, vms (default: all).",
)
@click.option(
    "--fork/--no-fork",
    default=False,
    help="Fork a work horse per job (RQ's Worker) instead of running jobs in-process"
    " (SimpleWorker, the default; see docs/benchmarks.md).",
)
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Quit after N jobs.")
@click.option("--name", default=None, help="Worker name (default: host-pid-random).")
@click.option(
    "--alive-file",
    "alive_path",
    metavar="PATH",
    envvar=ALIVE_FILE_ENV,
    default=None,
    help="Touch PATH while the worker loop lives, for `vmpool probe worker`"
    f" [env {ALIVE_FILE_ENV}; default: none].",
)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@wait_for_redis_option
@strict_option
def worker_command(
    cli: CliContext,
    burst: bool,
    queues_text: str | None,
    fork: bool,
    max_jobs: int | None,
    name: str | None,
    alive_path: str | None,
    verbose: bool,
    wait_s: float,
    strict: bool,
) -> None:
    """Run one RQ worker process on the vmpool queues."""
    from workers.loop import AliveFile
    from workers.queues import resolve_queue_names

    try:
        queues = resolve_queue_names(cli.keys, queues_text)
    except ValueError as exc:
        raise CliError(f"--queues: {exc}") from None
    alive = AliveFile(alive_path) if alive_path else None
    if alive is not None:
        try:
            alive.path.touch()  # a path it cannot write: one line now, not a dead probe
        except OSError as exc:
            raise CliError(f"--alive-file: cannot write {alive_path}: {exc.strerror}") from None
    try:
        # unreachable (after --wait-for-redis): one line, before RQ's own noise
        url = cli.wait_for_redis(wait_s, tick=alive.touch if alive else None)
        check_redis_at_start(url, cli.config.redis_options, who="vmpool worker", strict=strict)
        cli.publish_config("vmpool worker")
        _setup_logging(verbose)
        _work(
            url,
            cli.config,
            queues,
            kind="fork" if fork else "simple",
            name=name,
            burst=burst,
            max_jobs=max_jobs,
            verbose=verbose,
            alive=alive,
        )
    finally:
        if alive is not None:
            alive.remove()  # a restarted container starts with no stale sign of life


def _work(
    url: str,
    config: Config,
    queues: list[str],
    *,
    kind: str,
    name: str | None,
    burst: bool,
    max_jobs: int | None,
    verbose: bool,
    alive: AliveFile | None,
) -> None:
    """Run the worker until its loop ends. Exit 1 if an error ended it.

    Inside its loop the worker waits out a lost Redis itself (workers/loop.py). Here
    only a Redis lost while it registers, before the loop, is waited out, with a fresh
    worker. In burst mode a lost Redis ends the run with exit 1.
    """
    from rq.exceptions import StopRequested

    from workers.loop import redis_unusable, wait_for_redis
    from workers.worker import build_worker

    while True:
        worker = build_worker(url, config, queues, kind=kind, name=name, alive=alive)
        try:
            worker.work(
                burst=burst, max_jobs=max_jobs, logging_level="DEBUG" if verbose else "INFO"
            )
        except redis.RedisError as exc:
            if redis_unusable(exc) is None:
                raise
            if burst:
                raise CliFailure(f"lost Redis: {exc}") from None
            worker.outage.lost(exc)
            assert worker.redis_check is not None  # build_worker sets it
            try:
                wait_for_redis(worker.redis_check, tick=worker.wait_tick)
            except StopRequested:  # SIGTERM while waiting: nothing runs, nothing to finish
                return
            worker.outage.back()
            with contextlib.suppress(redis.RedisError):
                worker.register_death()  # type: ignore[no-untyped-call]  # frees a fixed --name
            continue
        _raise_fatal(worker)
        return


def _raise_fatal(worker: SteadyLoop) -> None:
    """RQ's work() returns as if done after an error it swallowed.

    Exit 1 on it (RQ has logged the traceback)."""
    from workers.loop import redis_unusable

    exc = worker.fatal_error
    if exc is None:
        return
    if redis_unusable(exc) is not None:  # burst mode only: otherwise it was waited out
        raise CliFailure(f"lost Redis: {exc}")
    raise CliFailure(f"worker {worker.name} stopped on an error: {type(exc).__name__}: {exc}")


@click.command("scheduler")
@with_context(follow_fleet=False)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1, max=60),
    default=1.0,
    show_default=True,
    help="Longest sleep between two ticks; a replica also wakes at each due time.",
)
@click.option("--burst", is_flag=True, help="Install the schedule, run one tick, quit.")
@click.option(
    "--alive-file",
    "alive_path",
    metavar="PATH",
    envvar=SCHEDULER_ALIVE_FILE_ENV,
    default=None,
    help="Touch PATH on every tick, for `vmpool probe scheduler`"
    f" [env {SCHEDULER_ALIVE_FILE_ENV}; default: none].",
)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@wait_for_redis_option
@strict_option
def scheduler_command(
    cli: CliContext,
    interval: float,
    burst: bool,
    alive_path: str | None,
    verbose: bool,
    wait_s: float,
    strict: bool,
) -> None:
    """Enqueue the periodic sweeps at the config's intervals (rq-scheduler).

    Safe in several replicas, with no lock between them: each due time of each sweep is
    moved once, and two runs of a sweep are queued at most its interval apart.
    """
    from workers.loop import AliveFile

    alive = AliveFile(alive_path) if alive_path else None
    tick = alive.touch if alive else None
    if tick:
        tick()
    cli.wait_for_redis(wait_s, tick=tick)
    check_redis_at_start(
        cli.redis_url, cli.config.redis_options, who="vmpool scheduler", strict=strict
    )
    lost_marks_at_start(cli.redis_url, cli.config.redis_options, cli.keys)
    cli.publish_config("vmpool scheduler")
    _setup_logging(verbose)
    logging.getLogger("rq_scheduler.scheduler").setLevel(
        logging.DEBUG if verbose else logging.WARNING  # birth and death are routine
    )
    _schedule(cli, interval, burst=burst, alive=alive)


def _schedule(cli: CliContext, interval: float, *, burst: bool, alive: AliveFile | None) -> None:
    """Run the scheduler until stopped.

    As the worker, a Redis that is gone or refuses writes is waited out (one line when
    lost, one when back), not a crash."""
    from vmpool.lifecycle.idle import sweep_inputs
    from workers.loop import RedisOutage, redis_unusable, wait_for_redis, writable_check
    from workers.schedule import FleetScheduler, schedule_intervals

    conn = cli.rq_redis
    check = writable_check(conn, cli.keys)
    inputs = sweep_inputs(cli.config, cli.keys)  # a sweep with none of them is not run
    while True:
        scheduler = FleetScheduler(conn, cli.keys, interval=interval, alive=alive, inputs=inputs)
        outage = RedisOutage(f"scheduler {scheduler.name}")
        try:
            scheduler.install(schedule_intervals(cli.config.schedule))
            scheduler.run(burst=burst)
            return
        except redis.RedisError as exc:
            if redis_unusable(exc) is None:
                raise
            if burst:
                raise CliFailure(f"lost Redis: {exc}") from None
            outage.lost(exc)
            wait_for_redis(check, tick=alive.touch if alive else None)
            outage.back()

"""``vmpool worker`` and ``vmpool scheduler``: the fleet's long-running processes.

Redis URL: ``--redis-url``, else ``VMPOOL_REDIS_URL``, else the config's ``:redis:``
url; with none, one line and exit 2. See docs/architecture.md for what runs where.
"""

from __future__ import annotations

import contextlib
import logging
import time

import click
import redis

from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.strict import check_redis_at_start, strict_option
from vmpool.config import Config

__all__ = ["scheduler_command", "wait_for_redis", "worker_command"]

log = logging.getLogger(__name__)

# Redis going away under a worker or a scheduler (a restart, a failover, a dropped
# connection): redis-py raises these; BusyLoadingError (AOF replay) is a ConnectionError.
REDIS_GONE = (redis.ConnectionError, redis.TimeoutError)


def wait_for_redis(url: str, *, max_delay_s: float = 5.0) -> None:
    """Block until Redis answers PING again, polling with a growing delay."""
    delay = 0.25
    while True:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
            return
        except redis.RedisError:
            time.sleep(delay)
            delay = min(max_delay_s, delay * 2)
        finally:
            client.close()


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )


@click.command("worker")
@with_context()
@click.option("--burst", is_flag=True, help="Quit when the queues are empty.")
@click.option(
    "--queues",
    "queues_text",
    metavar="Q,...",
    default=None,
    help="Queues to listen to, in priority order: requests, sweeps, vms (default: all).",
)
@click.option(
    "--fork/--no-fork",
    default=False,
    help="Fork a work horse per job (RQ's Worker) instead of running jobs in-process"
    " (SimpleWorker, the default; see docs/benchmarks.md).",
)
@click.option("--max-jobs", type=click.IntRange(min=1), default=None, help="Quit after N jobs.")
@click.option("--name", default=None, help="Worker name (default: host-pid-random).")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@strict_option
def worker_command(
    cli: CliContext,
    burst: bool,
    queues_text: str | None,
    fork: bool,
    max_jobs: int | None,
    name: str | None,
    verbose: bool,
    strict: bool,
) -> None:
    """Run one RQ worker process on the vmpool queues."""
    from workers.queues import resolve_queue_names

    try:
        queues = resolve_queue_names(cli.keys, queues_text)
    except ValueError as exc:
        raise CliError(f"--queues: {exc}") from None
    url = cli.check_redis()  # unreachable: one line, before RQ's own noise
    check_redis_at_start(url, who="vmpool worker", strict=strict)
    _setup_logging(verbose)
    _work(url, cli.config, queues, kind="fork" if fork else "simple", name=name,
          burst=burst, max_jobs=max_jobs, verbose=verbose)


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
) -> None:
    """Run workers until one returns: a lost Redis is waited out with a fresh worker.

    RQ retries a lost connection inside its dequeue, but a heartbeat or a registry write
    that meets a dead Redis ends work() with the error. Exiting then would turn every
    Redis restart into a restart of every worker (a crash loop, with Kubernetes' growing
    backoff); instead wait for Redis and go on with a fresh worker. Nothing is lost
    either way: the job that was running is re-found by the sweeps.
    """
    from workers.worker import build_worker

    while True:
        worker = build_worker(url, config, queues, kind=kind, name=name)
        try:
            worker.work(
                burst=burst, max_jobs=max_jobs, logging_level="DEBUG" if verbose else "INFO"
            )
            return
        except REDIS_GONE as exc:
            if burst:
                raise CliFailure(f"lost Redis: {exc}") from None
            log.warning("worker %s: lost Redis (%s); reconnecting", worker.name, exc)
            wait_for_redis(url)
            with contextlib.suppress(redis.RedisError):
                worker.register_death()  # type: ignore[no-untyped-call]  # frees a fixed --name


@click.command("scheduler")
@with_context()
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1, max=60),
    default=1.0,
    show_default=True,
    help="Longest sleep between two ticks; a replica also wakes at each due time.",
)
@click.option("--burst", is_flag=True, help="Install the schedule, run one tick, quit.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@strict_option
def scheduler_command(
    cli: CliContext, interval: float, burst: bool, verbose: bool, strict: bool
) -> None:
    """Enqueue the periodic sweeps at the config's intervals (rq-scheduler).

    Safe in several replicas, with no lock between them: each due time of each sweep is
    moved once, and two runs of a sweep are queued at most its interval apart.
    """
    from workers.schedule import FleetScheduler, schedule_intervals

    conn = cli.rq_redis
    check_redis_at_start(cli.redis_url, who="vmpool scheduler", strict=strict)
    _setup_logging(verbose)
    logging.getLogger("rq_scheduler.scheduler").setLevel(
        logging.DEBUG if verbose else logging.WARNING  # birth and death are routine
    )
    while True:  # as the worker: a Redis restart is waited out, not a crash
        scheduler = FleetScheduler(conn, cli.keys, interval=interval)
        try:
            scheduler.install(schedule_intervals(cli.config.schedule))
            scheduler.run(burst=burst)
            return
        except REDIS_GONE as exc:
            if burst:
                raise CliFailure(f"lost Redis: {exc}") from None
            log.warning("scheduler %s: lost Redis (%s); reconnecting", scheduler.name, exc)
            wait_for_redis(cli.redis_url)

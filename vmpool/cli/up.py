"""`vmpool up`: Redis, the API, N workers and the scheduler on this machine.

Each part is its own process (`vmpool api`, `vmpool worker`, `vmpool scheduler`), as it
would be in its own pod, under one supervisor that prefixes their logs and restarts
the ones that die. Without --redis-url (or VMPOOL_REDIS_URL, or :redis: url or
sentinel) an embedded redis-server is started on a free loopback port in a temporary directory,
with AOF and fsync always, and stopped on exit.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import IO

import click
import redis

from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.strict import STRICT_ENV, check_redis_at_start, strict_option
from vmpool.config import Config, mask_url_password
from vmpool.local.dashboard import (
    DEFAULT_PORT,
    dashboard_answers,
    dashboard_installed,
    dashboard_spec,
)
from vmpool.local.redis_server import RedisServer, RedisServerError, free_port
from vmpool.local.supervisor import ChildSpec, Supervisor
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.keys import Keys

__all__ = ["child_specs", "up_command", "wait_healthy"]


def child_specs(
    *, workers: int, host: str, port: int, env: dict[str, str]
) -> list[ChildSpec]:
    base = [sys.executable, "-m", "vmpool.cli.main"]
    specs = [ChildSpec("api", [*base, "api", "--host", host, "--port", str(port)], env)]
    specs += [ChildSpec(f"worker-{i + 1}", [*base, "worker"], env) for i in range(workers)]
    specs.append(ChildSpec("scheduler", [*base, "scheduler"], env))
    return specs


def _api_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _workers_registered(redis_url: str, options: RedisOptions, keys: Keys) -> int:
    """Workers on this fleet's queues (another fleet may share the Redis database)."""
    from rq import Queue, Worker

    from workers.table import QUEUE_SWEEPS

    conn = connect(redis_url, options, decode_responses=False)
    try:
        return int(Worker.count(queue=Queue(keys.queue(QUEUE_SWEEPS), connection=conn)))
    except redis.RedisError:
        return 0
    finally:
        conn.close()


def wait_healthy(
    sup: Supervisor,
    *,
    api_url: str,
    redis_url: str,
    options: RedisOptions,
    keys: Keys,
    workers: int,
    stop: threading.Event,
    timeout_s: float,
    dashboard_url: str | None = None,
) -> None:
    """Poll until the API answers /readyz, every worker has registered and the
    dashboard (if any) serves, restarting children that die meanwhile; CliFailure at
    the deadline."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        sup.poll()
        board_ok = dashboard_url is None or dashboard_answers(dashboard_url)
        registered = _workers_registered(redis_url, options, keys)
        if board_ok and _api_ready(api_url) and registered >= workers:
            return
        if time.monotonic() > deadline:
            raise CliFailure(f"vmpool did not become healthy within {timeout_s:.0f}s")
        stop.wait(0.3)


@click.command("up")
@with_context()
@click.option("--workers", "n_workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Worker processes to run.")
@click.option("--host", default="127.0.0.1", show_default=True, help="API bind address.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="API port [default: 8080; with --demo, a free port].")
@click.option("--demo", is_flag=True, help="Run the scripted demo burst, report, and stop.")
@click.option("--ready-timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for every process to be healthy.")
@click.option("--dashboard", is_flag=True,
              help="Also run rq-dashboard on the same Redis (the `dashboard` extra).")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="rq-dashboard's port (0: a free port).")
@strict_option
def up_command(
    cli: CliContext,
    n_workers: int,
    host: str,
    port: int | None,
    demo: bool,
    ready_timeout: float,
    dashboard: bool,
    dashboard_port: int,
    strict: bool,
) -> None:
    """Run Redis (embedded unless given), the API, workers and the scheduler.

    Prints the API URL and the Redis URL once everything is healthy. Ctrl-C (SIGINT) or
    SIGTERM stops every child and leaves no process behind.
    """
    config = cli.config
    if dashboard and not dashboard_installed():
        raise CliError("--dashboard needs rq-dashboard: pip install 'vmpool[dashboard]'")
    port = _api_port(host, port, demo)
    board_url = f"http://{host}:{dashboard_port or free_port(host)}" if dashboard else None
    stop = _stop_on_signals()
    # Undone in reverse: the children, then the demo's log file, then the embedded Redis.
    with contextlib.ExitStack() as undo:
        url = config.redis_url or _embedded_redis(undo)
        check_redis_at_start(url, config.redis_options, who="vmpool up", strict=strict)
        env = {"VMPOOL_REDIS_URL": url}
        if strict:
            env[STRICT_ENV] = "1"  # each child checks again when it (re)starts
        if cli.config_path:
            env["VMPOOL_CONFIG"] = str(Path(cli.config_path).resolve())
        specs = child_specs(workers=n_workers, host=host, port=port, env=env)
        if board_url is not None:
            board_port = int(board_url.rsplit(":", 1)[1])
            specs.append(dashboard_spec(host=host, port=board_port, redis_url=url))
        sup = Supervisor(specs, output=_demo_log(undo) if demo else sys.stdout)
        undo.callback(_stop_children, sup)
        sup.start()
        api_url = f"http://{host}:{port}"
        wait_healthy(sup, api_url=api_url, redis_url=url, options=config.redis_options,
                     keys=cli.keys, workers=n_workers, stop=stop, timeout_s=ready_timeout,
                     dashboard_url=board_url)
        if board_url is not None and not stop.is_set():
            click.echo(f"rq-dashboard: {board_url}")
        code = 0 if stop.is_set() else _serve(config, sup, stop, api_url, url, demo=demo)
    if code:
        sys.exit(code)


def _api_port(host: str, port: int | None, demo: bool) -> int:
    """``--port``: 0 is any free port; unset, 8080 (a free port for the demo)."""
    if port is None:
        return free_port(host) if demo else 8080
    return free_port(host) if port == 0 else port


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set: the supervisor stops everything on it."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _embedded_redis(undo: contextlib.ExitStack) -> str:
    """Start a redis-server of our own (stopped by ``undo``); its URL."""
    try:
        server = RedisServer(appendonly=True).start()
    except RedisServerError as exc:
        raise CliFailure(str(exc)) from None
    undo.callback(server.stop)
    return server.url


def _demo_log(undo: contextlib.ExitStack) -> IO[str]:
    """The demo keeps its report on the terminal: the processes' logs go to a file."""
    log_file = undo.enter_context(
        tempfile.NamedTemporaryFile(  # noqa: SIM115 - entered in undo: closed on exit
            "w", prefix="vmpool-demo-", suffix=".log", delete=False
        )
    )
    click.echo(f"logs of every process: {log_file.name}")
    return log_file


def _stop_children(sup: Supervisor) -> None:
    click.echo("stopping every process ...")
    sup.stop()


def _serve(
    config: Config,
    sup: Supervisor,
    stop: threading.Event,
    api_url: str,
    redis_url: str,
    *,
    demo: bool,
) -> int:
    """Announce the healthy stack, then run the demo or supervise until stopped; the
    exit status."""
    click.echo(f"vmpool is up: API {api_url}  Redis {mask_url_password(redis_url)}")
    click.echo("  processes: " + ", ".join(f"{n} ({p})" for n, p in sup.pids().items()))
    if demo:
        from vmpool.local.demo import run_demo_on

        report = run_demo_on(config, sup, stop, api_url=api_url, redis_url=redis_url)
        for line in report.lines():
            click.echo(line)
        return 1 if report.violations else 0
    click.echo("Ctrl-C to stop.")
    sup.run(stop)
    return 0

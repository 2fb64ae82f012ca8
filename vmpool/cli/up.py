"""`vmpool up`: Redis, the API, N workers and the scheduler on this machine.

Each part is its own process (`vmpool api`, `vmpool worker`, `vmpool scheduler`), as it
would be in its own pod, under one supervisor that restarts the ones that die. Without
--redis-url (or VMPOOL_REDIS_URL, or :redis: url or sentinel) an embedded redis-server is started
on a free loopback port in a temporary directory, with AOF and fsync always, and
stopped on exit.

The terminal stays short: what runs, the URLs, a line to paste in another shell, then
only warnings and errors (vmpool/local/screen.py). Every process's whole log is a file
in the run directory it names (``--log-dir``). ``-v`` streams them all. What would keep
the fleet from starting is said at once, with what to do: a port taken, a Redis that
does not answer, a child that keeps exiting.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from types import FrameType

import click
import redis

from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.identity_check import lost_marks_at_start
from vmpool.cli.strict import STRICT_ENV, check_redis_at_start, strict_option
from vmpool.cli.up_health import FleetProbe, wait_healthy
from vmpool.cli.up_screen import (
    announce,
    clean_leftovers_of_killed_runs,
    starting_line,
    stop_children,
    terminal_gone,
)
from vmpool.config import Config
from vmpool.local.dashboard import (
    DEFAULT_PORT,
    dashboard_installed,
    dashboard_spec,
)
from vmpool.local.redis_server import (
    AllocatorSettingError,
    RedisServer,
    RedisServerError,
    allocator_choice,
    free_port,
    listen_problem,
)
from vmpool.local.screen import Screen, fleet_summary
from vmpool.local.supervisor import ChildSpec, Supervisor
from vmpool.state.connection import connect
from vmpool.state.store import Store

__all__ = ["child_specs", "up_command"]


def child_specs(*, workers: int, host: str, port: int, env: dict[str, str]) -> list[ChildSpec]:
    base = [sys.executable, "-m", "vmpool.cli.main"]
    specs = [ChildSpec("api", [*base, "api", "--host", host, "--port", str(port)], env)]
    specs += [ChildSpec(f"worker-{i + 1}", [*base, "worker"], env) for i in range(workers)]
    specs.append(ChildSpec("scheduler", [*base, "scheduler"], env))
    return specs


@click.command("up")
@with_context(follow_fleet=False)
@click.option(
    "--workers",
    "n_workers",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Worker processes to run.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="API bind address.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="API port [default: 8080; with --demo, a free port; 0: a free port].",
)
@click.option("--demo", is_flag=True, help="Run the scripted demo burst, report, and stop.")
@click.option(
    "--ready-timeout",
    type=float,
    default=90.0,
    show_default=True,
    help="Seconds to wait for every process to be healthy.",
)
@click.option(
    "--dashboard",
    is_flag=True,
    help="Also run rq-dashboard on the same Redis (the `dashboard` extra).",
)
@click.option(
    "--dashboard-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="rq-dashboard's port (0: a free port).",
)
@click.option(
    "--log-dir",
    "log_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where each process's log file goes [default: a new"
    " directory under the system's temporary one; kept after exit].",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="Stream every process's log here too (each line prefixed with its name).",
)
@click.option(
    "--summary",
    "summary_s",
    type=click.FloatRange(min=0),
    default=0.0,
    metavar="SECONDS",
    help="Print a one-line summary of requests, VMs and"
    " processes every SECONDS [default: 0, never].",
)
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
    log_dir: Path | None,
    verbose: bool,
    summary_s: float,
    strict: bool,
) -> None:
    """Run Redis (embedded unless given), the API, workers and the scheduler.

    Prints the URLs once everything is healthy, then only warnings and errors (each
    process's log is a file in the run directory). Ctrl-C or SIGTERM stops them all.
    """
    config = cli.config
    _check_usage(config, dashboard=dashboard)  # a usage error changes nothing, not even /tmp
    clean_leftovers_of_killed_runs()
    port, board_url = _ports(host, port, dashboard_port if dashboard else None, demo=demo)
    run_dir = _run_dir(log_dir)
    screen = _screen(config, run_dir, verbose=verbose, demo=demo)
    stop = _stop_on_signals()
    screen.on_gone = partial(terminal_gone, stop)  # `vmpool up | head`: stop as Ctrl-C
    # Undone in reverse: the children, then the log files, then the embedded Redis.
    with contextlib.ExitStack() as undo:
        url = config.redis_url or _embedded_redis(undo)
        _check_redis(cli, url, strict=strict)
        screen.say(starting_line(config, n_workers, host, port, url, run_dir))
        specs = _specs(
            cli, url, workers=n_workers, host=host, port=port, board_url=board_url, strict=strict
        )
        sup = _start_children(specs, screen, run_dir, undo)
        api_url = f"http://{host}:{port}"
        wait_healthy(
            sup,
            FleetProbe(api_url, url, config.redis_options, cli.keys, n_workers, board_url),
            stop=stop,
            timeout_s=ready_timeout,
            log_dir=run_dir,
        )
        if stop.is_set():
            return
        announce(screen, sup, api_url, url, board_url, demo=demo)
        code = _serve(cli, sup, stop, api_url, url, demo=demo, screen=screen, every_s=summary_s)
    sys.exit(code)


def _check_usage(config: Config, *, dashboard: bool) -> None:
    """What makes the command bad input, raised as CliError before anything starts: the
    dashboard's extra missing, a bad allocator for the embedded Redis."""
    if dashboard and not dashboard_installed():
        raise CliError("--dashboard needs rq-dashboard: pip install 'vmpool[dashboard]'")
    if not config.redis_url:
        try:
            allocator_choice()
        except AllocatorSettingError as exc:
            raise CliError(str(exc)) from None


def _start_children(
    specs: list[ChildSpec], screen: Screen, run_dir: Path, undo: contextlib.ExitStack
) -> Supervisor:
    """Every child started, each with its log file there from the start (if empty).

    The children stopped, then the log files closed, on the way out."""
    undo.callback(screen.close)
    for spec in specs:
        screen.log_path(spec.name).touch()
    sup = Supervisor(specs, sink=screen)
    undo.callback(stop_children, sup, run_dir, screen)
    sup.start()
    return sup


def _screen(config: Config, run_dir: Path, *, verbose: bool, demo: bool) -> Screen:
    """The terminal and the log files.

    The config's warnings said first (a misspelt key runs with its default)."""
    screen = Screen(sys.stdout, run_dir, verbose=verbose, quiet=demo)
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
        screen.seen(f"warning: {warning}")  # the children say it again: not shown twice
    return screen


def _check_redis(cli: CliContext, url: str, *, strict: bool) -> None:
    """Make the Redis ready before any child starts.

    The Redis answers and is set up as vmpool needs. The config is published there (the
    CLI follows the fleet from then on)."""
    if cli.config.redis_url:
        _reach_redis(cli)
    check_redis_at_start(url, cli.config.redis_options, who="vmpool up", strict=strict)
    lost = lost_marks_at_start(url, cli.config.redis_options, cli.keys)
    if lost:
        click.echo(f"warning: {lost}", err=True)
    cli.publish_config("vmpool up", url, warn=False)


def _specs(
    cli: CliContext,
    url: str,
    *,
    workers: int,
    host: str,
    port: int,
    board_url: str | None,
    strict: bool,
) -> list[ChildSpec]:
    """The children: the API, the workers, the scheduler, the dashboard if asked."""
    env = {"VMPOOL_REDIS_URL": url}
    if strict:
        env[STRICT_ENV] = "1"  # each child checks again when it (re)starts
    if cli.config_path:
        env["VMPOOL_CONFIG"] = str(Path(cli.config_path).resolve())
    specs = child_specs(workers=workers, host=host, port=port, env=env)
    if board_url is not None:
        board_port = int(board_url.rsplit(":", 1)[1])
        specs.append(dashboard_spec(host=host, port=board_port, redis_url=url))
    return specs


def _ports(
    host: str, port: int | None, dashboard_port: int | None, *, demo: bool
) -> tuple[int, str | None]:
    """The API's port and the dashboard's URL (None: no dashboard), both free to listen on."""
    port = _api_port(host, port, demo)
    board_url = None
    if dashboard_port is not None:
        board_url = f"http://{host}:{dashboard_port or free_port(host)}"
    _check_ports(host, port, board_url)
    return port, board_url


def _api_port(host: str, port: int | None, demo: bool) -> int:
    """``--port``: 0 is any free port. Unset, 8080 (a free port for the demo)."""
    if port is None:
        return free_port(host) if demo else 8080
    return free_port(host) if port == 0 else port


def _check_ports(host: str, port: int, board_url: str | None) -> None:
    """A port the API or the dashboard cannot listen on: one line, before anything runs."""
    wanted = [("the API", "--port", port)]
    if board_url is not None:
        wanted.append(("rq-dashboard", "--dashboard-port", int(board_url.rsplit(":", 1)[1])))
    for what, option, number in wanted:
        problem = listen_problem(host, number)
        if problem:
            raise CliFailure(
                f"{what} cannot listen on {host}:{number}: {problem} (another vmpool up?"
                f" `ss -ltnp 'sport = :{number}'` names the process); stop it, or pass"
                f" {option} N (0: any free port)"
            )


def _reach_redis(cli: CliContext) -> None:
    """The configured Redis answers, or one line naming it and what to do."""
    try:
        cli.check_redis()
    except CliFailure as exc:
        given = (
            "--redis-url / VMPOOL_REDIS_URL"
            if cli.redis_url_option
            else (f":redis: in {cli.config.source}")
        )
        raise CliFailure(
            f"{exc.message.rstrip('.')}. That URL comes from {given}: start that Redis,"
            " correct the URL, or give none and `vmpool up` starts its own"
        ) from None


def _run_dir(log_dir: Path | None) -> Path:
    """The run directory: ``--log-dir`` (made if missing), else a new temporary one."""
    if log_dir is None:
        return Path(tempfile.mkdtemp(prefix="vmpool-up-"))
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--log-dir: cannot make {log_dir}: {exc.strerror}") from None
    return log_dir.resolve()


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set: the supervisor stops everything on it."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


def _embedded_redis(undo: contextlib.ExitStack) -> str:
    """Start a redis-server of our own (stopped by ``undo``). Its URL."""
    try:
        server = RedisServer(appendonly=True).start()
    except RedisServerError as exc:
        raise CliFailure(str(exc)) from None
    undo.callback(server.stop)
    return server.url


def _serve(
    cli: CliContext,
    sup: Supervisor,
    stop: threading.Event,
    api_url: str,
    redis_url: str,
    *,
    demo: bool,
    screen: Screen,
    every_s: float,
) -> int:
    """Run the demo, or supervise until stopped (a summary line every ``every_s``).

    Returns the exit status."""
    if demo:
        from vmpool.local.demo import run_demo_on

        report = run_demo_on(cli.config, sup, stop, api_url=api_url, redis_url=redis_url)
        for line in report.lines():
            screen.say(line)
        return 1 if report.violations else 0
    client = connect(redis_url, cli.config.redis_options, decode_responses=True)
    store = Store(client, cli.keys)
    next_summary = time.monotonic() + every_s
    try:
        while not stop.wait(0.2):
            sup.poll()
            if every_s and time.monotonic() >= next_summary:
                next_summary += every_s
                _summary(store, list(cli.config.pools), sup, screen)
    finally:
        client.close()
    return 0


def _summary(store: Store, pools: list[str], sup: Supervisor, screen: Screen) -> None:
    restarts = sum(child.restarts for child in sup.children.values())
    try:
        line = fleet_summary(
            store,
            pools,
            processes_up=len(sup.pids()),
            processes=len(sup.children),
            restarts=restarts,
        )
    except redis.RedisError as exc:
        line = f"{time.strftime('%H:%M:%S')} summary: Redis does not answer: {exc}"
    screen.say(line)

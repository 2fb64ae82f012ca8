"""`vmpool up`: Redis, the API, N workers and the scheduler on this machine.

Each part is its own process (`vmpool api`, `vmpool worker`, `vmpool scheduler`), as it
would be in its own pod, under one supervisor that prefixes their logs and restarts
the ones that die. Without --redis-url (or VMPOOL_REDIS_URL, or :redis: url) an
embedded redis-server is started on a free loopback port in a temporary directory,
with AOF and fsync always, and stopped on exit.
"""

from __future__ import annotations

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

from vmpool.cli.main import CliFailure, common_options, load_cli_config
from vmpool.config import Config, mask_url_password
from vmpool.local.redis_server import RedisServer, RedisServerError, free_port
from vmpool.local.supervisor import ChildSpec, Supervisor


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


def _workers_registered(redis_url: str) -> int:
    from rq import Worker

    conn = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    try:
        return int(Worker.count(connection=conn))
    except redis.RedisError:
        return 0
    finally:
        conn.close()


def wait_healthy(
    sup: Supervisor,
    *,
    api_url: str,
    redis_url: str,
    workers: int,
    stop: threading.Event,
    timeout_s: float,
) -> None:
    """Poll until the API answers /readyz and every worker has registered, restarting
    children that die meanwhile; CliFailure at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        sup.poll()
        if _api_ready(api_url) and _workers_registered(redis_url) >= workers:
            return
        if time.monotonic() > deadline:
            raise CliFailure(f"vmpool did not become healthy within {timeout_s:.0f}s")
        stop.wait(0.3)


@click.command("up")
@common_options
@click.option("--workers", "n_workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Worker processes to run.")
@click.option("--host", default="127.0.0.1", show_default=True, help="API bind address.")
@click.option("--port", type=click.IntRange(0, 65535), default=None,
              help="API port [default: 8080; with --demo, a free port].")
@click.option("--demo", is_flag=True, help="Run the scripted demo burst, report, and stop.")
@click.option("--ready-timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for every process to be healthy.")
def up_command(
    config_path: str | None,
    redis_url: str | None,
    n_workers: int,
    host: str,
    port: int | None,
    demo: bool,
    ready_timeout: float,
) -> None:
    """Run Redis (embedded unless given), the API, workers and the scheduler.

    Prints the API URL and the Redis URL once everything is healthy. Ctrl-C (SIGINT) or
    SIGTERM stops every child and leaves no process behind.
    """
    config = load_cli_config(config_path, redis_url)
    if port is None:
        port = free_port(host) if demo else 8080
    elif port == 0:
        port = free_port(host)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    embedded: RedisServer | None = None
    url = config.redis_url
    if not url:
        try:
            embedded = RedisServer(appendonly=True).start()
        except RedisServerError as exc:
            raise CliFailure(str(exc)) from None
        url = embedded.url
    log_file: IO[str] | None = None
    try:
        env = {"VMPOOL_REDIS_URL": url}
        if config_path:
            env["VMPOOL_CONFIG"] = str(Path(config_path).resolve())
        output: IO[str] = sys.stdout
        if demo:
            log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in finally
                "w", prefix="vmpool-demo-", suffix=".log", delete=False
            )
            output = log_file
            click.echo(f"logs of every process: {log_file.name}")
        sup = Supervisor(
            child_specs(workers=n_workers, host=host, port=port, env=env), output=output
        )
        api_url = f"http://{host}:{port}"
        sup.start()
        try:
            wait_healthy(sup, api_url=api_url, redis_url=url, workers=n_workers,
                         stop=stop, timeout_s=ready_timeout)
            if stop.is_set():
                return
            click.echo(f"vmpool is up: API {api_url}  Redis {mask_url_password(url)}")
            click.echo("  processes: " + ", ".join(f"{n} ({p})" for n, p in sup.pids().items()))
            if demo:
                code = _run_demo(config, sup, stop, api_url, url)
                if code:
                    sys.exit(code)
                return
            click.echo("Ctrl-C to stop.")
            sup.run(stop)
        finally:
            click.echo("stopping every process ...")
            sup.stop()
    finally:
        if log_file is not None:
            log_file.close()
        if embedded is not None:
            embedded.stop()


def _run_demo(
    config: Config, sup: Supervisor, stop: threading.Event, api_url: str, redis_url: str
) -> int:
    from vmpool.local.demo import ApiClient, run_demo
    from vmpool.providers import providers_from_config
    from vmpool.state.keys import Keys
    from vmpool.state.store import Store

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = Store(client, Keys(config.key_prefix))
    providers = providers_from_config(client, store.keys, config)
    flaky = [name for name, pool in config.pools.items()
             if config.providers[pool.provider].options.get("create_fail_percent")]
    healthy = [name for name in config.pools if name not in flaky]
    watcher = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    watcher.start()
    try:
        report = run_demo(
            ApiClient(api_url),
            store,
            providers,
            pools=healthy,
            flaky_pools=flaky,
            sweep_interval_s=config.schedule.sweep,
        )
    finally:
        stop.set()
        watcher.join(timeout=5)
    for line in report.lines():
        click.echo(line)
    return 1 if report.violations else 0

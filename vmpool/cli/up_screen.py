"""What `vmpool up` says on its terminal, and what it does when that terminal goes away.

Every line goes through the run's :class:`~vmpool.local.screen.Screen`, whose writes
never raise: a terminal that closed (``vmpool up | head`` once head has its lines, a
closed ssh session) stops the fleet as Ctrl-C does (:func:`terminal_gone`), and the
children are stopped before anything more is said (:func:`stop_children`). What a killed
run left (its embedded Redis's directory) the next run removes
(:func:`clean_leftovers_of_killed_runs`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import threading
from pathlib import Path

import click

from vmpool.config import Config, mask_url_password
from vmpool.local.redis_server import clean_leftovers
from vmpool.local.screen import Screen
from vmpool.local.supervisor import Supervisor

__all__ = [
    "announce",
    "clean_leftovers_of_killed_runs",
    "starting_line",
    "stop_children",
    "terminal_gone",
]


def starting_line(
    config: Config, workers: int, host: str, port: int, redis_url: str, run_dir: Path
) -> str:
    pools = ", ".join(config.pools) or "none"
    redis_kind = "given" if config.redis_url else "embedded"
    return (
        f"vmpool up: starting the API on {host}:{port}, {workers} worker(s) and the scheduler"
        f" on Redis {mask_url_password(redis_url)} ({redis_kind})\n"
        f"  config: {config.source} (pools: {pools})\n"
        f"  logs:   {run_dir}/ (one file per process)"
    )


def announce(
    screen: Screen,
    sup: Supervisor,
    api_url: str,
    redis_url: str,
    board_url: str | None,
    *,
    demo: bool,
) -> None:
    """The few lines a person needs once everything is healthy."""
    screen.say(f"vmpool is up: API {api_url}  Redis {mask_url_password(redis_url)}")
    screen.say("  processes: " + ", ".join(f"{n} ({p})" for n, p in sup.pids().items()))
    screen.say(f"  dashboard: {api_url}/dashboard/")
    if board_url is not None:
        screen.say(f"rq-dashboard: {board_url}")
    if demo:
        return
    masked = mask_url_password(redis_url)
    screen.say(
        "\nIn another shell, the vmpool commands work on this fleet (its pools, its config) with:"
    )
    screen.say(f"  export VMPOOL_REDIS_URL={shlex.quote(masked)}")
    if masked != redis_url:
        screen.say("  (the password is masked here: put yours in its place)")
    screen.say(
        "\nCtrl-C stops everything. Below: warnings and errors only (-v: every line of every log)."
    )


def stop_children(sup: Supervisor, run_dir: Path, screen: Screen) -> None:
    """Stop every child (before the embedded Redis stops), saying so where a person looks."""
    screen.say("stopping every process ...")
    sup.stop()
    screen.say(f"stopped; the logs stay in {run_dir}/")


def terminal_gone(stop: threading.Event) -> None:
    """The terminal closed: stop everything, and write nothing more to it.

    stdout then goes to /dev/null, so that no later write (the interpreter's own flush at
    exit included) fails on it."""
    stop.set()
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def clean_leftovers_of_killed_runs() -> None:
    """Remove what a `vmpool up` killed (SIGKILL, a closed terminal) left behind: its
    embedded Redis's directory, and that Redis if it still runs. Said on stderr."""
    for directory in clean_leftovers():
        click.echo(f"removed {directory}: left by a vmpool up that was killed", err=True)

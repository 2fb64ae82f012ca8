"""The wait for `vmpool up`'s fleet to become healthy, and what it asks each time."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import redis

from vmpool.cli.errors import CliFailure
from vmpool.local.dashboard import dashboard_answers
from vmpool.local.supervisor import Supervisor
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.keys import Keys

__all__ = ["EXITS_BEFORE_UP", "FleetProbe", "wait_healthy"]

# A child that exits this many times before the fleet is up will not come up.
EXITS_BEFORE_UP = 3


@dataclass(frozen=True)
class FleetProbe:
    """Where the fleet answers, and how many workers it should have registered."""

    api_url: str
    redis_url: str
    redis_options: RedisOptions
    keys: Keys
    workers: int
    dashboard_url: str | None = None

    def healthy(self) -> bool:
        """The API answers /readyz, every worker registered, the dashboard (if any) serves."""
        board_ok = self.dashboard_url is None or dashboard_answers(self.dashboard_url)
        registered = _workers_registered(self.redis_url, self.redis_options, self.keys)
        return board_ok and _api_ready(self.api_url) and registered >= self.workers


def wait_healthy(
    sup: Supervisor,
    probe: FleetProbe,
    *,
    stop: threading.Event,
    timeout_s: float,
    log_dir: Path | None = None,
) -> None:
    """Poll until the probe finds the fleet healthy.

    Children that die meanwhile are restarted.

    Raises CliFailure at the deadline, or as soon as a child has exited
    EXITS_BEFORE_UP times.
    """
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        sup.poll()
        _fail_if_a_child_keeps_exiting(sup, log_dir)
        if probe.healthy():
            return
        if time.monotonic() > deadline:
            where = f"; the logs are in {log_dir}" if log_dir else ""
            raise CliFailure(f"vmpool did not become healthy within {timeout_s:.0f}s{where}")
        stop.wait(0.3)


def _fail_if_a_child_keeps_exiting(sup: Supervisor, log_dir: Path | None) -> None:
    for name, child in sup.children.items():
        if child.exits >= EXITS_BEFORE_UP:
            log = f"; its log: {log_dir / f'{name}.log'}" if log_dir else ""
            last = child.last_line() or "(it printed nothing)"
            raise CliFailure(f"{name} exited {child.exits} times while starting: {last}{log}")


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

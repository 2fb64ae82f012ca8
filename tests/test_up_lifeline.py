"""`vmpool up` leaves nothing behind however it ends: killed (SIGKILL, as a closed
terminal may), its children and its embedded Redis die with it and the next run removes
the Redis directory it left; its stdout closed (`vmpool up | head`), it stops everything
as Ctrl-C does; and the scheduler, told to stop while Redis is gone, stops (it waited
for Redis forever: the scheduler outlived `vmpool up | head` in 3 of 3 tries).

Each process a run starts is found by a marker in its environment (every child inherits
`vmpool up`'s), and the test kills by pid whatever is left."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from vmpool.config import Schedule
from vmpool.local.redis_server import RedisServer

from processhelp import Output
from storehelp import wait_until

pytestmark = pytest.mark.slow  # each test runs a fleet of processes


def marked(marker: str) -> list[int]:
    """The live processes whose environment carries ``marker``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"{marker}=1".encode() in (proc / "environ").read_bytes():
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def marker() -> Iterator[str]:
    name = f"VMPOOL_TEST_RUN_{os.getpid()}_{time.monotonic_ns()}"
    yield name
    for pid in marked(name):  # whatever a failed test left: by pid, never by name
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def up(marker: str, logs: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env |= {marker: "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "vmpool.cli.main", "up", "--workers", "1", "--port", "0"]
    return subprocess.Popen(
        [*command, "--log-dir", str(logs), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def test_killed_up_takes_its_children_and_redis_and_the_next_run_cleans_up(
    marker: str, tmp_path: Path
) -> None:
    proc = up(marker, tmp_path / "run")
    out = Output(proc.stdout)
    wait_until(lambda: "Ctrl-C stops everything" in out.text(), timeout=90, step=0.1)
    port = re.search(r"Redis redis://127\.0\.0\.1:(\d+)/0", out.text())
    assert port, out.text()
    client = redis.Redis(port=int(port.group(1)))
    directory = Path(str(client.config_get("dir")["dir"]))
    redis_pid = int(client.info("server")["process_id"])
    client.close()
    assert len(marked(marker)) == 4  # up, api, worker, scheduler (redis rewrites its own)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    try:
        wait_until(lambda: not marked(marker) and not alive(redis_pid), timeout=30, step=0.1)
    finally:
        if alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
    assert directory.is_dir()  # nobody was left to remove it
    with socket.socket() as taken:  # the next run fails at once, but cleans first
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        again = subprocess.run(
            [sys.executable, "-m", "vmpool.cli.main", "up", "--port", str(taken.getsockname()[1])],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert again.returncode == 1, again.stderr
    assert f"removed {directory}: left by a vmpool up that was killed" in again.stderr
    assert not directory.exists()


def test_up_piped_to_head_stops_everything_when_head_is_done(marker: str, tmp_path: Path) -> None:
    """`vmpool up | head -3`: once head has its lines and closes the pipe, the next
    write is EPIPE, and `vmpool up` stops every child, then its Redis, as Ctrl-C does."""
    logs = tmp_path / "run"
    proc = up(marker, logs)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()  # what head does
    assert proc.wait(timeout=120) == 0
    wait_until(lambda: not marked(marker), timeout=20, step=0.1)
    assert "all children stopped" in (logs / "supervisor.log").read_text()


def test_the_scheduler_stops_on_sigterm_while_redis_is_gone(tmp_path: Path) -> None:
    """SIGTERM reaches the scheduler asleep between two ticks, its Redis gone meanwhile
    (as when `vmpool up` dies with its Redis): it exits. rq-scheduler's handler wrote
    the scheduler's death to Redis first; the Redis error it met was taken for an outage
    to wait out, and the process never stopped. Every periodic job runs hourly here, so
    after its first tick the scheduler waits (up to --interval, 60 s, blocked on the
    parked sweep's wake-up list): the test sends SIGTERM once the kernel shows it in that
    wait."""
    config = tmp_path / "hourly.yaml"
    hourly = ", ".join(f"{job}: 3600" for job in Schedule.model_fields)
    config.write_text(f":schedule: {{{hourly}}}\n")
    server = RedisServer(appendonly=False).start()
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    command = [sys.executable, "-m", "vmpool.cli.main", "scheduler", "--interval", "60"]
    proc = subprocess.Popen(
        [*command, "--redis-url", server.url, "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    out = Output(proc.stdout)
    try:
        client = redis.Redis.from_url(server.url)
        wait_until(lambda: client.keys("*scheduler*") != [], timeout=60, step=0.1)
        client.close()
        wchan = Path(f"/proc/{proc.pid}/wchan")
        waiting = ("nanosleep", "poll_schedule_timeout")  # a sleep, or the wake-up list's block
        wait_until(lambda: any(w in wchan.read_text() for w in waiting), timeout=30, step=0.05)
        server.stop()  # Redis gone while the scheduler waits
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) is not None, out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        server.stop()

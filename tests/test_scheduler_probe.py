"""`vmpool probe scheduler`: the scheduler Deployment's liveness probe.

A real `vmpool scheduler --alive-file` process on the test Redis touches its file on
every tick; the probe (which never connects to Redis) exits 0 while the file is fresh.
Frozen with SIGSTOP (a wedged loop), the file goes stale and the probe exits 1 with
one line naming its age; resumed, it is alive again. The process is killed by its pid
at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.cli.probe import SCHEDULER_ALIVE_FILE_ENV
from vmpool.local.redis_server import free_port

CONFIG = """
:providers:
  :simulated: {boot_seconds: 1}
:pools:
  - {name: deb, template: deb, provider: simulated}
"""


def probe(path: Path, max_age: float) -> Result:
    unreachable = f"redis://127.0.0.1:{free_port()}/0"  # the probe must not need Redis
    env = {SCHEDULER_ALIVE_FILE_ENV: str(path), "VMPOOL_REDIS_URL": unreachable}
    return CliRunner().invoke(cli, ["probe", "scheduler", "--max-age", str(max_age)], env=env)


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_the_probe_follows_the_scheduler_loop(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG)
    alive = tmp_path / "scheduler-alive"
    env = {
        **os.environ,
        "VMPOOL_CONFIG": str(config),
        "VMPOOL_REDIS_URL": redis_url,
        SCHEDULER_ALIVE_FILE_ENV: str(alive),
    }
    log = (tmp_path / "scheduler.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "scheduler", "--interval", "0.2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:

        def fresh() -> bool:
            assert proc.poll() is None, (tmp_path / "scheduler.log").read_text()
            return probe(alive, 1.0).exit_code == 0

        wait_for(fresh, 30, "the scheduler's alive file")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: probe(alive, 1.0).exit_code == 1, 10, "the probe to see it stale")
        stale = probe(alive, 1.0)
        assert "scheduler loop stale:" in stale.output, stale.output
        assert len(stale.output.strip().splitlines()) == 1
        os.kill(proc.pid, signal.SIGCONT)
        wait_for(fresh, 10, "the scheduler to tick again")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_no_file_is_exit_2(tmp_path: Path) -> None:
    result = probe(tmp_path / "never-written", 60)
    assert result.exit_code == 2
    assert "the scheduler loop has not started" in result.output

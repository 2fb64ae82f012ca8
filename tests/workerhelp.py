"""Test-only jobs and a `vmpool worker` child process, for tests/test_worker_lifecycle.py.

The worker process imports this module by name (``workerhelp.slow_job``): the tests put
tests/ on its PYTHONPATH. Every process started here is stopped by its pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFIG = """
:providers:
  :simulated: {boot_seconds: [0.1, 0.3], seed: 5}
:pools:
  - {name: deb, template: deb, provider: simulated}
"""


def slow_job(marker_dir: str, seconds: float) -> str:
    """Mark the start, sleep, mark the end. A signal handler that returns does not cut
    the sleep short (PEP 475), so a warm shutdown lets it finish."""
    Path(marker_dir, "started").touch()
    time.sleep(seconds)
    Path(marker_dir, "finished").touch()
    return "finished"


def quick_job() -> str:
    return "ok"


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> None:
        """Fail at once (with the log's tail) when the worker has exited."""
        code = self.proc.poll()
        assert code is None, f"the worker exited with {code}:\n{self.text()[-4000:]}"

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the horse too
        self.proc.wait(10)


def worker_env(tmp_path: Path, redis_url: str, **extra: str) -> dict[str, str]:
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG)
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "VMPOOL_REDIS_URL": redis_url,
        "VMPOOL_CONFIG": str(config),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": path,
        **extra,
    }


def start_worker(tmp_path: Path, env: dict[str, str], *args: str) -> WorkerProcess:
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vmpool.cli.main", "worker", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return WorkerProcess(proc, log)


def start_scheduler(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``vmpool scheduler`` ticking every 0.2 s, its output in ``scheduler.log``."""
    log = (tmp_path / "scheduler.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "scheduler", "--interval", "0.2"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

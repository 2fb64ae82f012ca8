"""`--wait-for-redis`: a worker or scheduler started before its Redis waits for it.

Under Kubernetes a pod started while Redis is down (a node drain, a Redis restart)
exited at once and went into CrashLoopBackOff, whose back-off (up to 5 minutes) outlasts
the outage and holds the sweeps back. With ``--wait-for-redis SECONDS``
(``VMPOOL_WAIT_FOR_REDIS``, set in deploy/k8s) the process waits, saying so on stderr,
and goes on once Redis answers; without it a missing Redis is still one line and exit 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vmpool.local.redis_server import RedisServer, free_port

from storehelp import wait_until

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :simulated: {boot_seconds: [0.1, 0.3], seed: 5}
:pools:
  - {name: deb, template: deb, provider: simulated}
"""


def _start(tmp_path: Path, url: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG)
    log = tmp_path / f"{args[0]}.log"
    env = {
        **os.environ,
        "VMPOOL_REDIS_URL": url,
        "VMPOOL_CONFIG": str(config),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vmpool.cli.main", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, log


@pytest.mark.parametrize("command", ["worker", "scheduler"])
def test_a_process_started_before_redis_waits_for_it(tmp_path: Path, command: str) -> None:
    """Proves: started with no Redis listening, the process neither exits nor crashes;
    it prints that it waits, and once a Redis comes up on that port it does its work
    (--burst: one pass) and exits 0. Fails on a build without the option (exit 2)."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc, log = _start(tmp_path, url, command, "--burst", "--wait-for-redis", "60")
    server: RedisServer | None = None
    try:
        wait_until(
            lambda: "waiting for Redis" in log.read_text() or proc.poll() is not None, timeout=30
        )
        assert proc.poll() is None, log.read_text()
        server = RedisServer(port=port, appendonly=False).start()
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if server is not None:
            server.stop()


def test_without_waiting_a_missing_redis_is_one_line(tmp_path: Path) -> None:
    """Proves: the default (0) keeps the old answer: one line naming Redis, exit 1."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc, log = _start(tmp_path, url, "worker", "--burst")
    try:
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis" in lines[0], lines

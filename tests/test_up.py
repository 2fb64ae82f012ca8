"""`vmpool up` as a real process: it starts Redis, the API, a worker and the scheduler,
reports them healthy, restarts a child the test kills, and on SIGINT stops every child
and the embedded Redis, leaving no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import redis

from storehelp import wait_until

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split()[2] != "Z"


class Output:
    """Collects a process's output lines from a reader thread."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            with self._lock:
                self.lines.append(raw.decode(errors="replace").rstrip())

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


def test_up_runs_everything_restarts_a_dead_child_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "up", "--workers", "1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    out = Output(proc.stdout)
    try:
        wait_until(lambda: "vmpool is up" in out.text(), timeout=90, step=0.1)
        up = re.search(r"API (http://\S+)\s+Redis redis://127\.0\.0\.1:(\d+)/0", out.text())
        assert up, out.text()
        api, redis_port = up.group(1), int(up.group(2))
        pids = {name: int(pid) for name, pid in
                re.findall(r"([\w-]+) \((\d+)\)", out.text().split("processes:")[1])}
        assert set(pids) == {"api", "worker-1", "scheduler"}
        with urllib.request.urlopen(api + "/readyz", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(api + "/api/v3/status", timeout=5) as resp:
            assert "pools" in json.load(resp)
        client = redis.Redis(port=redis_port)
        redis_pid = int(client.info("server")["process_id"])
        client.close()

        # a child killed by the test is restarted by the supervisor (counted from now: a
        # worker that died while the stack came up was restarted already)
        def worker_starts() -> list[str]:
            return re.findall(r"started worker-1 \(pid (\d+)\)", out.text())

        before = len(worker_starts())
        os.kill(pids["worker-1"], signal.SIGKILL)
        wait_until(lambda: len(worker_starts()) > before, timeout=30, step=0.1)
        new_worker = int(worker_starts()[-1])
        assert new_worker != pids["worker-1"] and alive(new_worker)

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.text()
        for pid in [*pids.values(), new_worker, redis_pid]:
            wait_until(lambda pid=pid: not alive(pid), timeout=10)
        assert "all children stopped" in out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_up_with_an_unreachable_redis_fails_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vmpool.cli.main", "up", "--redis-url", "redis://127.0.0.1:1/0",
         "--ready-timeout", "5", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr


def test_up_with_the_dashboard_serves_the_fleets_queues() -> None:
    """`vmpool up --dashboard` starts rq-dashboard on the fleet's Redis, prints its URL
    once it answers, shows the fleet's queues, and stops it with everything else."""
    pytest.importorskip("rq_dashboard", reason="the `dashboard` extra is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "up", "--workers", "1", "--port", "0",
         "--dashboard", "--dashboard-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    out = Output(proc.stdout)
    try:
        wait_until(lambda: "vmpool is up" in out.text(), timeout=90, step=0.1)
        board = re.search(r"rq-dashboard: (http://\S+)", out.text())
        assert board, out.text()
        with urllib.request.urlopen(board.group(1) + "/0/data/queues.json", timeout=10) as resp:
            names = {q["name"] for q in json.load(resp)["queues"]}
        # RQ lists a queue once a job was put on it: the scheduler's sweeps are
        assert "vmpool-sweeps" in names, names
        pid = int(re.findall(r"dashboard \((\d+)\)", out.text())[-1])
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.text()
        wait_until(lambda: not alive(pid), timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_up_dashboard_without_the_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without rq-dashboard installed, --dashboard is a usage error: exit 2, one line,
    naming the extra to install, before anything is started."""
    from click.testing import CliRunner

    import vmpool.cli.up as up

    monkeypatch.setattr(up, "dashboard_installed", lambda: False)
    res = CliRunner().invoke(up.up_command, ["--dashboard"])
    assert res.exit_code == 2
    assert "pip install 'vmpool[dashboard]'" in res.output
    assert res.output.strip().count("\n") == 0

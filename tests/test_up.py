"""`vmpool up` as a real process: it starts Redis, the API, a worker and the scheduler,
reports them healthy on a short screen, keeps the children's logs in files, restarts a
child the test kills, and on SIGINT stops every child and the embedded Redis, leaving no
process behind; what keeps it from starting (a taken port, an unreachable Redis, a child
that keeps exiting) it says at once."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from processhelp import Output, killed_run_dir
from storehelp import wait_until

pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split()[2] != "Z"


FLEET_CONFIG = """\
:config:
  vm_lifetme: 3
:providers:
  simulated: {boot_seconds: 0.3, seed: 3}
:redis:
  key_prefix: ci
:pools:
  - {name: fleetpool, alias: [fp], domain: example.com}
"""


def _vmpool(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vmpool.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_up_runs_everything_quietly_restarts_a_dead_child_and_stops_cleanly(
    tmp_path: Path,
) -> None:
    """`vmpool up` as a newcomer runs it: a short screen (what runs, the URLs, a line to
    paste, the config's warning naming its key), the children's logs in the run
    directory and not on the terminal, a killed child restarted and said so, the CLI
    given only the pasted Redis URL working on this fleet's pools (its config published,
    a non-default key prefix found), and SIGINT leaving no process behind."""
    config = tmp_path / "fleet.yaml"
    config.write_text(FLEET_CONFIG)
    logs = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmpool.cli.main",
            "up",
            "--workers",
            "1",
            "--port",
            "0",
            "--config",
            str(config),
            "--log-dir",
            str(logs),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    out = Output(proc.stdout)
    try:
        wait_until(lambda: "Ctrl-C stops everything" in out.text(), timeout=90, step=0.1)
        text = out.text()
        assert f"{config}: config.vm_lifetme: unknown key, ignored" in text
        up = re.search(r"API (http://\S+)\s+Redis redis://127\.0\.0\.1:(\d+)/0", text)
        assert up, text
        api, redis_port = up.group(1), int(up.group(2))
        export = re.search(r"^  export (VMPOOL_REDIS_URL=\S+)$", text, re.MULTILINE)
        assert export, text
        variable, value = shlex.split(export.group(1))[0].split("=", 1)
        assert variable == "VMPOOL_REDIS_URL"
        assert value == f"redis://127.0.0.1:{redis_port}/0"
        pids = {
            name: int(pid)
            for name, pid in re.findall(r"([\w-]+) \((\d+)\)", text.split("processes:")[1])
        }
        assert set(pids) == {"api", "worker-1", "scheduler"}
        assert str(logs) in text
        with urllib.request.urlopen(api + "/readyz", timeout=5) as resp:
            assert resp.status == 200

        # the CLI, given only the URL it printed, works on this fleet's pools
        cli_env = {**env, "VMPOOL_REDIS_URL": value}
        pools = _vmpool("pools", "--json", env=cli_env)
        assert pools.returncode == 0, pools.stderr
        assert [row["pool"] for row in json.loads(pools.stdout)] == ["fleetpool"]
        made = _vmpool("request", "create", "fp=1", "--wait", "--timeout", "30", env=cli_env)
        assert made.returncode == 0, made.stderr
        assert "example.com" in made.stdout
        # a config file that is not the fleet's: a warning, and the command uses it
        other = tmp_path / "other.yaml"
        other.write_text(":pools:\n  - {name: elsewhere}\n")
        mine = _vmpool("pools", "--config", str(other), env=cli_env)
        assert mine.returncode == 0, mine.stderr
        assert "differs from the running fleet's config" in mine.stderr
        assert "key_prefix" in mine.stderr and "pools" in mine.stderr

        # the children's logs are in files, not on the terminal
        for child in ("api", "worker-1", "scheduler", "supervisor"):
            assert (logs / f"{child}.log").exists(), child
        wait_until(lambda: "rq.worker" in (logs / "worker-1.log").read_text(), timeout=30)
        assert "rq.worker" not in out.text() and " INFO " not in out.text()

        # a child killed by the test is restarted by the supervisor, and the screen says so
        def worker_starts() -> list[str]:
            return re.findall(
                r"started worker-1 \(pid (\d+)\)", (logs / "supervisor.log").read_text()
            )

        before = len(worker_starts())
        os.kill(pids["worker-1"], signal.SIGKILL)
        wait_until(lambda: len(worker_starts()) > before, timeout=30, step=0.1)
        new_worker = int(worker_starts()[-1])
        assert new_worker != pids["worker-1"] and alive(new_worker)
        assert "worker-1 exited with -9; restarting" in out.text()

        client = redis.Redis(port=redis_port)
        redis_pid = int(client.info("server")["process_id"])
        client.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.text()
        for pid in [*pids.values(), new_worker, redis_pid]:
            wait_until(lambda pid=pid: not alive(pid), timeout=10)
        assert "all children stopped" in (logs / "supervisor.log").read_text()
        assert f"the logs stay in {logs}" in out.text()
        # the screen stayed short: no routine line of any process reached it
        assert len(out.lines) < 25, out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_up_with_an_unreachable_redis_names_it_at_once(tmp_path: Path) -> None:
    """The config's Redis does not answer: exit 1 in seconds (not the ready timeout),
    one line naming the address (password masked) and where it came from."""
    config = tmp_path / "vmpool.yaml"
    config.write_text(
        ":redis: {url: 'redis://:sekrit@127.0.0.1:1/0'}\n:pools:\n  - {name: debian}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    started = time.monotonic()
    result = _vmpool("up", "--config", str(config), "--port", "0", env=env)
    assert time.monotonic() - started < 20
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        "vmpool: error: cannot reach Redis at redis://:***@127.0.0.1:1/0"
    )
    assert f":redis: in {config}" in result.stderr and "sekrit" not in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_up_on_a_taken_port_names_it_at_once(tmp_path: Path) -> None:
    """Another server on the API's port: exit 1 at once, naming the port and --port,
    and nothing started (not a false "vmpool is up" from the other server's answers)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = _vmpool("up", "--port", str(port), "--log-dir", str(tmp_path / "run"), env=env)
    assert time.monotonic() - started < 20
    assert result.returncode == 1, result.stdout
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "--port N" in result.stderr
    assert "vmpool is up" not in result.stdout and not (tmp_path / "run").exists()


def test_a_child_that_keeps_exiting_fails_the_start_with_its_last_line(tmp_path: Path) -> None:
    """A child that exits again and again while the fleet starts (here: one that cannot
    start at all) ends the wait early, naming the child, its last line and its log."""

    from vmpool.cli.errors import CliFailure
    from vmpool.cli.up_health import EXITS_BEFORE_UP, FleetProbe, wait_healthy
    from vmpool.config import default_redis_options
    from vmpool.local.screen import Screen
    from vmpool.local.supervisor import ChildSpec, Supervisor
    from vmpool.state.keys import Keys

    crash = [
        sys.executable,
        "-c",
        "import sys; print('boom: cannot bind', flush=True); sys.exit(3)",
    ]
    screen = Screen(io.StringIO(), tmp_path)
    sup = Supervisor(
        [ChildSpec("api", crash)], sink=screen, backoff_initial_s=0.05, backoff_max_s=0.1
    )
    sup.start()
    started = time.monotonic()
    try:
        with pytest.raises(CliFailure) as failure:
            probe = FleetProbe(
                "http://127.0.0.1:1",
                "redis://127.0.0.1:1/0",
                default_redis_options(),
                Keys("vmpool"),
                workers=0,
            )
            wait_healthy(
                sup,
                probe,
                stop=threading.Event(),
                timeout_s=60,
                log_dir=tmp_path,
            )
    finally:
        sup.stop()
        screen.close()
    assert time.monotonic() - started < 20
    assert str(failure.value.message) == (
        f"api exited {EXITS_BEFORE_UP} times while starting: boom: cannot bind;"
        f" its log: {tmp_path / 'api.log'}"
    )
    assert "boom: cannot bind" in (tmp_path / "api.log").read_text()


def test_up_with_the_dashboard_serves_the_fleets_queues() -> None:
    """`vmpool up --dashboard` starts rq-dashboard on the fleet's Redis, prints its URL
    once it answers, shows the fleet's queues, and stops it with everything else."""
    pytest.importorskip("rq_dashboard", reason="the `dashboard` extra is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmpool.cli.main",
            "up",
            "--workers",
            "1",
            "--port",
            "0",
            "--dashboard",
            "--dashboard-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    out = Output(proc.stdout)
    try:
        # the announcement's lines arrive one by one: wait for its last, not its first
        wait_until(lambda: "Ctrl-C stops everything" in out.text(), timeout=90, step=0.1)
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


def test_up_dashboard_without_the_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without rq-dashboard installed, --dashboard is a usage error: exit 2, one line,
    naming the extra to install, before anything is started or removed.

    A killed run's directory is there (as a test that killed its `vmpool up` leaves one):
    the usage error comes before the clean-up, so it stays, and nothing else is said."""
    from click.testing import CliRunner

    import vmpool.cli.up as up

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = killed_run_dir(tmp_path)
    monkeypatch.setattr(up, "dashboard_installed", lambda: False)
    res = CliRunner().invoke(up.up_command, ["--dashboard"])
    assert res.exit_code == 2
    assert "pip install 'vmpool[dashboard]'" in res.output
    assert res.output.strip().count("\n") == 0, res.output
    assert left.is_dir()


def test_demo_report_is_quiet_and_says_its_failures_are_the_flaky_pools(tmp_path: Path) -> None:
    """`make demo`'s command: the terminal has the start, the progress and the report
    (no process's log line), the audit is clean, and failed requests are said to come
    from the pool whose simulated cloud fails on purpose."""
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vmpool.cli.main",
            "up",
            "--demo",
            "--workers",
            "2",
            "--log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "(some on flaky-x86_64, which fails on purpose)" in out
    assert "audit:          clean" in out
    assert " INFO " not in out and "rq.worker" not in out and "export" not in out
    failed = re.search(r"requests: +24 \(.*failed (\d+)", out)
    on_flaky = re.search(r"(\d+) failed on purpose: they asked flaky-x86_64", out)
    if failed:  # the seeded burst fails some; each failure is accounted for
        elsewhere = re.search(r"(\d+) failed on a healthy pool", out)
        counted = (int(on_flaky.group(1)) if on_flaky else 0) + (
            int(elsewhere.group(1)) if elsewhere else 0
        )
        assert counted == int(failed.group(1)), out
    assert (tmp_path / "worker-1.log").stat().st_size > 0

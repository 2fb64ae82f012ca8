"""The supervisor of `vmpool up`: prefixes logs, restarts a child that dies, and leaves
no process behind when stopped."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading

from vmpool.local.supervisor import ChildSpec, Supervisor

from storehelp import wait_until

SLEEPER = [sys.executable, "-c", "import time, sys; print('hello', flush=True); time.sleep(120)"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_children_start_log_with_prefix_and_stop_cleanly() -> None:
    out = io.StringIO()
    sup = Supervisor([ChildSpec("a", SLEEPER), ChildSpec("b", SLEEPER)], output=out)
    sup.start()
    try:
        wait_until(lambda: "[a] hello" in out.getvalue() and "[b] hello" in out.getvalue())
        pids = sup.pids()
        assert set(pids) == {"a", "b"}
    finally:
        sup.stop()
    assert not any(alive(pid) for pid in pids.values())


def test_a_killed_child_is_restarted_with_backoff() -> None:
    out = io.StringIO()
    sup = Supervisor([ChildSpec("w", SLEEPER)], output=out, backoff_initial_s=0.1)
    sup.start()
    stop = threading.Event()
    runner = threading.Thread(target=sup.run, args=(stop, 0.05))
    runner.start()
    try:
        first = sup.pids()["w"]
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: sup.pids().get("w", first) != first, timeout=10)
        assert "w exited with -9" in out.getvalue()
        assert sup.children["w"].restarts == 1
    finally:
        stop.set()
        runner.join(5)
        sup.stop()
    assert not alive(first)


def test_a_child_that_ignores_sigterm_is_killed() -> None:
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('up', flush=True); time.sleep(120)",
    ]
    out = io.StringIO()
    sup = Supervisor([ChildSpec("s", stubborn)], output=out, stop_timeout_s=0.5)
    sup.start()
    wait_until(lambda: "[s] up" in out.getvalue())
    pid = sup.pids()["s"]
    sup.stop()
    assert not alive(pid)
    assert "did not stop; killing it" in out.getvalue()

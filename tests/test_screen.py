"""What `vmpool up` lets through to the terminal: warnings and errors of its children,
once each within a window and at most a burst of them per child; every line in the
child's file whatever reaches the terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from vmpool.local.screen import Screen, is_notable, without_stamp


@pytest.mark.parametrize(
    ("line", "notable"),
    [
        ("2026-12-03 16:13:55,599 18178 INFO rq.worker: Job OK (vmpool-reap_running)", False),
        ('INFO:     127.0.0.1:42496 - "GET /readyz HTTP/1.1" 200 OK', False),
        ("2026-12-03 16:13:55,599 18178 WARNING vmpool.lifecycle: create failed", True),
        ("2026-12-03 16:13:55,599 18178 ERROR rq.worker: [Job x]: exception raised", True),
        ("ERROR:    [Errno 98] error while attempting to bind on address", True),
        ("warning: /tmp/x.yaml: config.vm_lifetme: unknown key, ignored", True),
        ("vmpool: error: cannot reach Redis at redis://127.0.0.1:1/0", True),
        ("Traceback (most recent call last):", True),
    ],
)
def test_notable_lines(line: str, notable: bool) -> None:
    assert is_notable(line) is notable


def test_the_stamp_is_left_out() -> None:
    line = "2026-12-03 16:13:55,599 18178 WARNING vmpool.x: hello"
    assert without_stamp(line) == "WARNING vmpool.x: hello"


def test_only_warnings_reach_the_terminal_once_and_every_line_the_file(tmp_path: Path) -> None:
    now = [0.0]
    out = io.StringIO()
    screen = Screen(out, tmp_path, burst=3, repeat_window_s=60, clock=lambda: now[0])
    screen.child_line("worker-1", "2026-12-03 16:13:55,599 1 INFO rq.worker: Job OK")
    for _ in range(5):
        screen.child_line("worker-1", "2026-12-03 16:13:55,599 1 WARNING vmpool: same thing")
    shown = out.getvalue().splitlines()
    assert len(shown) == 1 and shown[0].endswith("[worker-1] WARNING vmpool: same thing")
    now[0] = 61.0  # the window is over: the same warning is shown again
    screen.child_line("worker-1", "2026-12-03 16:13:55,599 1 WARNING vmpool: same thing")
    assert len(out.getvalue().splitlines()) == 2
    screen.close()
    assert len((tmp_path / "worker-1.log").read_text().splitlines()) == 7


def test_a_flood_of_warnings_is_cut_after_the_burst(tmp_path: Path) -> None:
    out = io.StringIO()
    screen = Screen(out, tmp_path, burst=3, clock=lambda: 0.0)
    for i in range(10):
        screen.child_line("api", f"WARNING: distinct {i}")
    screen.close()
    shown = out.getvalue().splitlines()
    assert len(shown) == 4, shown
    assert "more than 3 warnings within 60s: the others only in" in shown[-1]
    assert str(tmp_path / "api.log") in shown[-1]


def test_verbose_streams_everything_and_quiet_nothing(tmp_path: Path) -> None:
    loud, silent = io.StringIO(), io.StringIO()
    verbose = Screen(loud, tmp_path / "a", verbose=True)
    quiet = Screen(silent, tmp_path / "b", quiet=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for screen in (verbose, quiet):
        screen.child_line("api", "INFO: routine")
        screen.child_line("api", "ERROR: bad")
        screen.event("supervisor", "api exited with 1", notable=True)
        screen.close()
    assert loud.getvalue().count("\n") == 3 and "[api] INFO: routine" in loud.getvalue()
    assert silent.getvalue() == ""
    assert "api exited with 1" in (tmp_path / "b" / "supervisor.log").read_text()


class _ClosedPipe(io.StringIO):
    """A terminal whose reader went away (`vmpool up | head` once head is done)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_terminal_is_said_once_and_never_written_again(tmp_path: Path) -> None:
    """The write that meets EPIPE tells on_gone (`vmpool up` then stops everything) and
    raises nothing in the thread that wrote (a child's reader thread: it went on reading
    into the log files); the log files still get every line."""
    gone: list[bool] = []
    screen = Screen(_ClosedPipe(), tmp_path)
    screen.on_gone = lambda: gone.append(True)
    screen.say("vmpool is up")
    screen.child_line("api", "2026-12-03 16:13:55,599 1 WARNING x: y")
    screen.event("supervisor", "api exited", notable=True)
    assert gone == [True] and screen.gone
    assert "WARNING x: y" in (tmp_path / "api.log").read_text()
    screen.close()

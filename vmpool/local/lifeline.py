"""What ties the processes of `vmpool up` to it, and finds what a killed run left behind.

- :func:`die_with_parent`: run in a child before its program starts (``preexec_fn``), it
  asks Linux for SIGTERM when the process that started it dies, however it dies
  (SIGKILL, a closed terminal): the children and the embedded Redis stop with it.
- :func:`stamp` / :func:`stamp_alive`: a process's identity that survives pid reuse (its
  pid and start time), written into a directory it owns. A directory whose owner is no
  longer alive is a dead run's leftover (:func:`vmpool.local.redis_server.clean_leftovers`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["PRCTL_AVAILABLE", "die_with_parent", "preexec", "stamp", "stamp_alive"]

PR_SET_PDEATHSIG = 1
PRCTL_AVAILABLE = sys.platform.startswith("linux")


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask for SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` for a child that must not outlive this process (None off Linux).

    The kernel ties the child to the thread that starts it: start such children from
    the main thread."""
    return die_with_parent if PRCTL_AVAILABLE else None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return None if fields[0] == "Z" else fields[19]


def stamp(pid: int | None = None) -> str:
    """``<pid> <start time>`` of a process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid} {_start_time(pid) or '?'}"


def stamp_alive(text: str) -> bool:
    """Whether the process a :func:`stamp` names still runs (the same one, not a reuse).

    An unreadable stamp counts as alive: nothing of an unknown owner is removed."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit():
        return True
    if not Path("/proc").is_dir():
        return True  # no /proc: cannot tell
    return _start_time(int(parts[0])) == parts[1]

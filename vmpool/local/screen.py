"""What `vmpool up` shows on the terminal while the fleet runs, and what goes to files.

Every child's whole output goes to its own file in the run directory (``api.log``,
``worker-1.log``, ...). The supervisor's own events go to ``supervisor.log``. The
terminal gets only what needs a person: a child's warnings and errors, a child that
exits, and (when asked) a one-line summary now and then. Routine lines (a sweep ran, a
job completed) never reach it unless ``-v`` streams everything.

A terminal that closes (EPIPE: ``vmpool up | head``) is told to ``on_gone`` once, and
nothing more is written to it; `vmpool up` then stops everything as Ctrl-C does.

A warning repeated by every sweep must not become the flood it replaces: a line already
shown is not shown again within ``repeat_window_s``, and past ``burst`` notable lines
of one child in that window its further ones stay in its file (said once).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Final

from vmpool.state.store import Store
from vmpool.state.transitions import RequestStatus, VMState

__all__ = ["NOTABLE", "Screen", "fleet_summary", "is_notable", "without_stamp"]

# A log line's level as Python's logging, uvicorn and the vmpool CLI write it.
NOTABLE: Final = re.compile(
    r"\b(?:WARNING|ERROR|CRITICAL|FATAL)\b|^(?:warning|vmpool: error|error):|^Traceback \("
)
# The start of a line written with vmpool's log format: date, time, pid.
_STAMP: Final = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\s+(?:\d+\s+)?")


def is_notable(line: str) -> bool:
    """Is this line a warning or an error (what the terminal shows)?"""
    return bool(NOTABLE.search(line[:200]))


def without_stamp(line: str) -> str:
    """The line without its leading timestamp and pid (the screen prints its own time)."""
    return _STAMP.sub("", line, count=1)


class Screen:
    """The terminal of `vmpool up`, and the run directory's log files.

    ``child_line`` and ``event`` are called from the supervisor's reader threads. Every
    write is under one lock.
    """

    def __init__(
        self,
        out: IO[str],
        log_dir: Path,
        *,
        verbose: bool = False,
        quiet: bool = False,
        repeat_window_s: float = 60.0,
        burst: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.log_dir = log_dir
        self.verbose = verbose
        self.quiet = quiet  # the demo: its report only, the children's lines in files
        self.repeat_window_s = repeat_window_s
        self.burst = burst
        self.clock = clock
        self._lock = threading.Lock()
        self._files: dict[str, IO[str]] = {}
        self._last_shown: dict[str, float] = {}  # a shown line -> when
        self._window: dict[str, tuple[float, int]] = {}  # child -> window start, lines
        self.gone = False  # the terminal closed (a write failed): nothing more is shown
        self.on_gone: Callable[[], None] | None = None  # told once when it closes

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _file(self, name: str) -> IO[str]:
        handle = self._files.get(name)
        if handle is None:
            handle = self._files[name] = self.log_path(name).open("a", encoding="utf-8")
        return handle

    def child_line(self, name: str, line: str) -> None:
        """One line of a child's output: to its file. To the terminal when it matters."""
        with self._lock:
            handle = self._file(name)
            handle.write(line + "\n")
            handle.flush()
            if self.verbose:
                self._show(f"[{name}] {line}")
            elif not self.quiet and is_notable(line) and self._admit(name, without_stamp(line)):
                self._show(f"{time.strftime('%H:%M:%S')} [{name}] {without_stamp(line)}")

    def event(self, name: str, line: str, *, notable: bool) -> None:
        """One of the supervisor's own events.

        To supervisor.log. To the terminal when notable (a child exited, a child would not
        stop) or with ``-v``."""
        with self._lock:
            handle = self._file("supervisor")
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{name}] {line}\n")
            handle.flush()
            if self.verbose or (notable and not self.quiet):
                self._show(f"{time.strftime('%H:%M:%S')} [{name}] {line}")

    def say(self, line: str) -> None:
        """A line of `vmpool up` itself (the summary, a notice): always shown."""
        with self._lock:
            self._show(line)

    def seen(self, text: str) -> None:
        """``text`` was just said elsewhere: a child saying it too is not shown."""
        with self._lock:
            self._last_shown[text] = self.clock()

    def _admit(self, name: str, text: str) -> bool:
        """Show this notable line? Not a repeat within the window, nor past the burst."""
        now = self.clock()
        if now - self._last_shown.get(text, -self.repeat_window_s) < self.repeat_window_s:
            return False
        start, shown = self._window.get(name, (now, 0))
        if now - start >= self.repeat_window_s:
            start, shown = now, 0
        self._window[name] = (start, shown + 1)
        if shown == self.burst:
            self._show(
                f"[{name}] more than {self.burst} warnings within {self.repeat_window_s:g}s:"
                f" the others only in {self.log_path(name)}"
            )
        if shown >= self.burst:
            return False
        if len(self._last_shown) > 1000:  # forget what left the window long ago
            self._last_shown = {
                seen: at for seen, at in self._last_shown.items() if now - at < self.repeat_window_s
            }
        self._last_shown[text] = now
        return True

    def _show(self, line: str) -> None:
        """To the terminal, unless it is gone: then ``on_gone`` once, and no more writes.

        A closed terminal or pipe (``vmpool up | head`` once head has its lines) is EPIPE
        on a write: not a crash of the thread that wrote."""
        if self.gone:
            return
        try:
            self.out.write(line + "\n")
            self.out.flush()
        except (BrokenPipeError, ValueError, OSError):  # ValueError: the stream was closed
            self.gone = True
            if self.on_gone is not None:
                self.on_gone()

    def close(self) -> None:
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


def fleet_summary(
    store: Store, pools: Sequence[str], *, processes_up: int, processes: int, restarts: int
) -> str:
    """The periodic one line of `vmpool up --summary`: requests, VMs, processes."""
    vms: Counter[str] = Counter()
    for states in store.pool_counts(pools).values():
        vms.update(states)
    pipe = store.redis.pipeline(transaction=False)
    pipe.zcard(store.keys.open_requests)
    pipe.hgetall(store.keys.requests_finished)
    open_requests, finished = pipe.execute()
    done = {_text(k): int(v) for k, v in finished.items()}
    ready, failed, deleted = (
        done.get(status, 0)
        for status in (RequestStatus.READY, RequestStatus.FAILED, RequestStatus.DELETED)
    )
    booting = vms[VMState.RESERVED] + vms[VMState.PENDING]
    return (
        f"{time.strftime('%H:%M:%S')} requests: {open_requests} open, {ready} ready,"
        f" {failed} failed, {deleted} deleted | VMs: {booting} booting,"
        f" {vms[VMState.READY]} ready, {vms[VMState.RUNNING]} running,"
        f" {vms[VMState.COMPLETED]} to destroy | processes:"
        f" {processes_up}/{processes} up, {restarts} restarts"
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

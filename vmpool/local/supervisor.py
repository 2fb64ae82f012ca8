"""One supervisor for the processes of `vmpool up`: start, prefix logs, restart, stop.

Each child is its own OS process (a worker here is what a pod would be in Kubernetes).
A child that dies is restarted after a backoff that doubles up to a cap and resets once
the child has stayed up for a while. Children run in their own sessions, so a Ctrl-C
reaches only the supervisor, which then stops them in order. On Linux each child also
asks the kernel for SIGTERM should the supervisor itself die (PR_SET_PDEATHSIG), so no
process is left behind either way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Protocol

from vmpool.local.lifeline import preexec

log = logging.getLogger(__name__)


@dataclass
class ChildSpec:
    """What to run: ``argv`` with ``env`` added to the supervisor's environment."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


class Sink(Protocol):
    """Where the children's lines and the supervisor's events go (vmpool.local.screen)."""

    def child_line(self, name: str, line: str) -> None: ...

    def event(self, name: str, line: str, *, notable: bool) -> None: ...


@dataclass
class Child:
    spec: ChildSpec
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    exits: int = 0
    backoff_s: float = 0.0
    next_start_at: float = 0.0
    pump: threading.Thread | None = None
    # its last lines, for the one line that says why it exited
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    def last_line(self) -> str:
        """Its last line that says something (a traceback ends with the exception)."""
        return next((line.strip() for line in reversed(self.tail) if line.strip()), "")


class Supervisor:
    """Starts children, restarts the ones that die, and stops them all.

    ``output`` receives every child's output, each line prefixed with ``[name]``. With
    a ``sink`` instead, the lines and the supervisor's events go there (files and a
    quiet terminal: vmpool.local.screen).
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        output: IO[str] | None = None,
        sink: Sink | None = None,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 15.0,
        stable_after_s: float = 30.0,
        stop_timeout_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = {spec.name: Child(spec) for spec in specs}
        self.output = output or sys.stdout
        self.sink = sink
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.stop_timeout_s = stop_timeout_s
        self.clock = clock
        self._write_lock = threading.Lock()
        self._stopping = threading.Event()

    # -- output -------------------------------------------------------------------------
    def say(self, name: str, line: str, *, notable: bool = False) -> None:
        """An event of the supervisor's (``name`` is whom it is about, or "supervisor")."""
        if self.sink is not None:
            self.sink.event(name, line, notable=notable)
            return
        with self._write_lock:
            self.output.write(f"[{name}] {line}\n")
            self.output.flush()

    def _pump(self, child: Child, stream: IO[bytes]) -> None:
        name = child.spec.name
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip()
            child.tail.append(line)
            if self.sink is not None:
                self.sink.child_line(name, line)
            else:
                self.say(name, line)
        stream.close()

    # -- lifecycle ----------------------------------------------------------------------
    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.spec.env, "PYTHONUNBUFFERED": "1"}
        child.process = subprocess.Popen(
            list(child.spec.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec(),
        )
        child.started_at = self.clock()
        assert child.process.stdout is not None
        child.pump = threading.Thread(
            target=self._pump, args=(child, child.process.stdout), daemon=True
        )
        child.pump.start()
        self.say("supervisor", f"started {child.spec.name} (pid {child.process.pid})")

    def start(self) -> None:
        for child in self.children.values():
            self._spawn(child)

    def poll(self) -> list[str]:
        """Restart children that died (after their backoff). Return the names restarted."""
        restarted = []
        now = self.clock()
        for child in self.children.values():
            proc = child.process
            if self._stopping.is_set():
                break
            if proc is not None and proc.poll() is None:
                if now - child.started_at > self.stable_after_s:
                    child.backoff_s = 0.0  # it stayed up: the next death restarts fast
                continue
            if proc is not None:
                code = proc.returncode
                child.process = None
                child.exits += 1
                child.backoff_s = min(
                    self.backoff_max_s, max(self.backoff_initial_s, child.backoff_s * 2)
                )
                child.next_start_at = now + child.backoff_s
                if child.pump is not None:
                    child.pump.join(timeout=1)  # its last lines, before saying why it exited
                last = child.last_line()
                self.say(
                    "supervisor",
                    f"{child.spec.name} exited with {code}; restarting in {child.backoff_s:.1f}s"
                    + (f" (its last line: {last})" if last else ""),
                    notable=True,
                )
            if child.process is None and now >= child.next_start_at:
                child.restarts += 1
                self._spawn(child)
                restarted.append(child.spec.name)
        return restarted

    def run(self, until: threading.Event, interval_s: float = 0.2) -> None:
        """Supervise until ``until`` is set (a signal handler or the demo sets it)."""
        while not until.wait(interval_s):
            self.poll()

    def pids(self) -> dict[str, int]:
        return {
            name: child.process.pid
            for name, child in self.children.items()
            if child.process is not None and child.process.poll() is None
        }

    def stop(self) -> None:
        """SIGTERM every child, wait, SIGKILL what is left. No process stays behind."""
        self._stopping.set()
        live = [c for c in self.children.values() if c.process and c.process.poll() is None]
        for child in live:
            assert child.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = self.clock() + self.stop_timeout_s
        for child in live:
            assert child.process is not None
            try:
                child.process.wait(max(0.1, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                self.say("supervisor", f"{child.spec.name} did not stop; killing it", notable=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait(5)
        for child in self.children.values():
            if child.pump is not None:
                child.pump.join(timeout=2)
        self.say("supervisor", "all children stopped")

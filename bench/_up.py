"""The fleet as ``vmpool up`` runs it, for the benchmarks (a helper, not a benchmark).

:class:`Up` starts ``vmpool up --workers N`` with a config text in a directory of its
own (the run's logs in it too), on its embedded Redis or on a given one, waits until it
says it is up (the API, every worker and the scheduler healthy), and stops it as Ctrl-C
does: SIGINT to its process group, SIGKILL to that group if it is not gone in a minute.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from vmpool.local.redis_server import free_port

BIN = Path(sys.executable).parent
UP_LINE = "vmpool is up:"
TICK = os.sysconf("SC_CLK_TCK")


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s; exit the benchmark with ``what`` on the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return found


def cpu_seconds(stat: str) -> float:
    """The user + system CPU seconds in a /proc/<pid>/stat text."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


class Up:
    """``vmpool up`` in its own process group, its config ``config`` (YAML text).

    ``redis_url``: the Redis to run on (VMPOOL_REDIS_URL); None: its embedded one.
    After the start: ``port`` (the API's), ``redis_url`` (the one it runs on) and
    ``pid`` (of ``vmpool up``, the root of its process tree).
    """

    def __init__(
        self, config: str, *, workers: int = 2, redis_url: str | None = None, tag: str = "up"
    ) -> None:
        self.work = Path(tempfile.mkdtemp(prefix=f"vmpool-bench-{tag}-"))
        (self.work / "vmpool.yaml").write_text(config)
        self.port = free_port()
        env = dict(os.environ)
        env.pop("VMPOOL_REDIS_URL", None)
        if redis_url is not None:
            env["VMPOOL_REDIS_URL"] = redis_url
        self.log = (self.work / "up.log").open("wb")
        self.proc = subprocess.Popen(
            [str(BIN / "vmpool"), "up", "--config", str(self.work / "vmpool.yaml"),
             "--port", str(self.port), "--workers", str(workers),
             "--log-dir", str(self.work / "logs")],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
        self.pid = self.proc.pid
        try:
            wait_for(lambda: UP_LINE in self.text() or self.proc.poll() is not None, 120, "up")
            match = re.search(rf"{UP_LINE} API \S+\s+Redis (redis://\S+)", self.text())
            if match is None:
                raise SystemExit(f"vmpool up did not start:\n{self.text()[-2000:]}")
            self.redis_url = match.group(1)
            wait_for(self.answers, 60, "the API")
        except BaseException:
            self.stop()
            raise

    def text(self) -> str:
        """What ``vmpool up`` printed so far."""
        return (self.work / "up.log").read_text(errors="replace")

    def answers(self) -> bool:
        """Whether the API answers /healthz with 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self, *, keep: bool = False) -> None:
        """Stop the fleet (its process group); its directory removed unless ``keep``."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        if not keep:
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> Up:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep=exc is not None)

"""Helpers shared by the tests that start processes: their output collected by a reader
thread; a server process waited for until it, and not another process, answers; the
directory a killed run left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path

import httpx

from vmpool.local.lifeline import stamp
from vmpool.local.redis_server import DIR_PREFIX, OWNER_FILE

from storehelp import wait_until


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


def listening_inodes(port: int) -> set[int]:
    """The inodes of the sockets listening on TCP ``port`` (any address; /proc/net)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(int(inode))
    return inodes


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port``."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    return True
    return False


def wait_serving(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Path,
    *,
    path: str = "/readyz",
    timeout: float = 30,
) -> str:
    """The URL of the server ``proc`` once it answers ``path`` on 127.0.0.1:``port``.

    Fails, with the end of the server's ``log``, when ``proc`` exits, or when the answer
    comes from a socket another process listens on: the port ``free_port`` gave was
    bound by someone else before ``proc`` bound it (``proc`` then cannot listen, and the
    other server would answer the test's requests)."""
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        assert proc.poll() is None, f"the server exited with {proc.returncode}: {_tail(log)}"
        try:
            answered = httpx.get(url + path, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False
        if answered and not listens_on(proc.pid, port):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)  # ours cannot listen: its log says so as it exits
            raise AssertionError(
                f"{url} answered {path}, but not from our server (pid {proc.pid}, exit"
                f" code {proc.returncode}): another process listens on port {port}; our"
                f" server's log: {_tail(log)}"
            )
        return answered

    wait_until(serving, timeout=timeout, step=0.2)
    return url


def _tail(log: Path, size: int = 4000) -> str:
    return log.read_text(errors="replace")[-size:] if log.exists() else f"(no {log})"


def killed_run_dir(root: Path) -> Path:
    """A server directory under ``root`` whose owner is dead, as a killed `vmpool up`
    leaves one (its owner stamp names a process that has exited)."""
    left = root / (DIR_PREFIX + "killed")
    left.mkdir()
    owner = subprocess.Popen(["sleep", "60"])
    (left / OWNER_FILE).write_text(stamp(owner.pid))
    owner.kill()
    owner.wait(10)
    return left

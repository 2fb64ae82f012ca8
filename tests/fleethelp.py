"""A fleet of real processes for a test: `vmpool api` (each on its own loopback port),
`vmpool worker`, `vmpool scheduler`, against the test's Redis and a config file, and a
client that speaks to the APIs as vmfloaty does.

Every process is started in its own session, bounded by the test's deadlines, and
SIGKILLed by its pid at the end (:meth:`ProcessFleet.stop`). Used by the quota and
priority tests (tests/test_fair_service_processes.py) and the chaos soak's quota phase.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from vmpool.local.redis_server import free_port

from processhelp import wait_serving

API = "/api/v3"


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    """Poll ``pred`` until true; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


@dataclass
class ProcessFleet:
    """The processes of one test's fleet, by label, and the APIs' base URLs."""

    tmp: Path
    redis_url: str
    config_path: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    apis: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "VMPOOL_REDIS_URL": self.redis_url,
            "VMPOOL_CONFIG": str(self.config_path),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, label: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{label}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "vmpool.cli.main", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[label] = proc
        return proc

    def api(self, label: str) -> str:
        """One `vmpool api` process on a port of its own; its base URL once it is ready."""
        port = free_port()
        proc = self.start(label, "api", "--port", str(port), "--log-level", "warning")
        url = wait_serving(proc, port, self.tmp / f"{label}.log", timeout=60)
        self.apis.append(url)
        return url

    def worker(self, label: str) -> subprocess.Popen[bytes]:
        return self.start(label, "worker", "--name", f"{label}-{uuid.uuid4().hex[:6]}")

    def scheduler(self, label: str) -> subprocess.Popen[bytes]:
        return self.start(label, "scheduler", "--interval", "0.2")

    @contextlib.contextmanager
    def paused(self, *labels: str) -> Iterator[None]:
        """The processes ``labels`` stopped (SIGSTOP to the group each leads) for the
        block, then continued: nothing they run moves meanwhile."""
        groups = [self.procs[label].pid for label in labels]
        for group in groups:
            os.killpg(group, signal.SIGSTOP)
        try:
            yield
        finally:
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGCONT)

    def log(self, label: str) -> str:
        return (self.tmp / f"{label}.log").read_text(errors="replace")

    def alive(self) -> None:
        """Fail at once, with its log's tail, when a process of the fleet has exited."""
        for label, proc in self.procs.items():
            code = proc.poll()
            assert code is None, f"{label} exited with {code}:\n{self.log(label)[-4000:]}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the group this fleet started
        for proc in self.procs.values():
            proc.wait(timeout=10)


class Client:
    """A vmpooler client of the fleet's APIs (X-AUTH-TOKEN), taking them in turn."""

    def __init__(self, fleet: ProcessFleet, token: str) -> None:
        self.fleet = fleet
        self.headers = {"X-AUTH-TOKEN": token}
        self._turn = 0

    def _base(self) -> str:
        self._turn += 1
        return self.fleet.apis[self._turn % len(self.fleet.apis)] + API

    def post(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self._base()}/ondemandvm", json=body, headers=self.headers, timeout=20)

    def request(self, pool: str, priority: int | None = None) -> str:
        body: dict[str, Any] = {pool: 1}
        if priority is not None:
            body["priority"] = priority
        reply = self.post(body)
        assert reply.status_code == 201, reply.text
        return str(reply.json()["request_id"])

    def get(self, rid: str) -> dict[str, Any]:
        reply = httpx.get(f"{self._base()}/ondemandvm/{rid}", headers=self.headers, timeout=20)
        assert reply.status_code in (200, 202), reply.text
        body: dict[str, Any] = reply.json()
        return body

    def delete(self, rid: str) -> None:
        url = f"{self._base()}/ondemandvm/{rid}"
        reply = httpx.delete(url, headers=self.headers, timeout=20)
        assert reply.status_code == 200, reply.text

    def checkout(self, pool: str) -> httpx.Response:
        return httpx.post(f"{self._base()}/vm/{pool}", headers=self.headers, timeout=20)

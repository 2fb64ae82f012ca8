"""moto's EC2 server as a real process on a free loopback port (tests only).

``MotoServer.start()`` runs ``python -m moto.server`` bound to 127.0.0.1, waits (with a
deadline) until it answers, and ``stop()`` kills it by pid. ``reset()`` empties it
between tests (moto's own ``/moto-api/reset``). The provider options for it set the
endpoint and dummy credentials; moto accepts any.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class MotoServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, log: Path, timeout_s: float = 30.0) -> MotoServer:
        port = free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        server = cls(proc, port, log)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"moto exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{server.url}/moto-api/", timeout=1):
                    return server
            except OSError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise AssertionError("moto did not answer in time") from None
                time.sleep(0.1)

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def options(self, **extra: Any) -> dict[str, Any]:
        return {"endpoint": self.url, "access_key_id": "AKIDMOTO",
                "secret_access_key": "moto-secret", "region": "us-east-1",
                "ready_check": "state", "backoff": 0.05, **extra}


def boto_ec2(server: MotoServer) -> Any:
    """A boto3 EC2 client on the server, for launching someone else's instances."""
    import boto3

    return boto3.client("ec2", region_name="us-east-1", endpoint_url=server.url,
                        aws_access_key_id="AKIDMOTO", aws_secret_access_key="moto-secret")

"""moto's EC2 server as a real process on a free loopback port (tests only).

``MotoServer.start()`` runs ``python -m moto.server`` bound to 127.0.0.1, with moto's
AMI and instance-type validation on (a missing image or type is refused in EC2's words,
as a real account would), waits (with a deadline) until it answers, and ``stop()``
kills it by pid. ``reset()`` empties it
between tests (moto's own ``/moto-api/reset``). The provider options for it set the
endpoint and dummy credentials; moto accepts any.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmpool.local.redis_server import free_port


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
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={
                    **os.environ,
                    "MOTO_ENABLE_AMI_VALIDATION": "true",
                    "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION": "true",
                },
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
        return {
            "endpoint": self.url,
            "access_key_id": "AKIDMOTO",
            "secret_access_key": "moto-secret",
            "region": "us-east-1",
            "ready_check": "state",
            "backoff": 0.05,
            **extra,
        }


def boto_ec2(server: MotoServer) -> Any:
    """A boto3 EC2 client on the server, for launching someone else's instances."""
    import boto3

    return boto3.client(
        "ec2",
        region_name="us-east-1",
        endpoint_url=server.url,
        aws_access_key_id="AKIDMOTO",
        aws_secret_access_key="moto-secret",
    )


class FaultProxy:
    """A loopback HTTP proxy in front of moto that answers the first ``refuse`` calls of
    ``action`` (an EC2 Action, e.g. RunInstances) with ``status`` and ``body`` (a cloud
    error in the cloud's own shape), then passes every call through. ``refused`` counts
    the calls it answered itself. ``start()`` serves in a thread; ``stop()`` ends it."""

    def __init__(self, upstream: str, action: str, refuse: int, status: int, body: str) -> None:
        import http.server
        import threading

        self.upstream = urllib.parse.urlsplit(upstream)
        self.action, self.refuse, self.status, self.body = action, refuse, status, body
        self.refused = 0
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                proxy.handle(self, self.rfile.read(length))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def _refuses(self, handler: Any, body: bytes) -> bool:
        query = urllib.parse.urlsplit(handler.path).query
        params = urllib.parse.parse_qs(query) | urllib.parse.parse_qs(body.decode(errors="replace"))
        if params.get("Action", [""])[0] != self.action:
            return False
        with self.lock:
            if self.refused >= self.refuse:
                return False
            self.refused += 1
            return True

    def handle(self, handler: Any, body: bytes) -> None:
        import http.client

        if self._refuses(handler, body):
            status, payload = self.status, self.body.encode()
            headers = {"Content-Type": "text/xml"}
        else:
            up = self.upstream
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
            skip = ("host", "content-length", "connection")
            forward = {k: v for k, v in handler.headers.items() if k.lower() not in skip}
            forward["Host"] = handler.headers.get("Host", "")
            conn.request(handler.command, handler.path, body=body or None, headers=forward)
            reply = conn.getresponse()
            status, payload = reply.status, reply.read()
            headers = {
                k: v
                for k, v in reply.getheaders()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            conn.close()
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

"""`vmpool api --forwarded-allow-ips`: behind a proxy, limits count per real client.

Behind an ingress every connection comes from the proxy, so the per-address limit of
failed logins would be one count shared by every client. With the proxy's address
trusted, the client's address comes from X-Forwarded-For: one client locked out does
not lock out the next. The API runs as a process (`vmpool api`, the command the
manifests run), on loopback, killed by its pid at the end; this test connects from
127.0.0.1, which plays the proxy.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.local.redis_server import free_port

from apihelp import PASSWORD_HASH
from processhelp import wait_serving

CONFIG = f"""
:providers:
  :simulated: {{boot_seconds: 1}}
:pools:
  - {{name: deb, template: deb, provider: simulated}}
:auth:
  provider: static
  users: {{alice: "{PASSWORD_HASH}"}}
  max_failed_logins_per_address: 2
  max_failed_logins_per_user: 1000
"""


def failed_login(base: str, client: str) -> int:
    """POST /api/v3/token with a wrong password, as forwarded for ``client``."""
    request = urllib.request.Request(f"{base}/api/v3/token", method="POST", data=b"")
    token = base64.b64encode(b"alice:wrong-password").decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("X-Forwarded-For", client)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextlib.contextmanager
def api(tmp_path: Path, redis_url: str, trusted: str) -> Iterator[str]:
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG)
    port = free_port()
    env = {**os.environ, "VMPOOL_CONFIG": str(config), "VMPOOL_REDIS_URL": redis_url}
    args = ["api", "--port", str(port), "--forwarded-allow-ips", trusted]
    log = (tmp_path / f"api-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        yield wait_serving(proc, port, tmp_path / f"api-{port}.log", path="/healthz")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_trusted_proxy_gives_each_client_its_own_limit(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    with api(tmp_path, redis_url, "127.0.0.1/32") as base:
        assert [failed_login(base, "203.0.113.7") for _ in range(2)] == [401, 401]
        assert failed_login(base, "203.0.113.7") == 429, "the limit of 203.0.113.7"
        assert failed_login(base, "203.0.113.8") == 401, "another client is not locked out"


@pytest.mark.slow
def test_an_untrusted_proxy_shares_one_limit(
    tmp_path: Path, redis_url: str, redis_client: object
) -> None:
    """The same calls with the proxy not trusted: X-Forwarded-For is ignored, every
    call counts for 127.0.0.1, and the second client is refused with the first."""
    with api(tmp_path, redis_url, "192.0.2.1") as base:
        assert [failed_login(base, "203.0.113.7") for _ in range(2)] == [401, 401]
        assert failed_login(base, "203.0.113.8") == 429


@pytest.mark.parametrize("value", ["10.0.0.0/33", "proxy.example", "10.0.0.1,,nope", ","])
def test_a_bad_value_is_a_usage_error_naming_it(value: str) -> None:
    """Exit 2 before anything starts, click's usage error naming the option and the
    item (uvicorn would take a bad item as a name that never matches)."""
    result = CliRunner().invoke(cli, ["api", "--forwarded-allow-ips", value])
    assert result.exit_code == 2, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert "'--forwarded-allow-ips'" in error, error
    assert "Traceback" not in result.output

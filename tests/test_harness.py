"""The test harness under pytest-xdist (tests/conftest.py): given one Redis server
(``VMPOOL_TEST_REDIS_URL``), each worker flushes and uses a database of its own; ports
come from the worker's own range; a server a test starts is waited for until it, not
another process, answers."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import worker_database
from portrange import worker_number

from processhelp import listens_on, wait_serving


@pytest.mark.parametrize(
    ("url", "worker", "expected"),
    [
        ("redis://127.0.0.1:6379/0", 0, "redis://127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0", 3, "redis://127.0.0.1:6379/3"),
        ("redis://:pw@h:6380/2", 1, "redis://:pw@h:6380/3"),
        ("redis://h:6379", 2, "redis://h:6379/2"),
        ("redis://h:6379/", 0, "redis://h:6379/0"),
    ],
)
def test_each_worker_has_a_database_of_its_own(url: str, worker: int, expected: str) -> None:
    assert worker_database(url, worker) == expected


def test_a_url_naming_no_database_number_is_refused() -> None:
    with pytest.raises(pytest.UsageError, match="'db' is not a database number"):
        worker_database("redis://h:6379/db", 1)


@pytest.mark.parametrize(("name", "number"), [("gw0", 0), ("gw7", 7), ("", 0), ("master", 0)])
def test_the_worker_number_comes_from_xdist(
    monkeypatch: pytest.MonkeyPatch, name: str, number: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", name)
    assert worker_number() == number


def test_free_port_hands_out_the_workers_own_range_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: with VMPOOL_PORT_RANGE (each parallel test worker has its own, below the
    ephemeral range), free_port hands out ports of that range only, distinct from one
    call to the next, skipping one that is taken; so a server group picking its ports
    before any binds, another worker, or a client's outgoing connection cannot take the
    same port (an xdist run failed with "Address already in use" before)."""
    import socket

    from vmpool.local import redis_server

    monkeypatch.setenv("VMPOOL_PORT_RANGE", "12000-12004")
    monkeypatch.setattr(redis_server, "_port_turn", [3])  # the next is 12000
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 12001))
        taken.listen()
        ports = [redis_server.free_port() for _ in range(3)]
    assert ports == [12000, 12002, 12003]


def test_a_server_answered_by_another_process_fails_its_wait_naming_it(tmp_path: Path) -> None:
    """Proves: wait_serving (tests/processhelp.py) does not take another process's answer
    on the port for our server's: a foreign HTTP server already listens on the port
    ``free_port`` gave, our server (a stand-in that exits once the foreign server has
    answered) never listens, and the wait fails at once saying so, with our log. A wait
    for the first answer returned, and the test talked to the foreign server."""
    with (tmp_path / "ours.log").open("wb") as log:
        ours = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read(); print('cannot listen')"],
            stdin=subprocess.PIPE,
            stdout=log,
        )

    class Foreign(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            assert ours.stdin is not None
            ours.stdin.close()  # ours exits: it could not listen

        def log_message(self, *args: object) -> None:
            pass

    foreign = http.server.HTTPServer(("127.0.0.1", 0), Foreign)
    port = foreign.server_address[1]
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        assert listens_on(os.getpid(), port) and not listens_on(ours.pid, port)
        with pytest.raises(AssertionError, match="not from our server") as failure:
            wait_serving(ours, port, tmp_path / "ours.log", timeout=10)
        assert f"another process listens on port {port}" in str(failure.value)
        assert "exit code 0" in str(failure.value) and "cannot listen" in str(failure.value)
    finally:
        foreign.shutdown()
        foreign.server_close()
        ours.kill()
        ours.wait(timeout=10)

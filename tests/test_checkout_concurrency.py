"""The checkout acceptance case: 50 concurrent checkouts (POST /api/v3/vm/pool1) against a
pool of 20 ready VMs, through a real ``vmpool api`` with two worker processes. Exactly 20
succeed, 30 get vmpooler's 503 ``{"ok": false}``, no hostname is handed out twice, the
audit is clean; then the warm pool's top-up refills the pool to 20."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from vmpool import lifecycle
from vmpool.config import load_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.local.redis_server import free_port
from vmpool.state.audit import audit_state

from lifecyclehelp import run_dispatched
from processhelp import wait_serving

pytestmark = pytest.mark.slow

SIZE = 20
CLIENTS = 50
CONFIG: dict[str, Any] = {
    "providers": {"simulated": {"boot_seconds": 0, "seed": 3}},
    "config": {"ondemand_clone_limit": 50, "task_limit": 50},
    "pools": [{"name": "pool1", "size": SIZE, "domain": "example.com"}],
}


@pytest.fixture
def two_process_api(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> Iterator[tuple[str, str]]:
    """(API URL, config path) of a ``vmpool api --workers 2`` on a free loopback port."""
    config = tmp_path / "vmpool.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    env = {**os.environ, "VMPOOL_REDIS_URL": redis_url, "VMPOOL_CONFIG": str(config)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "api", "--port", str(port),
         "--workers", "2", "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield wait_serving(proc, port, tmp_path / "api.log"), str(config)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
            proc.wait(timeout=5)
        log.close()


def test_fifty_checkouts_twenty_ready_two_api_processes(
    two_process_api: tuple[str, str], redis_client: redis.Redis
) -> None:
    """Proves: the claim is one atomic unit across API processes: of 50 checkouts racing
    (released together by a barrier) for 20 ready VMs, exactly 20 get a VM, each a
    different one, and 30 get 503 with nothing handed out; the pool then refills."""
    port_url, config_path = two_process_api
    config = load_config(config_path)
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test")
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    assert len(fleet.store.pool_vms("pool1", "ready")) == SIZE
    barrier = threading.Barrier(CLIENTS)
    results: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=port_url, timeout=30) as http:
            barrier.wait(timeout=30)
            r = http.post("/api/v3/vm/pool1")
            with lock:
                results.append((r.status_code, r.json()))

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == CLIENTS
    ok = [body["pool1"]["hostname"] for status, body in results if status == 200]
    refused = [body for status, body in results if status == 503]
    assert len(ok) == SIZE and len(set(ok)) == SIZE
    assert len(refused) == CLIENTS - SIZE and all(b == {"ok": False} for b in refused)
    assert fleet.store.pool_vms("pool1", "ready") == []
    problems = audit_state(fleet.store, fleet.providers, sweep_interval_s=60, reap_interval_s=60)
    assert not problems, [p.line() for p in problems]
    # the top-up job refills the pool
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    assert len(fleet.store.pool_vms("pool1", "ready")) == SIZE

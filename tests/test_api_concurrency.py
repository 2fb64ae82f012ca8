"""A real ``vmpool api`` (uvicorn, two worker processes) on a free loopback port, hit by
many threads doing POST / DELETE / GET at once while other threads play the workers
(reserve, create and ready VMs through the store). Afterwards: every audit trail has
contiguous versions and allowed transitions, and no deleted request is seen pending or
ready."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from vmpool.local.redis_server import free_port
from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from processhelp import wait_serving

pytestmark = pytest.mark.slow

CONFIG = {
    "config": {"ondemand_request_ttl": 5, "max_ondemand_instances_per_request": 10},
    "pools": [
        {"name": "pool1", "alias": ["alias1"], "domain": "example.com"},
        {"name": "pool2", "alias": ["alias1"], "domain": "example.com"},
    ],
}


@pytest.fixture
def api_server(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[str]:
    config = tmp_path / "vmpool.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    env = {**os.environ, "VMPOOL_REDIS_URL": redis_url, "VMPOOL_CONFIG": str(config)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmpool.cli.main",
            "api",
            "--port",
            str(port),
            "--workers",
            "2",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield wait_serving(proc, port, tmp_path / "api.log")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, by its id
            proc.wait(timeout=5)
        log.close()


def test_parallel_post_delete_get(api_server: str, redis_client: redis.Redis) -> None:
    store = Store(redis_client, Keys("vmpool"))
    created: list[str] = []
    deleted_ok: set[str] = set()
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + 60

    def client_thread(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=api_server + "/api/v3", timeout=20) as http:
            for _ in range(25):
                if time.monotonic() > deadline:
                    return
                op = rng.random()
                if op < 0.45 or not created:
                    if rng.random() < 0.5:
                        r = http.post("/ondemandvm/alias1+alias1+pool1")
                    else:
                        r = http.post("/ondemandvm", content=b'{"alias1": "2", "pool2": 1}')
                    if r.status_code != 201:
                        errors.append(f"POST {r.status_code} {r.text}")
                        continue
                    with lock:
                        created.append(r.json()["request_id"])
                elif op < 0.75:
                    with lock:
                        rid = rng.choice(created)
                    r = http.delete(f"/ondemandvm/{rid}")
                    if r.status_code != 200:
                        errors.append(f"DELETE {r.status_code} {r.text}")
                    elif r.json() == {"ok": True}:
                        with lock:
                            deleted_ok.add(rid)
                else:
                    with lock:
                        rid = rng.choice(created)
                    r = http.get(f"/ondemandvm/{rid}")
                    if r.status_code not in (200, 202):
                        errors.append(f"GET {r.status_code} {r.text}")

    def worker_thread(seed: int) -> None:
        rng = random.Random(seed)
        n = 0
        while not stop.is_set() and time.monotonic() < deadline:
            with lock:
                rid = rng.choice(created) if created else None
            if rid is None:
                time.sleep(0.01)
                continue
            record = store.get_request(rid)
            if record is None or record.status != "pending":
                continue
            for slot in record.slots:
                if slot.live < slot.want:
                    n += 1
                    name = f"w{seed}-{n}"
                    out = store.reserve_vm(
                        rid,
                        name=name,
                        alias=slot.alias,
                        pool=slot.pool,
                        template=slot.pool,
                        provider="simulated",
                        domain="example.com",
                        actor=f"worker{seed}",
                    )
                    if out.ok and store.vm_created(name, actor=f"worker{seed}").code == "pending":
                        store.vm_ready(name, actor=f"worker{seed}")

    clients = [threading.Thread(target=client_thread, args=(i,)) for i in range(12)]
    workers = [threading.Thread(target=worker_thread, args=(100 + i,)) for i in range(4)]
    for t in clients + workers:
        t.start()
    for t in clients:
        t.join(timeout=90)
    stop.set()
    for t in workers:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in clients + workers)
    assert not errors, errors[:5]
    assert len(created) > 50 and deleted_ok

    with httpx.Client(base_url=api_server + "/api/v3", timeout=20) as http:
        for rid in created:
            trail = store.history(rid)
            assert trail, rid
            assert check_trail(rid, trail) == [], (rid, trail)
            statuses = [e.dst for e in trail if e.entity == "request"]
            if "deleted" in statuses:
                assert statuses[-1] == "deleted"
                body = http.get(f"/ondemandvm/{rid}").json()
                assert body["ready"] is False and body["message"] == "The request has been deleted"
            if rid in deleted_ok:
                record = store.get_request(rid)
                assert record is not None and record.status == "deleted"
                for vm in store.request_vms(rid):
                    assert vm.state in ("completed", "destroyed"), vm

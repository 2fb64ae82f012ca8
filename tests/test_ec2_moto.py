"""End to end on moto: the fleet as real processes (`vmpool worker` x2, `vmpool
scheduler`) with a pool on the EC2 provider, against moto's EC2 server (a real process
on loopback, tests/motohelp.py) and a real Redis.

- 10 on-demand requests become ready with instances running in moto, tagged with the
  fleet, pool, request and VM; deleting the requests terminates every instance; an
  instance someone else launched in the same account (untagged, or another fleet's) is
  never touched.
- A worker SIGKILLed in the middle of a create (after RunInstances, before the record)
  leaves no instance behind once its request is deleted and reconcile has run.
- `vmpool up` with the same config, driven through the HTTP API: 10 requests ready
  (hostnames: the instances' addresses, the pool has no domain), deleted, terminated.

Every process is started by the test, bounded by deadlines and SIGKILLed by pid (its
process group: the worker and its work horse) at the end.
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

import pytest
import redis

from vmpool.config import Config, load_config
from vmpool.state.counters import JOBS_METRIC
from vmpool.state.fleet_identity import fleet_identity
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import enqueue

from motohelp import MotoServer, boto_ec2

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :aws:
    provider_class: ec2
    endpoint: {endpoint}
    region: us-east-1
    access_key_id: AKIDMOTO
    secret_access_key: moto-secret
    ready_check: state
    backoff: 0.2
:redis:
  data_ttl: 1
:config:
  ondemand_request_ttl: 2
  timeout: 1
  ondemand_clone_limit: 20
  max_vm_retries: 1
  lock_expire: 2
  reconcile_grace: 5
:schedule:
  provision: 1
  check_pending: 1
  sweep: 1
  reap: 2
  destroy: 1
  reconcile: 2
:pools:
  - {{name: ubuntu, template: ami-12c6146b, size: 0, provider: aws}}
"""


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


@dataclass
class MotoFleet:
    tmp: Path
    redis_url: str
    config: Config
    store: Store
    conn: redis.Redis
    moto: MotoServer
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, label: str, *args: str, env: dict[str, str] | None = None) -> None:
        with (self.tmp / f"{label}.log").open("wb") as log:
            self.procs[label] = subprocess.Popen(
                [sys.executable, "-m", "vmpool.cli.main", *args],
                env={
                    **os.environ,
                    "VMPOOL_REDIS_URL": self.redis_url,
                    "VMPOOL_CONFIG": self.config.source,
                    "PYTHONUNBUFFERED": "1",
                    **(env or {}),
                },
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def worker(self, label: str, env: dict[str, str] | None = None) -> None:
        self.start(label, "worker", "--name", f"{label}-{uuid.uuid4().hex[:6]}", env=env)

    def kill(self, label: str) -> None:
        proc = self.procs[label]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and its work horse
        proc.wait(timeout=10)

    def kill_all(self) -> None:
        for label in self.procs:
            self.kill(label)

    def log(self, label: str) -> str:
        return (self.tmp / f"{label}.log").read_text(errors="replace")

    def request(self, n: int = 1) -> str:
        rid = f"r-{uuid.uuid4().hex[:12]}"
        settings = RequestSettings.from_config(self.config)
        assert self.store.create_request(
            rid, [Slot("ubuntu", "ubuntu", n)], settings, actor="test"
        ).ok
        enqueue(self.conn, self.store.keys, "provision_request", rid)
        return rid

    def status(self, rid: str) -> str:
        record = self.store.get_request(rid)
        return record.status if record else "missing"

    def instances(self) -> list[dict[str, Any]]:
        """Every instance in moto that is not terminated, with its tags as a dict."""
        found = []
        reply = boto_ec2(self.moto).describe_instances()
        for reservation in reply["Reservations"]:
            for instance in reservation["Instances"]:
                if instance["State"]["Name"] not in ("terminated", "shutting-down"):
                    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                    found.append({**instance, "tags": tags})
        return found

    def reconciles(self) -> int:
        """reconcile jobs the workers finished (the worker_jobs counter)."""
        raw = self.store.redis.hget(self.store.keys.metrics(JOBS_METRIC), "reconcile:ok")
        return int(raw or 0)

    def ours(self) -> list[dict[str, Any]]:
        fleet_id = fleet_identity(self.store.redis, self.store.keys)
        return [i for i in self.instances() if i["tags"].get("vmpool-fleet") == fleet_id]


@pytest.fixture
def fleet(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, moto: MotoServer
) -> Iterator[MotoFleet]:
    moto.reset()
    path = tmp_path / "vmpool.yaml"
    path.write_text(CONFIG.format(endpoint=moto.url))
    config = load_config(path)
    conn = redis.Redis.from_url(redis_url)
    store = Store(redis_client, Keys(config.key_prefix))
    f = MotoFleet(tmp_path, redis_url, config, store, conn, moto)
    try:
        yield f
    finally:
        f.kill_all()
        conn.close()


def someone_elses(fleet: MotoFleet) -> set[str]:
    """Launch an untagged instance and another fleet's, as another user of the account."""
    ec2 = boto_ec2(fleet.moto)
    untagged = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)
    other = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "vmpool-fleet", "Value": "another-fleet"},
                    {"Key": "vmpool-vm", "Value": "theirs-1"},
                ],
            }
        ],
    )
    return {untagged["Instances"][0]["InstanceId"], other["Instances"][0]["InstanceId"]}


def test_ten_requests_on_ec2_ready_tagged_then_terminated(fleet: MotoFleet) -> None:
    foreign = someone_elses(fleet)
    fleet.worker("w0")
    fleet.worker("w1")
    fleet.start("s0", "scheduler", "--interval", "0.5")
    rids = [fleet.request() for _ in range(10)]

    wait_for(lambda: all(fleet.status(r) == "ready" for r in rids), 90, "10 requests ready")
    ours = fleet.ours()
    assert len(ours) == 10
    assert all(i["State"]["Name"] == "running" for i in ours)
    assert {i["tags"]["vmpool-request"] for i in ours} == set(rids)
    assert all(i["tags"]["vmpool-pool"] == "ubuntu" for i in ours)
    recorded = {
        vm.name for rid in rids for vm in fleet.store.request_vms(rid) if vm.state == "running"
    }
    assert {i["tags"]["vmpool-vm"] for i in ours} == recorded
    assert all(i["tags"]["Name"] == i["tags"]["vmpool-vm"] for i in ours)

    for rid in rids:
        assert fleet.store.delete_request(rid, actor="test").code == "deleted"
    wait_for(lambda: not fleet.ours(), 60, "every instance of the fleet terminated")
    runs = fleet.reconciles()
    wait_for(lambda: fleet.reconciles() >= runs + 2, 30, "two more reconcile runs")
    still = {i["InstanceId"] for i in fleet.instances()}
    assert foreign <= still, "an instance vmpool did not make was touched"


def test_worker_killed_mid_create_leaves_no_instance(fleet: MotoFleet, tmp_path: Path) -> None:
    """The create's work horse stops right after RunInstances (failpoint), the worker
    is SIGKILLed with it; the request is deleted: reconcile and the destroy path leave
    no instance of the fleet behind, and the foreign instances stand."""
    foreign = someone_elses(fleet)
    once = tmp_path / "stopped-once"
    fleet.worker("w0", env={"VMPOOL_FAILPOINTS": f"create_vm.after_provider=stop@{once}"})
    fleet.start("s0", "scheduler", "--interval", "0.5")
    rid = fleet.request()
    wait_for(lambda: once.exists() and len(fleet.ours()) == 1, 60, "the instance to exist")
    (vm,) = fleet.store.request_vms(rid)
    assert vm.state == "reserved"  # the record never heard of it
    fleet.kill("w0")

    fleet.worker("w1")
    assert fleet.store.delete_request(rid, actor="test").code == "deleted"
    wait_for(lambda: not fleet.ours(), 90, "the orphaned instance terminated")
    runs = fleet.reconciles()
    wait_for(lambda: fleet.reconciles() >= runs + 1, 30, "another reconcile run")
    assert not fleet.ours()
    still = {i["InstanceId"] for i in fleet.instances()}
    assert foreign <= still


def test_vmpool_up_on_ec2_through_the_api(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, moto: MotoServer
) -> None:
    """`vmpool up` with the EC2 pool: 10 requests made and deleted through the HTTP API
    (as a client would), instances running and tagged in moto, then all terminated."""
    import json
    import re
    import urllib.request

    moto.reset()
    config = tmp_path / "vmpool.yaml"
    config.write_text(CONFIG.format(endpoint=moto.url))
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "vmpool.cli.main",
                "up",
                "--config",
                str(config),
                "--redis-url",
                redis_url,
                "--workers",
                "2",
                "--port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )

    def call(method: str, path: str, body: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            api + path, method=method, data=body.encode() if body else None
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    try:
        wait_for(lambda: "vmpool is up" in log.read_text(errors="replace"), 90, "vmpool up")
        found = re.search(r"API (http://\S+)", log.read_text(errors="replace"))
        assert found, log.read_text(errors="replace")
        api = found.group(1)
        rids = [
            call("POST", "/api/v3/ondemandvm", '{"ubuntu": "1"}')[1]["request_id"]
            for _ in range(10)
        ]

        def all_ready() -> bool:
            return all(call("GET", f"/api/v3/ondemandvm/{rid}")[0] == 200 for rid in rids)

        wait_for(all_ready, 90, "10 requests ready through the API")
        hostnames = {
            call("GET", f"/api/v3/ondemandvm/{rid}")[1]["ubuntu"]["hostname"][0] for rid in rids
        }
        ec2 = boto_ec2(moto)
        fleet_id = fleet_identity(redis_client, Keys("vmpool"))

        def running() -> list[dict[str, Any]]:
            reply = ec2.describe_instances(
                Filters=[
                    {"Name": "tag:vmpool-fleet", "Values": [fleet_id]},
                    {"Name": "instance-state-name", "Values": ["pending", "running"]},
                ]
            )
            return [i for r in reply["Reservations"] for i in r["Instances"]]

        instances = running()
        assert len(instances) == 10
        assert {i["PublicIpAddress"] for i in instances} == hostnames  # no domain: the address
        for rid in rids:
            assert call("DELETE", f"/api/v3/ondemandvm/{rid}")[0] == 200
        wait_for(lambda: not running(), 60, "every instance terminated")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

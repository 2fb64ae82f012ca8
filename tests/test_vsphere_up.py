"""`vmpool up` with vSphere pools on govmomi's vCenter simulator, driven through the HTTP
API as a client would (the simulator and `vmpool up` are real processes, killed by pid).

What it proves, end to end: on-demand VMs of a vSphere pool become ready (ready_check:
state), are clones in the pool's folder, on its datastore and cluster, carrying the
fleet's mark (the fleet identity generated in Redis); after DELETE they are destroyed in
vCenter, not just powered off; a VM made by hand in the same folder is never touched,
reconcile runs included; a warm pool fills to its size and refills after a checkout; a
VM of the pool is snapshotted, reverted and given a disk through the API, as vmfloaty's
`snapshot`, `revert` and `modify --disk` ask.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from vmpool.state.counters import JOBS_METRIC
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from vcsimhelp import PASSWORD, TEMPLATE, USER, VCSim, hand_made

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :vsphere:
    server: {server}
    username: {user}
    password: {password}
    insecure: true
    datacenter: DC0
    ready_check: state
    create_folders: true
    backoff: 0.2
:redis:
  data_ttl: 1
:config:
  ondemand_request_ttl: 2
  timeout: 1
  max_vm_retries: 1
  lock_expire: 2
  reconcile_grace: 3
:schedule:
  provision: 1
  check_pending: 0.5
  sweep: 1
  reap: 2
  destroy: 1
  reconcile: 2
  top_up_pools: 1
:pools:
  - {{name: debian-12, provider: vsphere, template: {template}, folder: up/debian-12,
     datastore: LocalDS_1, clone_target: DC0_C0, create_linked_clone: true, size: 0}}
  - {{name: warm, provider: vsphere, template: {template}, folder: up/warm, size: 2}}
"""


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.url + "/api/v3" + path, method=method, data=body.encode() if body else None
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)


def marked(si: Any, folder: str) -> dict[str, Any]:
    """The VMs in DC0/vm/<folder> by name."""
    from pyVmomi import vmodl

    found = si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{folder}")
    vms = {}
    for vm in found.childEntity if found is not None else ():
        try:
            vms[vm.name] = vm
        except vmodl.fault.ManagedObjectNotFound:  # destroyed since the folder was read
            continue
    return vms


def extra(vm: Any) -> dict[str, str]:
    return {o.key: o.value for o in vm.config.extraConfig}


def snapshot_revert_disk(api: Api, store: Store, rid: str, vm: Any) -> None:
    """vmfloaty's `snapshot`, `revert` and `modify --disk` on a VM of the pool, through
    the API (the vm_task jobs call the provider): each lands in vCenter."""
    name = vm.name

    def trail(pattern: str) -> bool:
        return any(re.fullmatch(pattern, entry.reason) for entry in store.history(rid))

    status, body = api("POST", f"/vm/{name}/snapshot")
    assert status == 202 and body["ok"], body
    snapshot = body[name]["snapshot"]
    wait_for(
        lambda: snapshot in api("GET", f"/vm/{name}")[1][name].get("snapshots", []),
        30,
        "the snapshot taken",
    )
    assert [s.name for s in vm.snapshot.rootSnapshotList] == [snapshot]
    assert api("POST", f"/vm/{name}/snapshot/{snapshot}")[0] == 202
    wait_for(lambda: trail(r"revert \S+ done"), 30, "the revert done")
    assert vm.runtime.powerState == "poweredOn"
    status, body = api("POST", f"/vm/{name}/disk/3")
    assert status == 202 and body[name]["disk"] == "+3gb", body
    wait_for(
        lambda: api("GET", f"/vm/{name}")[1][name].get("disk") == ["+3gb"], 30, "the disk added"
    )
    sizes = [d.capacityInKB for d in vm.config.hardware.device if hasattr(d, "capacityInKB")]
    assert 3 * 1024 * 1024 in sizes


def test_vmpool_up_on_vsphere(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis, vcsim: VCSim
) -> None:
    si = vcsim.client()
    si.content.searchIndex.FindByInventoryPath("DC0/vm").CreateFolder("up").CreateFolder(
        "debian-12"
    )
    theirs = hand_made(si, TEMPLATE, "up/debian-12", "hand-made")
    config = tmp_path / "vmpool.yaml"
    config.write_text(
        CONFIG.format(server=vcsim.server, user=USER, password=PASSWORD, template=TEMPLATE)
    )
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
    try:
        found = wait_for(
            lambda: re.search(r"API (http://\S+)", log.read_text(errors="replace")), 90, "vmpool up"
        )
        api = Api(found.group(1))
        rid = api("POST", "/ondemandvm", '{"debian-12": "3"}')[1]["request_id"]
        wait_for(lambda: api("GET", f"/ondemandvm/{rid}")[0] == 200, 60, "3 VMs ready")
        hostnames = api("GET", f"/ondemandvm/{rid}")[1]["debian-12"]["hostname"]
        fleet = redis_client.get(Keys("vmpool").fleet_identity())
        assert fleet is not None
        vms = {n: vm for n, vm in marked(si, "up/debian-12").items() if n != "hand-made"}
        assert sorted(vms) == sorted(hostnames)  # no domain: the hostname is the VM name
        for vm in vms.values():
            assert extra(vm)["guestinfo.vmpool.fleet"] == fleet
            assert extra(vm)["guestinfo.vmpool.request"] == rid
            assert vm.runtime.powerState == "poweredOn"
            assert [ds.name for ds in vm.datastore] == ["LocalDS_1"]
            assert vm.resourcePool.owner.name == "DC0_C0"

        snapshot_revert_disk(api, Store(redis_client, Keys("vmpool")), rid, vms[hostnames[0]])

        # The warm pool filled to 2; a checkout takes one and the pool refills.
        def warm_ready() -> int:
            return int(api("GET", "/status")[1]["pools"]["warm"]["ready"])

        wait_for(lambda: warm_ready() == 2, 60, "the warm pool to fill")
        status, body = api("POST", "/vm/warm")
        assert status == 200 and body["ok"], body
        taken = body["warm"]["hostname"]
        wait_for(lambda: warm_ready() == 2, 60, "the warm pool to refill")
        assert len(marked(si, "up/warm")) == 3
        assert api("DELETE", f"/vm/{taken}")[0] == 200

        assert api("DELETE", f"/ondemandvm/{rid}")[0] == 200
        wait_for(
            lambda: set(marked(si, "up/debian-12")) == {"hand-made"},
            60,
            "the request's VMs destroyed",
        )
        wait_for(lambda: taken not in marked(si, "up/warm"), 60, "the checked-out VM destroyed")
        runs = int(redis_client.hget(Keys("vmpool").metrics(JOBS_METRIC), "reconcile:ok") or 0)
        wait_for(
            lambda: (
                int(redis_client.hget(Keys("vmpool").metrics(JOBS_METRIC), "reconcile:ok") or 0)
                > runs
            ),
            30,
            "another reconcile run",
        )
        assert theirs.runtime.powerState == "poweredOn"
        assert "hand-made" in marked(si, "up/debian-12")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

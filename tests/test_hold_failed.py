"""Failed VMs held for debugging (`hold_failed_minutes`, Nodepool's autohold): a VM
whose ready check failed is kept at its provider, on hold (state `on_hold`), shown in
`vmpool pools`, `/status` and GET /vm/<hostname>; it is never handed out (no checkout,
no request's claim, no slot of its request) and never destroyed before its hold ends;
then the destroy sweep destroys it. In-process against a real Redis and the simulated
provider (its VMs never turn ready here), the recording dispatcher standing in for RQ."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.cli.pools import pool_table
from vmpool.config import Config, parse_config
from vmpool.lifecycle import Fleet
from vmpool.state.capacity import Limits, ProviderCapacity
from vmpool.state.records import RequestSettings, Slot

from apihelp import make_client
from lifecyclehelp import SIM, clean, make_fleet, recorder, run_dispatched
from storehelp import poll

HOLD_MINUTES = 2 / 60  # two seconds
PERIODIC = ("top_up_pools", "check_ready", "check_pending_sweep", "provision_sweep",
            "reap_running", "destroy_sweep", "reconcile", "sweep_expired")  # fmt: skip


def config(pool: dict[str, Any] | None = None, **cfg: Any) -> Config:
    data = {
        ":providers": {SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1,
                             "ready_fail_percent": 100}},
        ":config": {"ondemand_request_ttl": 10, "timeout": 0.2 / 60, "max_vm_retries": 3,
                    **cfg},
        ":pools": [{"name": "debian", "template": "debian-12", "size": 1, "provider": SIM,
                    "domain": "example.com", **(pool or {})}],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


def failed_vm(fleet: Fleet) -> str:
    """The warm pool's first VM, created, then past its timeout: failed."""
    lifecycle.top_up_pools(fleet)
    (name,) = fleet.store.pool_vms("debian", "reserved")
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert poll(lambda: lifecycle.check_pending_vm(fleet, name) == "failed", timeout_s=5)
    return name


@pytest.mark.slow  # it waits out the hold (two seconds)
def test_a_failed_vm_is_held_never_handed_out_then_destroyed(redis_client: redis.Redis) -> None:
    fleet = make_fleet(redis_client, config(hold_failed_minutes=HOLD_MINUTES))
    store = fleet.store
    name = failed_vm(fleet)
    vm = store.get_vm(name)
    assert vm is not None and vm.state == "on_hold" and vm.reason.startswith("timeout")
    assert vm.hold_until is not None and vm.hold_until > store.server_time()
    assert fleet.providers[SIM].get_vm("debian", name) is not None  # kept at the provider
    row = next(r for r in pool_table(store, fleet.config) if r["pool"] == "debian")
    assert row["on_hold"] == 1 and row["completed"] == 0

    # never handed out: not by a checkout, not to a request, not by a racing top-up
    assert not store.pools.checkout(
        {"debian": 1}, owner="", owner_hash="", lifetime_s=60, actor="api"
    ).ok
    assert store.create_request(
        "r1", [Slot("debian", "debian", 1)], RequestSettings(ttl_s=60), actor="api"
    ).ok
    claim = store.pools.claim_for_request("r1", ["debian"], actor="test")
    assert not claim.ok or name not in str(claim)
    assert name not in [v.name for v in store.request_vms("r1")]

    # never destroyed early: the destroy job the failure dispatched is refused, and a
    # round of every periodic job (and what each dispatches) leaves it on hold
    assert ("destroy_vm", name) in recorder(fleet).take()
    assert lifecycle.destroy_vm(fleet, name) == "vm_on_hold"
    assert lifecycle.destroy_sweep(fleet) == 0
    for job in PERIODIC:
        getattr(lifecycle, job)(fleet)
        run_dispatched(fleet)
    vm = store.get_vm(name)
    assert vm is not None and vm.state == "on_hold" and vm.hold_until > store.server_time()
    assert fleet.providers[SIM].get_vm("debian", name) is not None

    # the hold over: the destroy sweep finds it, the VM is destroyed at the provider
    assert poll(lambda: lifecycle.destroy_sweep(fleet) == 1, timeout_s=5)
    run_dispatched(fleet)
    vm = store.get_vm(name)
    assert vm is not None and vm.state == "destroyed"
    assert fleet.providers[SIM].get_vm("debian", name) is None
    trail = [(e.src, e.dst) for e in store.pools.vm_history(name)]
    assert trail[-2:] == [("pending", "on_hold"), ("on_hold", "destroyed")]
    store.delete_request("r1", actor="api")
    run_dispatched(fleet)
    clean(fleet)


def test_a_requests_failed_vm_is_held_and_the_request_retries(redis_client: redis.Redis) -> None:
    """The request's slot is free again at once (a new VM is reserved); the held VM is
    not the request's any more than a completed one would be."""
    fleet = make_fleet(redis_client, config({"size": 0}, hold_failed_minutes=HOLD_MINUTES))
    store = fleet.store
    assert store.create_request(
        "r2", [Slot("debian", "debian", 1)], RequestSettings(ttl_s=60), actor="api"
    ).ok
    (name,) = lifecycle.provision_request(fleet, "r2")
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert poll(lambda: lifecycle.check_pending_vm(fleet, name) == "retry", timeout_s=5)
    vm = store.get_vm(name)
    assert vm is not None and vm.state == "on_hold"
    assert ("provision_request", "r2") in recorder(fleet).take()
    again = lifecycle.provision_request(fleet, "r2")
    assert again and name not in again
    req = store.get_request("r2")
    assert req is not None and req.status == "pending" and req.retries == 1


def test_status_and_get_vm_show_the_hold(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = config(hold_failed_minutes=HOLD_MINUTES)
    name = failed_vm(make_fleet(redis_client, cfg))
    client, _ = make_client(cfg, redis_url)
    assert client.get("/api/v3/status").json()["pools"]["debian"]["on_hold"] == 1
    body = client.get(f"/api/v3/vm/{name}").json()[name]
    assert body["state"] == "on_hold" and body["hold_until"].endswith("+00:00")


def test_a_pool_sets_its_own_hold_and_none_is_the_default(redis_client: redis.Redis) -> None:
    assert config().pools["debian"].hold_failed_s == 0
    own = config({"hold_failed_minutes": 2}, hold_failed_minutes=5)
    assert own.pools["debian"].hold_failed_s == 120
    fleet = make_fleet(redis_client, config())
    name = failed_vm(fleet)
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "completed"  # no hold: destroyed as before
    assert lifecycle.destroy_vm(fleet, name) == "destroyed"


def test_a_held_vm_counts_against_the_providers_max_instances(
    redis_client: redis.Redis,
) -> None:
    """The cloud still holds it: at max_instances 1, a VM on hold leaves no room for
    another (provider_capacity.lua counts the on_hold index with the others)."""
    fleet = make_fleet(redis_client, config(hold_failed_minutes=HOLD_MINUTES))
    failed_vm(fleet)
    capacity = ProviderCapacity(redis_client, fleet.keys, lease_s=60)
    assert not capacity.fits(SIM, Limits(1, 0, {"debian": 1}))
    assert capacity.fits(SIM, Limits(2, 0, {"debian": 1}))

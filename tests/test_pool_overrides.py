"""Runtime pool settings and resets as the workers honour them (vmpool/lifecycle/
overrides.py, the store's pool_reset and reservation scripts), in-process against a real
Redis and the simulated provider, with the recording Dispatcher standing in for RQ."""

from __future__ import annotations

import redis

from vmpool import lifecycle
from vmpool.lifecycle.overrides import reset_pools, revert_setting, set_setting
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store

from apihelp import make_client, spec_config
from lifecyclehelp import clean, filled, make_fleet, run_dispatched, warm_config


def test_a_size_override_grows_the_pool_and_its_delete_shrinks_it(
    redis_client: redis.Redis,
) -> None:
    """Proves: POST /config/poolsize's store operation makes the next top-up fill the
    pool to the new size; its DELETE makes the ready check recycle the excess."""
    fleet = make_fleet(redis_client, warm_config(2))
    assert len(filled(fleet)) == 2
    assert set_setting(fleet.store, fleet.config, "poolsize", {"debian": "4"}, actor="t") == 1
    assert len(filled(fleet)) == 4
    out = revert_setting(fleet.store, fleet.config, "poolsize", "debian", actor="t")
    assert (out.before, out.configured, out.changed) == ("4", "2", True)
    assert lifecycle.check_ready(fleet) == {"pool shrank": 2}
    run_dispatched(fleet)
    assert len(fleet.store.pool_vms("debian", "ready")) == 2
    assert lifecycle.top_up_pools(fleet) == {}
    clean(fleet)


def test_a_reset_replaces_the_ready_vms_and_never_touches_a_checked_out_one(
    redis_client: redis.Redis,
) -> None:
    """Proves: a reset sends every ready VM to destruction (their destroys dispatched),
    leaves the checked-out VM running and held, and the top-up refills the pool with
    VMs of new names."""
    fleet = make_fleet(redis_client, warm_config(3))
    before = set(filled(fleet))
    out = fleet.store.pools.checkout({"debian": 1}, owner="jdoe", owner_hash="", lifetime_s=600,
                               actor="api")  # fmt: skip
    held = out.vms[0][0]
    recycled = reset_pools(fleet.store, ["debian"], actor="t", dispatch=fleet.dispatch)
    assert set(recycled["debian"]) == before - {held}
    vm = fleet.store.get_vm(held)
    assert vm is not None and vm.state == "running" and vm.owner == "jdoe"
    run_dispatched(fleet)  # the destroys
    after = set(filled(fleet))
    assert len(after) == 3 and not after & before
    assert fleet.store.get_vm(held).state == "running"  # type: ignore[union-attr]
    assert any(
        e.reason == "pool reset" for e in fleet.store.pools.vm_history(sorted(before - {held})[0])
    )
    clean(fleet)


def test_a_vm_booting_at_the_reset_never_becomes_ready(redis_client: redis.Redis) -> None:
    """Proves: VMs reserved before a reset (still booting then) go to destruction when
    they boot, not into the ready set; the next top-up replaces them."""
    fleet = make_fleet(redis_client, warm_config(2))
    assert lifecycle.top_up_pools(fleet) == {"debian": 2}  # reserved, creates dispatched
    booting = fleet.store.pool_vms("debian", "reserved")
    reset_pools(fleet.store, ["debian"], actor="t")
    run_dispatched(fleet)
    assert fleet.store.pool_vms("debian", "ready") == []
    for name in booting:
        vm = fleet.store.get_vm(name)
        assert vm is not None and vm.state == "destroyed"
    fresh = filled(fleet)
    assert len(fresh) == 2 and not set(fresh) & set(booting)
    clean(fleet)


def test_a_template_override_is_used_by_the_next_reservation(redis_client: redis.Redis) -> None:
    """Proves: a runtime template resets the pool and every VM made after it (warm and
    on-demand) is made from the new template; its DELETE brings the old one back."""
    fleet = make_fleet(redis_client, warm_config(1))
    old = filled(fleet)
    set_setting(fleet.store, fleet.config, "template", {"debian": "debian-13"}, actor="t",
                dispatch=fleet.dispatch)  # fmt: skip
    run_dispatched(fleet)
    new = filled(fleet)
    assert new != old
    assert fleet.store.get_vms(new)[0].template == "debian-13"
    provider = fleet.providers[fleet.config.pools["debian"].provider]
    assert provider.get_vm("debian", new[0]).template == "debian-13"  # type: ignore[union-attr]
    store = fleet.store
    assert store.create_request("od", [Slot("debian", "debian", 2)], RequestSettings(ttl_s=60),
                                actor="api").ok  # fmt: skip
    lifecycle.provision_request(fleet, "od")
    assert {vm.template for vm in store.request_vms("od")} == {"debian-13"}
    revert_setting(fleet.store, fleet.config, "template", "debian", actor="t")
    run_dispatched(fleet)
    assert store.get_vms(filled(fleet))[0].template == "debian-12"


def test_totalrunning_follows_checkouts_give_backs_and_requests(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: GET /totalrunning counts checked-out VMs and on-demand VMs, and drops a
    VM given back."""
    cfg = warm_config(3)
    fleet = make_fleet(redis_client, cfg)
    filled(fleet)
    client = make_client(cfg, redis_url)[0]
    running = lambda: client.get("/api/v3/totalrunning").json()["running"]  # noqa: E731
    assert running() == 0
    hosts = client.post("/api/v3/vm/debian+debian").json()["debian"]["hostname"]
    assert running() == 2
    assert client.delete(f"/api/v3/vm/{hosts[0]}").status_code == 200
    assert running() == 1
    rid = client.post("/api/v3/ondemandvm/debian+debian").json()["request_id"]
    lifecycle.provision_request(fleet, rid)
    run_dispatched(fleet)
    assert client.get(f"/api/v3/ondemandvm/{rid}").status_code == 200
    assert running() == 3


def test_a_runtime_clone_target_moves_the_backend_weights(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: backend weights follow POST /config/clonetarget's values. vmpooler's spec
    config: "pool2" (a pool on compute2, weight 0, and an alias of pool1 on compute1,
    weight 5) always lands on pool1; with the clone targets swapped, always on pool2."""
    cfg = spec_config()
    client = make_client(cfg, redis_url)[0]
    store = Store(redis_client, Keys())

    def pools_picked() -> set[str]:
        rid = client.post("/api/v3/ondemandvm", json={"pool2": 20}).json()["request_id"]
        record = store.get_request(rid)
        assert record is not None
        return {slot.pool for slot in record.slots}

    assert pools_picked() == {"pool1"}
    targets = {"pool1": "compute2", "pool2": "compute1"}
    set_setting(store, cfg, "clone_target", targets, actor="t")
    assert pools_picked() == {"pool2"}

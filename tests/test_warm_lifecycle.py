"""Warm pools in the lifecycle (vmpool/lifecycle/warm.py): top-up, check_ready, the
on-demand request that takes ready VMs first. In-process against a real Redis and the
simulated provider, with the recording Dispatcher standing in for RQ."""

from __future__ import annotations

import dataclasses
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.state.records import RequestSettings, Slot
from workers.batching import BatchDispatcher

from lifecyclehelp import SIM, clean, filled, make_fleet, run_dispatched, warm_config
from storehelp import wait_until


def test_top_up_fills_the_pool_to_its_size_and_no_further(redis_client: redis.Redis) -> None:
    """Proves: one top-up reserves the whole deficit, the ordinary create and pending
    jobs make the VMs ready, and a second top-up (the pool full) reserves nothing."""
    fleet = make_fleet(redis_client, warm_config(3))
    assert len(filled(fleet)) == 3
    assert lifecycle.top_up_pools(fleet) == {}
    assert fleet.store.pools.warm_counts(["debian"])["debian"] == {"ready": 3, "warming": 0}
    clean(fleet)


def test_two_top_ups_at_once_do_not_overfill(redis_client: redis.Redis) -> None:
    """Proves: two top-up runs that both read the pool empty (two workers) reserve at
    most the size between them: the size is checked inside pool_reserve's unit."""
    fleet_a = make_fleet(redis_client, warm_config(3), actor="worker:a")
    fleet_b = make_fleet(redis_client, warm_config(3), actor="worker:b", seed=8)
    counts = fleet_a.store.pools.warm_counts(["debian"])
    made = 0
    for fleet in (fleet_a, fleet_b):  # both act on the same stale read
        for _ in range(3 - counts["debian"]["ready"] - counts["debian"]["warming"]):
            out = fleet.store.pools.reserve_pool_vm(
                fleet.names(),
                pool="debian",
                template="t",
                provider=SIM,
                domain=None,
                size=3,
                data_ttl_s=60,
                actor=fleet.actor,
            )
            made += out.ok
    assert made == 3
    assert fleet_a.store.pools.warm_counts(["debian"])["debian"]["warming"] == 3


def test_request_takes_ready_vms_and_clones_the_shortfall(redis_client: redis.Redis) -> None:
    """Proves the acceptance case: a request for 3 VMs of a pool with 2 ready takes the 2
    at once and clones 1; its trail shows which came from the pool; the pool refills."""
    fleet = make_fleet(redis_client, warm_config(2))
    ready = filled(fleet)
    assert len(ready) == 2
    store = fleet.store
    assert store.create_request(
        "acc", [Slot("debian", "debian", 3)], RequestSettings(ttl_s=60), actor="api"
    ).ok
    cloned = lifecycle.provision_request(fleet, "acc")
    assert len(cloned) == 1
    trail = store.history("acc")
    from_pool = sorted(e.entity[3:] for e in trail if e.reason == "claimed from the pool")
    reserved = [e.entity[3:] for e in trail if e.dst == "reserved"]
    assert from_pool == sorted(ready) and reserved == cloned
    run_dispatched(fleet)
    req = store.get_request("acc")
    assert req is not None and req.status == "ready"
    assert len(filled(fleet)) == 2  # the pool refilled
    clean(fleet)


def test_ondemand_from_ready_off_clones_everything(redis_client: redis.Redis) -> None:
    """Proves: with the pool's switch off, the request clones all it asked for and the
    ready VMs stay in the pool."""
    fleet = make_fleet(redis_client, warm_config(2, ondemand_from_ready=False))
    ready = filled(fleet)
    assert fleet.store.create_request(
        "off", [Slot("debian", "debian", 2)], RequestSettings(ttl_s=60), actor="api"
    ).ok
    assert len(lifecycle.provision_request(fleet, "off")) == 2
    assert sorted(fleet.store.pool_vms("debian", "ready")) == sorted(ready)


def test_check_ready_recycles_and_top_up_replaces(redis_client: redis.Redis) -> None:
    """Proves: a ready VM gone at the provider fails its check and is destroyed, a VM
    past ready_ttl is recycled, a healthy one stays; the next top-up replaces them."""
    fleet = make_fleet(redis_client, warm_config(2))
    first, second = filled(fleet)
    provider = fleet.providers[SIM]
    provider.destroy_vm("debian", first)  # the VM vanished behind vmpool's back
    assert lifecycle.check_ready(fleet) == {"failed its check": 1}
    run_dispatched(fleet)
    vm = fleet.store.get_vm(first)
    assert vm is not None and vm.state == "destroyed"
    assert fleet.store.pool_vms("debian", "ready") == [second]
    assert len(filled(fleet)) == 2
    aged = make_fleet(redis_client, warm_config(2, ready_ttl=1 / 600))  # 0.1 s
    recycled: list[int] = []

    def recycle() -> bool:
        recycled.append(lifecycle.check_ready(aged).get("ready_ttl", 0))
        return sum(recycled) == 2

    wait_until(recycle)
    run_dispatched(aged)
    assert fleet.store.pool_vms("debian", "ready") == []
    clean(fleet)


def _every_periodic_job(fleet: Fleet) -> None:
    """One round of every periodic job (and what each dispatches)."""
    for job in ("top_up_pools", "check_ready", "check_pending_sweep", "provision_sweep",
                "reap_running", "destroy_sweep", "reconcile", "sweep_expired"):  # fmt: skip
        getattr(lifecycle, job)(fleet)
        run_dispatched(fleet)


def test_ready_vms_of_a_removed_pool_are_recycled_and_destroyed(
    redis_client: redis.Redis,
) -> None:
    """Proves: when a warm pool leaves the config (removed, or renamed: the same for the
    old name), its ready VMs are recycled and destroyed by the periodic jobs, and until
    they are, `vmpool pools` lists the pool and the audit names it. Red before: the
    retired-pool pass skipped ready VMs and check_ready saw configured pools only,
    so after three rounds of every job both VMs were still ready, at the provider, and
    shown nowhere."""
    from vmpool.cli.pools import pool_table
    from vmpool.state.audit import retired_pool_notes

    fleet = make_fleet(redis_client, warm_config(2))
    names = filled(fleet)
    assert len(names) == 2
    renamed = make_fleet(redis_client, warm_config(0))  # the pool is "debian-12" now
    renamed.config = dataclasses.replace(
        renamed.config,
        pools={"debian-12": dataclasses.replace(renamed.config.pools["debian"], name="debian-12")},
    )
    rows = {row["pool"]: row for row in pool_table(renamed.store, renamed.config)}
    assert rows["debian"]["ready"] == 2 and rows["debian"]["size"] is None
    notes = retired_pool_notes(renamed.store, renamed.config.pools)
    assert notes == ["pool debian is not configured: 2 ready; reap_running finishes them"]
    for _ in range(3):
        _every_periodic_job(renamed)
    vms = renamed.store.get_vms(names)
    assert [vm.state for vm in vms] == ["destroyed", "destroyed"], [vm.state for vm in vms]
    assert list(renamed.providers[SIM].inventory()) == []
    assert "debian" not in {row["pool"] for row in pool_table(renamed.store, renamed.config)}
    assert retired_pool_notes(renamed.store, renamed.config.pools) == []
    clean(renamed)


def test_vmpool_pools_lists_a_removed_pool_while_it_has_vms(
    redis_client: redis.Redis, redis_url: str
) -> None:
    from click.testing import CliRunner

    from vmpool.cli.main import cli
    from vmpool.state.keys import Keys
    from vmpool.state.store import Store

    store = Store(redis_client, Keys("vmpool"))
    out = store.pools.reserve_pool_vm("gone-vm-1", pool="gone", template="t", provider=SIM,
                                domain=None, size=1, data_ttl_s=60, actor="test")  # fmt: skip
    assert out.ok
    result = CliRunner().invoke(cli, ["pools", "--redis-url", redis_url])  # the demo config
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("gone ")]
    assert line.split()[:5] == ["gone", "-", "removed", "0", "1"]  # alias, size, ready, pending


def test_a_provision_batch_claims_only_where_a_ready_vm_waits(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a provision batch reads once per claim which lending pools hold a ready
    VM. With the pool's ready VMs all taken, its requests run no claim script (one per
    request before) and clone; with ready VMs waiting, a request of the batch takes
    them first, as provision_request alone does."""
    fleet = make_fleet(redis_client, warm_config(2))
    ready = filled(fleet)
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys)
    claims: list[str] = []
    claim = fleet.store.pools.claim_for_request

    def counted(request_id: str, pools: Any, **kw: Any) -> Any:
        claims.append(request_id)
        return claim(request_id, pools, **kw)

    fleet.store.pools.claim_for_request = counted  # type: ignore[method-assign]
    settings = RequestSettings(ttl_s=60)
    assert fleet.store.create_request("takes", [Slot("d", "debian", 2)], settings, actor="api").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["takes"])
    lifecycle.provision_batch(fleet)
    req = fleet.store.get_request("takes")
    assert req is not None and sorted(req.vm_names) == sorted(ready) and claims == ["takes"]
    rids = [f"clones-{i}" for i in range(3)]
    for rid in rids:
        assert fleet.store.create_request(rid, [Slot("d", "debian", 1)], settings, actor="api").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, rids)
    lifecycle.provision_batch(fleet)
    assert claims == ["takes"]  # the pool had nothing to lend: no claim script
    for rid in rids:
        req = fleet.store.get_request(rid)
        assert req is not None and len(req.vm_names) == 1

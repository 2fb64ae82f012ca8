"""The on-demand lifecycle (vmpool/lifecycle/), run in-process against a real Redis
and the simulated provider, with a recording Dispatcher standing in for RQ."""

from __future__ import annotations

import dataclasses
import random
from types import MappingProxyType
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import Config
from vmpool.ids import VM_NAME_RE, Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers import ProviderVM, SimulatedProvider
from vmpool.state.keys import Keys
from vmpool.state.locks import FencedLock
from vmpool.state.names import NameGenerator, generate_name
from vmpool.state.records import Slot
from vmpool.state.store import Store

from lifecyclehelp import SIM, create_request, make_config, make_fleet, recorder, run_dispatched
from storehelp import poll


def provider(fleet: Fleet) -> SimulatedProvider:
    p = fleet.providers[SIM]
    assert isinstance(p, SimulatedProvider)
    return p


@pytest.fixture
def fleet(redis_client: redis.Redis) -> Fleet:
    return make_fleet(redis_client, make_config())


# -- names -------------------------------------------------------------------------------


def test_hostnames_are_valid_and_seedable() -> None:
    a = [generate_name("ci-", random.Random(3)) for _ in range(2)]
    assert a[0] == a[1]  # the same seed, the same name: no global random state
    gen = NameGenerator("x" * 32, random.Random(4))
    for _ in range(500):
        name = gen()
        assert VM_NAME_RE.fullmatch(name) and len(name) <= 63 and name.startswith("x" * 32)
    with pytest.raises(ValueError):
        NameGenerator("Bad_Prefix")


def test_name_taken_draws_another(fleet: Fleet) -> None:
    """A hostname that exists (a tombstone too) is refused by reserve_vm; provisioning
    draws another name instead of giving up."""
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    clash = NameGenerator(fleet.config.hostname_prefix, random.Random(7))()
    create_request(fleet.store, "r0", [Slot("deb", "debian", 1)], fleet.config)
    taken = fleet.store.reserve_vm(
        "r0", name=clash, alias="deb", pool="debian", template="t", provider=SIM,
        domain=None, actor="t",
    )  # fmt: skip
    assert taken.ok
    fleet.names = NameGenerator(fleet.config.hostname_prefix, random.Random(7))
    names = lifecycle.provision_request(fleet, "r1")
    assert len(names) == 1 and names[0] != clash
    assert fleet.slots.holders() == [names[0]]  # the clashing draw gave its slot back


# -- the happy path ----------------------------------------------------------------------


def test_request_of_three_goes_reserved_pending_running_ready(fleet: Fleet) -> None:
    """A request of 3 VMs in two pools goes reserved -> pending -> running -> ready
    through the lifecycle functions, and turns ready in the same step as its last VM."""
    store = fleet.store
    create_request(store, "r1", [Slot("deb", "debian", 2), Slot("cent", "centos", 1)],
                   fleet.config)  # fmt: skip
    names = lifecycle.provision_request(fleet, "r1")
    assert len(names) == 3 and len(set(names)) == 3
    assert {vm.state for vm in store.get_vms(names)} == {"reserved"}
    assert sorted(recorder(fleet).take()) == sorted(("create_vm", n) for n in names)
    assert fleet.slots.count() == 3
    assert lifecycle.provision_request(fleet, "r1") == []  # idempotent: nothing left

    for name in names:
        assert lifecycle.create_vm(fleet, name) == "pending"
        assert lifecycle.create_vm(fleet, name) == "vm_pending"  # a second run: no-op
    assert {vm.state for vm in store.get_vms(names)} == {"pending"}
    assert fleet.slots.count() == 0  # every create gave its clone slot back
    assert provider(fleet).count() == 3

    outcomes = [lifecycle.check_pending_vm(fleet, name) for name in names]
    assert outcomes == ["running", "running", "fulfilled"]
    req = store.get_request("r1")
    assert req is not None and req.status == "ready"
    hosts = store.hostnames("r1")
    assert sorted(hosts) == ["cent", "deb"]
    assert all(h.endswith(".example.com") for hs in hosts.values() for h in hs)

    history = store.history("r1")
    assert [e.version for e in history] == list(range(1, len(history) + 1))
    for name in names:
        path = [(e.src, e.dst) for e in history if e.entity == f"vm:{name}"]
        assert path == [("none", "reserved"), ("reserved", "pending"), ("pending", "running")]
    req_path = [(e.src, e.dst) for e in history if e.entity == "request"]
    assert req_path == [("none", "pending"), ("pending", "ready")]
    # the request turned ready in the same unit as the last VM: adjacent versions
    last_vm = [e for e in history if e.entity == f"vm:{names[-1]}"][-1]
    assert history[-1].dst == "ready" and history[-1].version == last_vm.version + 1


def test_whole_flow_via_dispatch(fleet: Fleet) -> None:
    create_request(fleet.store, "r1", [Slot("deb", "debian", 3)], fleet.config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["r1"])
    run_dispatched(fleet)
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "ready"
    assert lifecycle.check_request(fleet, "r1") == "request_ready"


# -- the clone limit -------------------------------------------------------------------


def test_clone_limit_holds_across_two_fleets(redis_client: redis.Redis, redis_url: str) -> None:
    """Proves: the clone limit is fleet-wide. Two Fleets (two worker processes, each with
    its own connection) provisioning requests of 2 and 3 get 2 reservations between them
    with ondemand_clone_limit 2; a per-process counter would have let each take 2 (4).
    (The first request has all it asks, so the slots freed then are the second's turn.)
    A finished create frees a slot for the other fleet, and the slot of a holder that
    was "killed" before its create comes back by itself once its lease runs out (A's
    leases are short, B's long, so only A's dead lease can be what frees the slot)."""
    short = make_config(ondemand_clone_limit=2, lock_expire_s=0.25)  # leases of 0.5 s
    long = make_config(ondemand_clone_limit=2)  # leases of 120 s
    other_client = redis.Redis.from_url(redis_url, decode_responses=True)
    a = make_fleet(redis_client, short, actor="worker:a:1", seed=1)
    b = make_fleet(other_client, long, actor="worker:b:1", seed=2)
    create_request(a.store, "ra", [Slot("deb", "debian", 2)], short)
    create_request(a.store, "rb", [Slot("deb", "debian", 3)], short)

    got_a = lifecycle.provision_request(a, "ra")
    got_b = lifecycle.provision_request(b, "rb")
    assert (len(got_a), len(got_b)) == (2, 0)
    assert a.slots.count() == b.slots.count() == 2

    # fleet A creates one VM: its slot comes back and B can reserve one, not more
    assert lifecycle.create_vm(a, got_a[0]) == "pending"
    assert len(lifecycle.provision_request(b, "rb")) == 1
    assert lifecycle.provision_request(b, "rb") == []
    # A's second create never happens (its worker was killed): its slot is held until
    # the lease runs out, then comes back with nobody cleaning up.
    assert poll(lambda: len(lifecycle.provision_request(b, "rb")) == 1, timeout_s=10)
    assert b.slots.count() == 2
    assert got_a[1] not in b.slots.holders()
    other_client.close()


def test_create_waits_for_a_slot_when_its_lease_was_lost(redis_client: redis.Redis) -> None:
    """A create whose reservation lease expired (a slow queue) does not exceed the
    limit: it answers 'throttled' and stays reserved for the pending sweep."""
    config = make_config(ondemand_clone_limit=1)
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    fleet.slots.release(name)
    assert fleet.slots.acquire("someone-else") is not None
    assert lifecycle.create_vm(fleet, name) == "throttled"
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "reserved"
    assert provider(fleet).count() == 0


# -- failures and retries ----------------------------------------------------------------


def test_failed_creates_retry_with_new_names_then_fail_the_request(
    redis_client: redis.Redis,
) -> None:
    """A create that fails frees the slot for a new reservation under a new name; past
    max_vm_retries the request fails with 'Max retry attempts exceeded' in its audit."""
    config = make_config({"create_fail_percent": 100}, max_vm_retries=2)
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["r1"])
    done = run_dispatched(fleet)
    creates = [(subject, outcome) for job, subject, outcome in done if job == "create_vm"]
    assert [o for _, o in creates] == ["retry", "retry", "request_failed"]
    assert len({name for name, _ in creates}) == 3  # a new name for every attempt
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "failed"
    assert req.failure_reason.startswith("Max retry attempts exceeded; last cause: create failed")
    reasons = [e.reason for e in fleet.store.history("r1") if e.entity == "request"]
    assert any(r.startswith("Max retry attempts exceeded") for r in reasons)
    for name, _ in creates:
        vm = fleet.store.get_vm(name)
        assert vm is not None and vm.state == "destroyed"
    assert fleet.slots.count() == 0
    assert provider(fleet).count() == 0


def test_permanent_error_fails_the_request_at_once(redis_client: redis.Redis) -> None:
    config = make_config({"permanent_fail_templates": ["debian-12"]})
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    assert lifecycle.create_vm(fleet, name) == "request_failed"
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "failed"
    assert req.failure_reason.startswith("Configuration error:")


def test_boot_timeout_fails_the_vm_and_retries(redis_client: redis.Redis) -> None:
    """A VM not ready past its pool's timeout (from created_at, server time) fails and
    a new reservation replaces it; before the timeout it is just 'booting'."""
    config = make_config({"ready_fail_percent": 100})
    config = dataclasses.replace(
        config, pools={k: dataclasses.replace(p, timeout_s=0.3) for k, p in config.pools.items()}
    )
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert lifecycle.check_pending_vm(fleet, name) == "booting"
    assert poll(lambda: lifecycle.check_pending_vm(fleet, name) == "retry", timeout_s=5)
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "completed" and vm.reason.startswith("timeout")
    calls = recorder(fleet).take()
    assert ("destroy_vm", name) in calls and ("provision_request", "r1") in calls
    assert lifecycle.destroy_vm(fleet, name) == "destroyed"
    assert provider(fleet).get_vm("debian", name) is None


def test_destroy_transient_error_leaves_it_completed(redis_client: redis.Redis) -> None:
    config = make_config({"destroy_fail_percent": 100})
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert fleet.store.delete_request("r1", actor="api").code == "deleted"
    assert lifecycle.destroy_vm(fleet, name) == "provider_error"
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "completed"
    assert lifecycle.destroy_sweep(fleet) == 1  # the next sweep tries again


# -- races with the API ----------------------------------------------------------------


class DeletingProvider:
    """Wraps a provider; deletes the request while the provider is creating the VM."""

    def __init__(self, inner: SimulatedProvider, store: Store, rid: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.store = store
        self.rid = rid

    def create_vm(self, pool: str, template: str, name: str) -> ProviderVM:
        assert self.store.delete_request(self.rid, actor="api").code == "deleted"
        return self.inner.create_vm(pool, template, name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def test_vm_of_a_request_deleted_during_create_is_destroyed(fleet: Fleet) -> None:
    """Proves no leak: the request is deleted while the provider creates its VM. The
    store refuses to attach the VM (vm_created -> 'vm_completed') and create_vm destroys
    what it made at the provider. Without that step the provider would still hold it."""
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    sim = provider(fleet)
    fleet.providers = {SIM: DeletingProvider(sim, fleet.store, "r1")}
    assert lifecycle.create_vm(fleet, name) == "vm_completed"
    assert sim.count() == 0
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "destroyed"
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "deleted"
    assert fleet.slots.count() == 0


def test_stale_creator_cannot_record_its_create(fleet: Fleet) -> None:
    """Proves: a create_vm whose VM lock was lost (and granted to another worker) is
    refused by the store ('stale_fence') when it records its result, and leaves the VM
    at the provider to the new holder (not destroyed: the record still wants it)."""
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    sim = provider(fleet)
    client = fleet.redis

    class Pausing:
        name = SIM

        def create_vm(self, pool: str, template: str, vm_name: str) -> ProviderVM:
            made = sim.create_vm(pool, template, vm_name)
            # "paused" past the lock's expiry; another worker takes the VM lock
            client.pexpire(fleet.keys.lock("vm", vm_name), 1)
            assert poll(lambda: client.exists(fleet.keys.lock("vm", vm_name)) == 0, timeout_s=10)
            other = FencedLock(client, fleet.keys, "vm", vm_name, expire_s=60, holder="b")
            assert other.acquire()
            return made

        def __getattr__(self, attr: str) -> Any:
            return getattr(sim, attr)

    fleet.providers = {SIM: Pausing()}
    # No extend before the write: the store's fence refuses it inside the write.
    assert lifecycle.create_vm(fleet, name) == "stale_fence"
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "reserved"
    assert sim.count() == 1  # the new holder's create will find it (idempotent)


# -- sweeps ------------------------------------------------------------------------------


def test_sweep_expired_fails_late_requests_and_releases_their_vms(fleet: Fleet) -> None:
    create_request(fleet.store, "late", [Slot("deb", "debian", 2)], fleet.config, ttl_s=0.6)
    create_request(fleet.store, "fine", [Slot("deb", "debian", 1)], fleet.config)
    names = lifecycle.provision_request(fleet, "late")
    assert lifecycle.create_vm(fleet, names[0]) == "pending"
    recorder(fleet).take()
    assert poll(lambda: fleet.store.due_for_expiry() == ["late"], timeout_s=5)
    assert lifecycle.sweep_expired(fleet) == {"failed": 1}
    assert lifecycle.sweep_expired(fleet) == {}  # idempotent: nothing left due
    req = fleet.store.get_request("late")
    assert req is not None and req.status == "failed"
    assert sorted(recorder(fleet).take()) == sorted(("destroy_vm", n) for n in names)
    assert lifecycle.destroy_vm(fleet, names[0]) == "destroyed"
    fine = fleet.store.get_request("fine")
    assert fine is not None and fine.status == "pending"


def test_reap_running_ends_expired_vms_only(fleet: Fleet) -> None:
    """Only VMs whose lifetime ended are released: a VM of a live request with lifetime
    left is untouched (invariant 2)."""
    create_request(fleet.store, "short", [Slot("deb", "debian", 1)], fleet.config,
                   vm_lifetime_s=0.3)  # fmt: skip
    create_request(fleet.store, "long", [Slot("deb", "debian", 1)], fleet.config)
    for rid in ("short", "long"):
        fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])
    run_dispatched(fleet)
    short_vm = fleet.store.request_vms("short")[0]
    long_vm = fleet.store.request_vms("long")[0]
    assert short_vm.state == long_vm.state == "running"
    assert poll(lambda: fleet.store.server_time() > (short_vm.lifetime_end or 0), timeout_s=5)
    assert lifecycle.reap_running(fleet) == 1
    assert lifecycle.reap_running(fleet) == 0
    assert recorder(fleet).take() == [("destroy_vm", short_vm.name)]
    still = fleet.store.get_vm(long_vm.name)
    assert still is not None and still.state == "running"
    assert lifecycle.destroy_vm(fleet, short_vm.name) == "destroyed"
    assert lifecycle.destroy_vm(fleet, long_vm.name) == "vm_running"


def test_sweeps_find_the_work_from_state_alone(redis_client: redis.Redis) -> None:
    """A lost job delays work, loses nothing: the sweeps rediscover it from Redis. (A
    provider checked VM by VM: the pending sweep dispatches the check.)"""
    fleet = make_fleet(redis_client, make_config({"batch_status": False}))
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], fleet.config)
    assert lifecycle.provision_sweep(fleet) == 1
    assert recorder(fleet).take() == [("provision_request", "r1")]
    names = lifecycle.provision_request(fleet, "r1")
    recorder(fleet).take()  # the create jobs are "lost"
    lifecycle.create_vm(fleet, names[0])
    recorder(fleet).take()  # and so is the check_pending job
    # the reserved VM is young: only the pending one is dispatched
    assert lifecycle.check_pending_sweep(fleet) == 1
    assert recorder(fleet).take() == [("check_pending_vm", names[0])]
    assert lifecycle.check_request(fleet, "r1") == "pending"
    assert sorted(recorder(fleet).take()) == sorted(
        [("check_pending_vm", names[0]), ("create_vm", names[1])]
    )


def test_a_listing_provider_is_checked_by_the_sweep_itself(fleet: Fleet) -> None:
    """The default simulated provider answers for all booting VMs with one list call
    (as the clouds): the pending sweep records a booted VM ready itself, with no job
    dispatched, and leaves a booting one alone (no lock, no job). With the per-VM
    dispatch of the old sweep this fails: the sweep would dispatch a check and record
    nothing."""
    slow = make_fleet(fleet.redis, make_config({"boot_seconds": 3600}))
    create_request(fleet.store, "up", [Slot("deb", "debian", 1)], fleet.config)
    create_request(fleet.store, "slow", [Slot("cent", "centos", 1)], fleet.config)
    [up] = lifecycle.provision_request(fleet, "up")
    [booting] = lifecycle.provision_request(slow, "slow")
    assert lifecycle.create_vm(fleet, up) == "pending"
    assert lifecycle.create_vm(slow, booting) == "pending"
    recorder(fleet).take()
    assert lifecycle.check_pending_sweep(fleet) == 0  # nothing left to dispatch
    assert recorder(fleet).take() == []
    vm_up, vm_booting = fleet.store.get_vm(up), fleet.store.get_vm(booting)
    assert vm_up is not None and vm_up.state == "running"
    assert vm_booting is not None and vm_booting.state == "pending"
    assert not fleet.redis.exists(fleet.store.keys.lock("vm", booting))


def test_a_vm_missing_from_the_simulated_list_fails_at_once(fleet: Fleet) -> None:
    """The simulated cloud's list has no lag (``list_lag_s`` 0): a booting VM it no
    longer holds is failed by the next sweep, not 30 s later as a cloud's would be."""
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    [name] = lifecycle.provision_request(fleet, "r1")
    slow = make_fleet(fleet.redis, make_config({"boot_seconds": 3600}))
    assert lifecycle.create_vm(slow, name) == "pending"
    assert provider(fleet).destroy_vm("debian", name)
    lifecycle.check_pending_sweep(fleet)
    trail = [e for e in fleet.store.history("r1") if e.entity == f"vm:{name}"]
    assert any(e.src == "pending" and "vanished" in e.reason for e in trail), trail


def test_a_vm_of_another_provider_than_its_pools_is_checked_by_its_own(
    redis_client: redis.Redis,
) -> None:
    """A pool whose provider changed since its VM was created: the listing sweep asks
    the pool's provider, which does not hold the VM; the VM is not failed as vanished
    but dispatched to the per-VM check, which asks the VM's own provider."""
    old = make_fleet(redis_client, make_config({"boot_seconds": 3600}))
    create_request(old.store, "r1", [Slot("deb", "debian", 1)], old.config)
    [name] = lifecycle.provision_request(old, "r1")
    assert lifecycle.create_vm(old, name) == "pending"
    data_moved = make_config()
    other = dataclasses.replace(
        data_moved,
        pools={
            pool: dataclasses.replace(cfg, provider="sim2")
            for pool, cfg in data_moved.pools.items()
        },
    )
    moved = make_fleet(redis_client, other)
    moved.providers = {**moved.providers, "sim2": moved.providers[SIM].__class__(
        redis_client, moved.store.keys, "sim2", {})}  # fmt: skip
    assert lifecycle.check_pending_sweep(moved) == 1
    assert recorder(moved).take() == [("check_pending_vm", name)]
    vm = moved.store.get_vm(name)
    assert vm is not None and vm.state == "pending"


# -- reconcile -------------------------------------------------------------------------


def test_reconcile_destroys_a_leaked_vm_after_the_grace(redis_client: redis.Redis) -> None:
    """A VM the provider holds and no record mentions is destroyed, but only once it is
    older than reconcile_grace_s; a recorded VM is left alone."""
    config = make_config(reconcile_grace_s=0.5)
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["r1"])
    run_dispatched(fleet)
    sim = provider(fleet)
    sim.leak_vm("debian", "debian-12", "leaked-vm-1")
    assert lifecycle.reconcile(fleet) == {"unrecorded_in_grace": 1}
    assert sim.get_vm("debian", "leaked-vm-1") is not None
    assert poll(lambda: lifecycle.reconcile(fleet).get("leaked_destroyed") == 1, timeout_s=5)
    assert sim.get_vm("debian", "leaked-vm-1") is None
    assert sim.count() == 1  # the request's VM is still there
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "ready"


def test_reconcile_finishes_a_reservation_whose_creator_died(redis_client: redis.Redis) -> None:
    """A worker killed after the provider created the VM but before vm_created leaves a
    reserved record and a provider VM; the reconciler (after 2 * lock_expire_s) records
    it created, and the request then completes. A reservation whose creator died before
    the provider call gets its create dispatched again."""
    config = make_config(lock_expire_s=0.3)
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], config)
    made, not_made = lifecycle.provision_request(fleet, "r1")
    recorder(fleet).take()
    vm = fleet.store.get_vm(made)
    assert vm is not None
    provider(fleet).create_vm(vm.pool, vm.template, made)  # ...and then the worker died

    # the two reservations cross the 2 * lock_expire_s line a moment apart: poll for both
    assert poll(
        lambda: (
            lifecycle.reconcile(fleet) is not None
            and ("create_vm", not_made) in recorder(fleet).calls
        ),
        timeout_s=5,
    )
    rec = fleet.store.get_vm(made)
    assert rec is not None and rec.state == "pending"
    assert ("check_pending_vm", made) in recorder(fleet).calls
    run_dispatched(fleet)
    req = fleet.store.get_request("r1")
    assert req is not None and req.status == "ready"
    assert fleet.slots.count() == 0


def test_reconcile_fails_a_pending_vm_the_provider_lost(fleet: Fleet) -> None:
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    assert lifecycle.create_vm(fleet, name) == "pending"
    provider(fleet).destroy_vm("debian", name)  # the cloud lost it
    recorder(fleet).take()
    assert lifecycle.reconcile(fleet) == {"pending_lost": 1}
    vm = fleet.store.get_vm(name)
    assert vm is not None and vm.state == "completed"
    assert ("provision_request", "r1") in recorder(fleet).take()


def test_reconcile_destroys_what_a_completed_record_still_holds(fleet: Fleet) -> None:
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], fleet.config)
    (name,) = lifecycle.provision_request(fleet, "r1")
    assert lifecycle.create_vm(fleet, name) == "pending"
    fleet.store.delete_request("r1", actor="api")
    recorder(fleet).take()  # the destroy job is lost
    assert lifecycle.reconcile(fleet) == {"destroy_dispatched": 1}
    run_dispatched(fleet)
    assert provider(fleet).count() == 0


def test_fleet_build_uses_config_prefix(redis_client: redis.Redis) -> None:
    config = make_config(key_prefix="tenant")
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:x:1")
    assert fleet.keys == Keys("tenant")
    assert set(fleet.providers) == {SIM}


# -- pools removed from the config -------------------------------------------------------


def _without_pool(config: Config, pool: str) -> Config:
    """``config`` as the next release of the file has it: ``pool`` removed."""
    pools = {name: p for name, p in config.pools.items() if name != pool}
    return dataclasses.replace(config, pools=MappingProxyType(pools))


def test_running_vms_of_a_removed_pool_are_still_reaped_and_destroyed(
    redis_client: redis.Redis,
) -> None:
    """The pool 'centos' leaves the config while one of its VMs runs: its lifetime still
    ends and the VM is destroyed, its provider being configured (red before: the sweeps
    read only the configured pools' indexes, reap_running found 0 and the VM ran on)."""
    old = make_fleet(redis_client, make_config())
    create_request(old.store, "r1", [Slot("cent", "centos", 1)], old.config, vm_lifetime_s=0.3)
    old.dispatch.send(Job.PROVISION_REQUEST, ["r1"])
    run_dispatched(old)
    [vm] = old.store.request_vms("r1")
    assert vm.state == "running"
    new = make_fleet(redis_client, _without_pool(old.config, "centos"))
    assert poll(lambda: new.store.server_time() > (vm.lifetime_end or 0), timeout_s=5)
    assert lifecycle.reap_running(new) == 1
    run_dispatched(new)
    after = new.store.get_vm(vm.name)
    assert after is not None and after.state == "destroyed"
    assert provider(new).count() == 0


def test_booting_and_released_vms_of_a_removed_pool_are_finished(
    redis_client: redis.Redis,
) -> None:
    """A booting VM of a removed pool is still checked (its request turns ready) and a
    released one still destroyed, by the reap pass over the pools no longer configured
    (red before: neither was ever found again)."""
    old = make_fleet(redis_client, make_config())
    for rid in ("booting", "released"):
        create_request(old.store, rid, [Slot("cent", "centos", 1)], old.config)
        [name] = lifecycle.provision_request(old, rid)
        assert lifecycle.create_vm(old, name) == "pending"
    [released] = old.store.request_vms("released")
    assert lifecycle.check_pending_vm(old, released.name) == "fulfilled"
    assert old.store.delete_request("released", actor="api").ok
    recorder(old).take()  # every dispatched job is lost
    new = make_fleet(redis_client, _without_pool(old.config, "centos"))
    lifecycle.reap_running(new)
    run_dispatched(new)
    req = new.store.get_request("booting")
    assert req is not None and req.status == "ready"
    gone = new.store.get_vm(released.name)
    assert gone is not None and gone.state == "destroyed"


def test_a_hostname_prefix_with_a_final_newline_is_refused() -> None:
    """Proves: the prefix check is a full match: a NameGenerator refuses "ci-\\n" when
    it is built (the old `^...$` with re.match let it through, and only the last-resort
    check on each generated name caught it)."""
    with pytest.raises(ValueError):
        NameGenerator("ci-\n")
    assert generate_name("ci-").startswith("ci-")

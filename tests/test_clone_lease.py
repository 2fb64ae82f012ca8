"""The clone limit holds while a provider call runs longer than a clone slot's lease:
the lease is renewed for as long as the call it guards."""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers import ProviderVM, SimulatedProvider
from vmpool.state.names import NameGenerator
from vmpool.state.ops import new_op
from vmpool.state.records import Outcome, RequestSettings, Slot
from vmpool.state.semaphore import CloneSemaphore

SIM = "sim"


def make_fleet(client: redis.Redis, **overrides: Any) -> Fleet:
    data = {
        ":providers": {SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1}},
        ":config": {"ondemand_request_ttl": 10, "ondemand_clone_limit": 1, "timeout": 1},
        ":pools": [{"name": "debian", "alias": ["deb"], "template": "debian-12", "size": 0,
                    "provider": SIM, "domain": "example.com"}],
    }  # fmt: skip
    config: Config = dataclasses.replace(parse_config(data, source="test", env={}), **overrides)
    fleet = Fleet.build(client, config, RecordingDispatcher(), "worker:test:1")
    fleet.rng = random.Random(3)
    fleet.names = NameGenerator(config.hostname_prefix, fleet.rng)
    return fleet


@pytest.mark.slow
def test_slot_lease_is_renewed_while_the_provider_call_runs(redis_client: redis.Redis) -> None:
    """Limit 1, leases of 0.5 s (lock_expire 0.25 s). The provider call lasts three
    leases; in the middle of it another worker asks for a slot and must be refused.
    Red before: the lease ran out under the running call and the intruder got a second
    slot, two clones at once with a limit of 1."""
    fleet = make_fleet(redis_client, lock_expire_s=0.25)
    base = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request("r1", [Slot("deb", "debian", 1)], base, actor="api").ok
    (name,) = lifecycle.provision_request(fleet, "r1")
    sim = fleet.providers[SIM]
    assert isinstance(sim, SimulatedProvider)
    intruder = CloneSemaphore(redis_client, fleet.keys, limit=1, lease_s=60)
    seen: list[str | None] = []

    class Slow:
        name = SIM

        def create_vm(self, pool: str, template: str, vm_name: str) -> ProviderVM:
            # a provider call three leases long: the passing time is what is tested
            threading.Event().wait(3 * fleet.lease_s)
            seen.append(intruder.acquire("intruder"))
            return sim.create_vm(pool, template, vm_name)

        def __getattr__(self, attr: str) -> Any:
            return getattr(sim, attr)

    fleet.providers = {SIM: Slow()}
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert seen == [None]
    assert fleet.slots.count() == 0  # released once the call is over


@pytest.mark.slow
def test_renewal_stops_with_the_call(redis_client: redis.Redis) -> None:
    """The renewal ends when the guarded block ends (nothing left renewing a slot
    nobody holds): after release, and a few renewal periods later, the slot is still
    free. The block lasts a few renewal periods, so renewals did run in it; and every
    block of one semaphore is renewed by the same one thread, not a thread per block.
    The passing time is what is tested here."""
    from vmpool.state.keys import Keys

    sem = CloneSemaphore(redis_client, Keys("vmpool"), limit=1, lease_s=0.3)
    renewals: list[str] = []
    renew = sem._renew

    def counted(lease: tuple[str, int]) -> bool:
        renewals.append(lease[0])
        return renew(lease)

    def keepers() -> set[threading.Thread]:
        # by identity: another test's keeper may end meanwhile (it lingers, then ends)
        return {t for t in threading.enumerate() if t.name == "clone-lease-keeper"}

    sem._keeper._renew = counted
    before = keepers()
    assert sem.acquire("a") == "a"
    for _ in range(2):
        with sem.renewing("a"):
            threading.Event().wait(0.35)  # three renewal periods of 0.1 s
    assert renewals.count("a") >= 3  # renewals in both blocks
    assert len(keepers() - before) == 1  # this semaphore's one thread, for both blocks
    sem.release("a")
    seen = len(renewals)
    threading.Event().wait(0.35)
    assert len(renewals) == seen  # nothing renews a lease whose block ended
    assert sem.acquire("b") == "b"


class _Blocking:
    """The simulated provider, with a create that waits until the test lets it go (a
    creator stopped in its provider call, deterministically)."""

    def __init__(self, sim: SimulatedProvider) -> None:
        self.sim = sim
        self.inside = threading.Event()
        self.go = threading.Event()

    def create_vm(self, pool: str, template: str, vm_name: str) -> ProviderVM:
        self.inside.set()
        assert self.go.wait(30), "the test never let the create go"
        return self.sim.create_vm(pool, template, vm_name)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.sim, attr)


def test_a_paused_creator_cannot_release_the_slot_of_the_one_that_took_over(
    redis_client: redis.Redis,
) -> None:
    """Proves: a clone slot is released only by its holder. Creator A stops inside its
    provider call past its VM lock and its slot's lease (modelled by ending both: a
    stopped process renews nothing); creator B takes the VM over and takes the one
    slot (limit 1). When A wakes, its create's end must not release B's slot: the
    fleet still counts B's clone, and an intruder gets no second slot. Red before: the
    slot was keyed by the VM name alone, A's release dropped B's lease and the
    intruder's clone ran beside B's (two at once with a limit of 1)."""
    fleet_a = make_fleet(redis_client, lock_expire_s=30)
    fleet_b = make_fleet(redis_client, lock_expire_s=30)
    base = RequestSettings.from_config(fleet_a.config)
    assert fleet_a.store.create_request("r1", [Slot("deb", "debian", 1)], base, actor="api").ok
    (name,) = lifecycle.provision_request(fleet_a, "r1")
    sim = fleet_a.providers[SIM]
    assert isinstance(sim, SimulatedProvider)
    a, b = _Blocking(sim), _Blocking(sim)
    fleet_a.providers, fleet_b.providers = {SIM: a}, {SIM: b}
    outcomes: dict[str, str] = {}
    try:
        _stop_and_take_over(redis_client, fleet_a, fleet_b, name, a, b, outcomes)
    finally:  # a failed assertion must not leave a create waiting
        a.go.set()
        b.go.set()


def _stop_and_take_over(
    redis_client: redis.Redis,
    fleet_a: Fleet,
    fleet_b: Fleet,
    name: str,
    a: _Blocking,
    b: _Blocking,
    outcomes: dict[str, str],
) -> None:
    creator_a = threading.Thread(
        target=lambda: outcomes.update(a=lifecycle.create_vm(fleet_a, name))
    )
    creator_a.start()
    assert a.inside.wait(10)
    # A is stopped: its lock and its slot's lease run out
    redis_client.pexpire(fleet_a.keys.lock("vm", name), 1)
    redis_client.zadd(fleet_a.keys.clone_slots, {name: 1}, xx=True)
    assert poll_until(lambda: redis_client.exists(fleet_a.keys.lock("vm", name)) == 0)
    creator_b = threading.Thread(
        target=lambda: outcomes.update(b=lifecycle.create_vm(fleet_b, name))
    )
    creator_b.start()
    assert b.inside.wait(10)  # B holds the VM's lock and the slot, and is cloning
    a.go.set()
    creator_a.join(30)
    assert outcomes["a"] == "stale_fence"
    intruder = CloneSemaphore(redis_client, fleet_a.keys, limit=1, lease_s=60)
    assert fleet_b.slots.count() == 1, "A's late release dropped B's slot"
    assert intruder.acquire("intruder-vm") is None
    b.go.set()
    creator_b.join(30)
    assert outcomes["b"] == "pending"
    assert fleet_b.slots.count() == 0


def test_the_reservation_takes_the_slot_and_vm_created_gives_it_back_once(
    redis_client: redis.Redis,
) -> None:
    """Proves: reserve_vm takes the VM's clone slot in its own unit (limit 1: a second
    request's reservation is refused 'clone_limit', writes no VM and waits in the slot
    line), and vm_created gives the slot back in its unit, naming the request whose turn
    it is then. The same call sent again with its operation id (a retry after a lost
    reply) answers the first reply, turns included, and changes nothing: the slot the
    waiting request's VM took meanwhile stays taken. Red on a vm_created that keeps the
    slot (the count stays 1) or answers no turns; red without the operation id (the
    repeat is refused 'vm_pending' and the turns are lost)."""
    fleet = make_fleet(redis_client)  # clone limit 1
    store, slots = fleet.store, fleet.slots
    base = RequestSettings.from_config(fleet.config)
    for rid in ("r1", "r2"):
        assert store.create_request(rid, [Slot("deb", "debian", 1)], base, actor="api").ok

    def reserve(rid: str, name: str, place: float) -> Outcome:
        return store.reserve_vm(
            rid, name=name, alias="deb", pool="debian", template="t", provider=SIM,
            domain=None, actor="w", slot=slots.terms(place),
        )  # fmt: skip

    assert reserve("r1", "vm-a", 1.0).code == "reserved"
    assert slots.holders() == ["vm-a"]
    assert reserve("r2", "vm-b", 2.0) == Outcome(False, "clone_limit")
    assert store.get_vm("vm-b") is None
    assert redis_client.zscore(fleet.keys.clone_slot_line, "r2") == 2.0
    op = new_op(60)
    args = ["vm-a", "", slots.limit]
    first = store.scripts.run_on_vm("vm-a", "vm_created", "w", args, op=op)
    assert (first.ok, first.code, first.turns) == (True, "pending", ("r2",))
    assert slots.count() == 0
    assert reserve("r2", "vm-b", 2.0).code == "reserved"  # its turn: it takes the slot
    assert redis_client.zscore(fleet.keys.clone_slot_line, "r2") is None
    again = store.scripts.run_on_vm("vm-a", "vm_created", "w", args, op=op)
    assert again == first
    assert slots.holders() == ["vm-b"]
    assert slots.count() == 1


def test_vm_created_gives_back_only_its_holders_slot(redis_client: redis.Redis) -> None:
    """Proves: vm_created gives the slot back only for the holder of its lease (its
    fencing token, or an older one): a create whose slot a newer holder of the VM took
    over (token 7, ours 5) records the VM but leaves that lease, and answers no turns."""
    fleet = make_fleet(redis_client)
    store, slots = fleet.store, fleet.slots
    base = RequestSettings.from_config(fleet.config)
    assert store.create_request("r1", [Slot("deb", "debian", 1)], base, actor="api").ok
    assert store.reserve_vm(
        "r1", name="vm-a", alias="deb", pool="debian", template="t", provider=SIM,
        domain=None, actor="w", slot=slots.terms(1.0),
    ).ok  # fmt: skip
    assert slots.acquire("vm-a", 7) == "vm-a"  # taken over by a newer holder
    created = store.vm_created("vm-a", actor="w", slot_limit=slots.limit, fence=None)
    assert (created.code, created.turns) == ("pending", ())
    assert redis_client.hget(fleet.keys.clone_slot_holders, "vm-a") == "7"
    assert slots.count() == 1


def test_a_warm_pool_reservation_takes_its_slot_in_its_unit(redis_client: redis.Redis) -> None:
    """Proves: a warm pool's top-up reserves a VM only with a clone slot, taken in the
    reservation's unit: at the limit (1, held by another VM) it is refused
    'clone_limit' and writes neither a VM nor a lease; with the slot free it holds the
    slot (token 0, for its create to take over), and vm_created gives it back."""
    fleet = make_fleet(redis_client)  # clone limit 1
    pools, slots = fleet.store.pools, fleet.slots

    def reserve(name: str) -> Outcome:
        return pools.reserve_pool_vm(
            name, pool="debian", template="t", provider=SIM, domain=None, size=2,
            data_ttl_s=60, actor="w", slot=slots.terms(),
        )  # fmt: skip

    assert slots.acquire("someone-elses-vm") is not None
    assert reserve("warm-a") == Outcome(False, "clone_limit")
    assert fleet.store.get_vm("warm-a") is None
    assert slots.holders() == ["someone-elses-vm"]
    assert slots.release("someone-elses-vm")
    assert reserve("warm-a").code == "reserved"
    assert redis_client.hget(fleet.keys.clone_slot_holders, "warm-a") == "0"
    created = fleet.store.vm_created("warm-a", actor="w", slot_limit=slots.limit)
    assert (created.code, slots.count()) == ("pending", 0)


def poll_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return True
        done.wait(0.02)
    return bool(predicate())

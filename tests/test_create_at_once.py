"""A create claim's VMs made at once by a provider that creates many in one call.

Proves: a create claim of five VMs at the simulated provider makes them in one provider
call and records them in one round trip, each by its own checked ``vm_created``, and
each VM's create then goes on as alone (its check dispatched, its clone slot back). Red
before: five ``create_vm`` calls, one after the other, each with its own lock check and
record (three round trips a VM, the claim's slots held all that while). One VM's
failure stays its own; a claim whose lock is no longer ours makes nothing at once (each
VM checks its own lock, as alone); a VM nobody needs any more is destroyed, as alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import redis
from batchhelp import batched_fleet, reserved

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, batch
from vmpool.lifecycle.creating import create_at_once
from vmpool.providers import CreateOrder, ProviderVM, SimulatedProvider
from vmpool.state.locks import acquire_all, held_all
from vmpool.state.workset import WorkSet
from workers.batching import BatchDispatcher

from lifecyclehelp import make_config, make_fleet
from redishelp import RoundTrips


class Counted:
    """The simulated provider, its calls counted (each call of a cloud is one request)."""

    def __init__(self, sim: SimulatedProvider) -> None:
        self.sim = sim
        self.one: list[str] = []
        self.many: list[list[str]] = []

    def create_vm(self, pool: str, template: str, name: str, **kwargs: Any) -> ProviderVM:
        self.one.append(name)
        return self.sim.create_vm(pool, template, name, **kwargs)

    def create_vms(self, orders: Sequence[CreateOrder]) -> list[ProviderVM | Exception]:
        self.many.append([order.name for order in orders])
        return self.sim.create_vms(orders)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.sim, attr)


def _counted(fleet: Fleet) -> Counted:
    counted = Counted(fleet.providers["sim"])  # type: ignore[arg-type]
    fleet.providers = {"sim": counted}  # type: ignore[dict-item]
    return counted


def test_a_claim_of_five_creates_is_one_provider_call_and_one_round_trip_of_records(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})  # the claim takes the five
    fleet = batched_fleet(redis_client, redis_url)
    names = reserved(fleet, 5)
    provider = _counted(fleet)
    assert fleet.slots.count() == 5  # each reservation holds its clone slot
    counts = lifecycle.create_vm_batch(fleet)
    assert counts == {"pending": 5}, counts
    assert provider.many == [names] and provider.one == [], (provider.many, provider.one)
    for name in names:
        vm = fleet.store.get_vm(name)
        assert vm is not None and vm.state == "pending"
        assert fleet.providers["sim"].get_vm("debian", name) is not None
    assert fleet.slots.count() == 0  # each vm_created gave its slot back
    work = WorkSet(fleet.redis, fleet.keys)
    assert work.size(Job.CREATE_VM) == 0 and work.size(Job.CHECK_PENDING_VM) == 5


def test_one_vm_failing_at_the_provider_fails_alone(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = batched_fleet(redis_client, redis_url)
    names = reserved(fleet, 3)
    provider = _counted(fleet)
    sim = provider.sim
    failing = names[1]
    sim_fails = sim.create_fails_for
    monkeypatch.setattr(sim, "create_fails_for", lambda n: n == failing or sim_fails(n))
    counts = lifecycle.create_vm_batch(fleet)
    assert provider.many == [names], provider.many
    assert counts.get("pending") == 2 and counts.get("retry") == 1, counts
    vm = fleet.store.get_vm(failing)
    assert vm is not None and vm.state == "completed"  # failed: to destruction, retried
    assert sim.get_vm("debian", failing) is None
    assert fleet.slots.count() == 0  # the failed one's slot given back too


def test_a_claim_whose_lock_is_lost_makes_nothing_at_once(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """held_all is one read for the claim: with a lock no longer ours it says so, and
    each VM then checks its own lock before its provider call, as alone."""
    fleet = batched_fleet(redis_client, redis_url)
    names = reserved(fleet, 2)
    locks = acquire_all([fleet.lock("vm", n, "create", read_record=True) for n in names])
    assert len(locks) == 2 and held_all(locks)
    redis_client.delete(fleet.keys.lock("vm", names[0]))  # expired meanwhile
    assert not held_all(locks)
    made = create_at_once(fleet, locks, {n: True for n in names})
    assert made == {}
    assert fleet.providers["sim"].count() == 0  # nothing made


def test_a_vm_released_meanwhile_is_destroyed_as_alone(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is deleted after the locks were granted: its VMs are made (the
    provider was asked), vm_created answers that nobody needs them, and each is
    destroyed at the provider at once, as a create alone does."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = batched_fleet(redis_client, redis_url)
    reserved(fleet, 2)
    provider = _counted(fleet)
    create_vms = provider.create_vms

    def then_deleted(orders: Sequence[CreateOrder]) -> list[ProviderVM | Exception]:
        answers = create_vms(orders)
        assert fleet.store.delete_request("r1", actor="test").ok
        return answers

    provider.create_vms = then_deleted  # type: ignore[method-assign]
    counts = lifecycle.create_vm_batch(fleet)
    assert counts == {"vm_completed": 2}, counts  # the request completed them
    assert provider.sim.count() == 0
    assert fleet.slots.count() == 0


def test_the_simulated_provider_creates_many_in_one_call_each_alone(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = batched_fleet(
        redis_client, redis_url, sim_options={"permanent_fail_templates": ["bad"]}
    )
    sim = fleet.providers["sim"]
    assert isinstance(sim, SimulatedProvider)
    orders = [
        CreateOrder("debian", "debian-12", "vm-one"),
        CreateOrder("debian", "bad", "vm-two"),
        CreateOrder("debian", "debian-12", "vm-three"),
    ]
    first = sim.create_vms(orders)
    assert [type(a).__name__ for a in first] == [
        "ProviderVM",
        "PermanentProviderError",
        "ProviderVM",
    ]
    again = sim.create_vms(orders)  # idempotent by name: the same VMs
    assert isinstance(again[0], ProviderVM) and isinstance(first[0], ProviderVM)
    assert again[0].created_at == first[0].created_at
    assert sim.count() == 2


def test_a_claims_round_trips_do_not_grow_with_its_creates(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create claim of 10 costs the round trips of a claim of 5 (its locks, slots,
    one lock check, one provider call, one round trip of records, its dispatch: 9).
    Red before, when each create added three (a lock check, the create, its record):
    21 and 36."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    costs = []
    for n in (1, 5, 10):  # the first loads the scripts
        redis_client.flushdb()
        counter = RoundTrips()
        fleet = make_fleet(counter.client(redis_url, decode=True), make_config())
        fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
        reserved(fleet, n)
        before = counter.count
        assert lifecycle.create_vm_batch(fleet) == {"pending": n}
        costs.append(counter.count - before)
    assert costs[2] - costs[1] <= 2, costs

"""The clone limit holds while a provider call runs longer than a clone slot's lease
(issue 11): the lease is renewed for as long as the call it guards."""

from __future__ import annotations

import dataclasses
import random
import threading
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers import ProviderVM, SimulatedProvider
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot
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


def test_renewal_stops_with_the_call(redis_client: redis.Redis) -> None:
    """The renewal ends when the guarded block ends (nothing left renewing a slot
    nobody holds): after release, and a few renewal periods later, the slot is still
    free. The block lasts a few renewal periods, so renewals did run in it; and every
    block of one semaphore is renewed by the same one thread, not a thread per block.
    The passing time is what is tested here."""
    from vmpool.state.keys import Keys

    sem = CloneSemaphore(redis_client, Keys("vmpool"), limit=1, lease_s=0.3)
    renewals: list[str] = []
    acquire = sem.acquire

    def counted(holder: str) -> str | None:
        renewals.append(holder)
        return acquire(holder)

    def keepers() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "clone-lease-keeper")

    sem.acquire = counted  # type: ignore[method-assign]
    before = keepers()
    assert sem.acquire("a") == "a"
    for _ in range(2):
        with sem.renewing("a"):
            threading.Event().wait(0.35)  # three renewal periods of 0.1 s
    assert renewals.count("a") >= 3  # the first acquire and renewals in both blocks
    assert keepers() - before == 1  # this semaphore's one thread, for both blocks
    sem.release("a")
    seen = len(renewals)
    threading.Event().wait(0.35)
    assert len(renewals) == seen  # nothing renews a lease whose block ended
    assert sem.acquire("b") == "b"

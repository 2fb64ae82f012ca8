"""Batch jobs under test: a fleet that dispatches to work sets, reserved VMs, and a
provider whose first create waits for the test (tests of vmpool/lifecycle/batch.py)."""

from __future__ import annotations

import threading
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.lifecycle import Fleet
from vmpool.providers import ProviderVM, SimulatedProvider
from vmpool.state.records import RequestSettings, Slot
from workers.batching import BatchDispatcher

from lifecyclehelp import make_config, make_fleet


def batched_fleet(redis_client: redis.Redis, redis_url: str, **overrides: Any) -> Fleet:
    fleet = make_fleet(redis_client, make_config(**overrides))
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
    return fleet


def reserved(fleet: Fleet, n: int) -> list[str]:
    """The names of ``n`` VMs reserved for a new request, their creates in the work set."""
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request("r1", [Slot("deb", "debian", n)], settings, actor="api").ok
    names = lifecycle.provision_request(fleet, "r1")  # dispatches their creates: in the set
    assert len(names) == n
    return names


class OneByOne:
    """The simulated provider (``sim``) as a cloud that creates one VM per call: no
    ``create_vms``, so each VM of a claim creates alone, through ``create_vm``."""

    sim: SimulatedProvider

    def __getattr__(self, attr: str) -> Any:
        if attr == "create_vms":
            raise AttributeError(attr)
        return getattr(self.sim, attr)


class FirstCreateWaits(OneByOne):
    """The simulated provider, one VM per call; the first create waits until the test
    lets it go (a slow cloud call, deterministically), the others answer at once."""

    def __init__(self, sim: SimulatedProvider) -> None:
        self.sim = sim
        self.inside = threading.Event()
        self.go = threading.Event()
        self.first: str | None = None
        self._lock = threading.Lock()

    def create_vm(self, pool: str, template: str, vm_name: str) -> ProviderVM:
        with self._lock:
            slow = self.first is None
            if slow:
                self.first = vm_name
        if slow:
            self.inside.set()
            assert self.go.wait(30), "the test never let the create go"
        return self.sim.create_vm(pool, template, vm_name)

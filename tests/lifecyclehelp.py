"""Helpers shared by the lifecycle tests: configs, fleets, running dispatched jobs."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.state.audit import audit_state
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store

SIM = "sim"


def make_config(sim_options: dict[str, Any] | None = None, **overrides: Any) -> Config:
    data = {
        ":providers": {SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1}},
        ":config": {
            "ondemand_request_ttl": 10,
            "ondemand_clone_limit": 10,
            "max_vm_retries": 3,
            "timeout": 1,
        },
        ":pools": [
            {"name": "debian", "alias": ["deb"], "template": "debian-12", "size": 0,
             "provider": SIM, "domain": "example.com"},
            {"name": "centos", "alias": ["cent"], "template": "centos-9", "size": 0,
             "provider": SIM, "domain": "example.com"},
        ],
    }  # fmt: skip
    data[":providers"][SIM].update(sim_options or {})  # type: ignore[index]
    config = parse_config(data, source="test", env={})
    return dataclasses.replace(config, **overrides)


def make_fleet(
    client: redis.Redis, config: Config, actor: str = "worker:test:1", seed: int = 7
) -> Fleet:
    fleet = Fleet.build(client, config, RecordingDispatcher(), actor)
    fleet.rng = random.Random(seed)
    fleet.names = NameGenerator(config.hostname_prefix, fleet.rng)
    return fleet


def recorder(fleet: Fleet) -> RecordingDispatcher:
    assert isinstance(fleet.dispatch, RecordingDispatcher)
    return fleet.dispatch


def run_dispatched(fleet: Fleet, max_rounds: int = 200) -> list[tuple[str, str, Any]]:
    """Run every dispatched job in-process (as workers would), until none is left."""
    done: list[tuple[str, str, Any]] = []
    for _ in range(max_rounds):
        calls = recorder(fleet).take()
        if not calls:
            return done
        for job, subject in calls:
            done.append((job, subject, getattr(lifecycle, job)(fleet, subject)))
    raise AssertionError("dispatch did not settle")


def create_request(
    store: Store, rid: str, slots: list[Slot], config: Config, **settings: Any
) -> None:
    base = RequestSettings.from_config(config)
    out = store.create_request(rid, slots, dataclasses.replace(base, **settings), actor="api")
    assert out.ok, out


def warm_config(size: int = 3, **pool: Any) -> Config:
    data = {
        ":providers": {SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1}},
        ":config": {"ondemand_request_ttl": 10, "ondemand_clone_limit": 10, "timeout": 1},
        ":pools": [
            {"name": "debian", "template": "debian-12", "size": size, "provider": SIM,
             "domain": "example.com", **pool},
        ],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


def filled(fleet: Fleet) -> list[str]:
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    return fleet.store.pool_vms("debian", "ready")


def clean(fleet: Fleet) -> None:
    problems = audit_state(
        fleet.store, fleet.providers, sweep_interval_s=60, reap_interval_s=60,
        quota_of=fleet.config.quotas.limits,
    )  # fmt: skip
    assert not problems, [p.line() for p in problems]

"""Creates taken for quick from the first claim when every provider says they answer at once.

Proves: a worker's fleet (``build_fleet``) over the simulated cloud with no create
latency takes creates for quick before any create ran, so its first provision job runs
them in line, all in one claim (no create batch job queued, no first claim of one VM);
a create latency, or a provider that says nothing (a real cloud: a clone may block),
keeps them out of line until a claim has shown their pace. Red before InstantCreates:
the worker's first provision job queued its creates (a first create claim of one VM,
then the rest: about 40 ms of a 200-VM end-to-end run with AOF).
"""

from __future__ import annotations

from typing import Any

import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle.pace import QUICK_UNSEEN, quick_unseen
from vmpool.providers.base import Provider
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.batching import build_fleet

from lifecyclehelp import create_request, make_config


def test_a_fleet_over_instant_creates_runs_its_first_creates_in_line(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = build_fleet(redis_url, make_config(), redis.Redis.from_url(redis_url), "w:1", [])
    assert fleet.pace is not None and fleet.pace.quick(Job.CREATE_VM)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 3)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, ["r1"])
    counts = lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready", counts
    assert counts.get("create_vm:pending") == 3, counts  # the three in this job's one claim
    assert redis_client.lrange(fleet.keys.rq_queue("vms"), 0, -1) == []  # no create job


def test_a_create_latency_keeps_creates_out_of_line_until_seen(
    redis_client: redis.Redis, redis_url: str
) -> None:
    config = make_config({"create_latency_seconds": 0.5})
    fleet = build_fleet(redis_url, config, redis.Redis.from_url(redis_url), "w:1", [])
    assert fleet.pace is not None and not fleet.pace.quick(Job.CREATE_VM)
    assert fleet.pace.quick(Job.PROVISION_REQUEST) and fleet.pace.quick(Job.CHECK_PENDING_VM)


class _SaysNothing:
    """A provider that does not declare InstantCreates (as the real clouds)."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "creates_at_once":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_creates_are_quick_unseen_only_if_every_provider_says_so(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = build_fleet(redis_url, make_config(), redis.Redis.from_url(redis_url), "w:1", [])
    sim = next(iter(fleet.providers.values()))
    assert Job.CREATE_VM in quick_unseen([sim])
    assert quick_unseen([sim, _SaysNothing(sim)]) == QUICK_UNSEEN  # type: ignore[list-item]
    assert quick_unseen([]) == QUICK_UNSEEN

"""A provision claim reserves the VMs its requests miss in one round trip.

Each reservation is still its own checked script (the clone limit, the slots' line and
the request's fence are the script's), so the claim ends where the requests' steps, one
by one, would have: tests/test_batching.py counts the round trips; here, the outcome.
"""

from __future__ import annotations

import pytest
import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import stages
from vmpool.lifecycle.fleet import Fleet
from vmpool.state.records import Slot
from vmpool.state.transitions import VMState
from vmpool.state.workset import WorkSet

from lifecyclehelp import create_request, make_config, make_fleet, recorder
from redishelp import RoundTrips


def test_at_the_clone_limit_a_claim_serves_its_requests_in_order(
    redis_client: redis.Redis,
) -> None:
    """Proves: made at once, the reservations still go first come, first served. With 3
    clone slots, r0 (2 VMs) gets 2, r1 (2 VMs) the last slot and its place at the head of
    the line, r2 nothing and its place behind r1; a create is dispatched for each VM."""
    fleet = make_fleet(redis_client, make_config(ondemand_clone_limit=3))
    wants = {"r0": 2, "r1": 2, "r2": 1}
    for rid, n in wants.items():
        create_request(fleet.store, rid, [Slot("deb", "debian", n)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, list(wants))
    lifecycle.provision_batch(fleet)
    held = {rid: fleet.store.get_request(rid) for rid in wants}
    assert {rid: len(req.vm_names) for rid, req in held.items() if req} == {
        "r0": 2,
        "r1": 1,
        "r2": 0,
    }
    assert fleet.slots.in_line(list(wants)) == {"r1", "r2"}
    created = {subject for job, subject in recorder(fleet).take() if job == Job.CREATE_VM}
    assert created == {name for req in held.values() if req for name in req.vm_names}


def test_a_claims_reservations_are_created_even_when_no_step_runs(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: a VM the claim reserved has its create dispatched by the claim itself, so
    a request whose step does not run (it failed, or the claim's time ran out before it)
    leaves no VM reserved with no create on its way (it would wait for the pending sweep's
    re-dispatch, seconds later: seen as a 10 s stall in bench/e2e.py)."""
    fleet = make_fleet(redis_client, make_config())

    def fails(*_: object, **__: object) -> None:
        raise RuntimeError("the step never gets to it")

    monkeypatch.setattr(stages, "provision_request", fails)
    rids = ["a", "b", "c"]
    for rid in rids:
        create_request(fleet.store, rid, [Slot("deb", "debian", 1)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, rids)
    assert lifecycle.provision_batch(fleet) == {"error": 3}
    vms = [vm for rid in rids for vm in fleet.store.request_vms(rid)]
    assert len(vms) == 3 and all(vm.state == VMState.RESERVED for vm in vms)
    created = {subject for job, subject in recorder(fleet).take() if job == Job.CREATE_VM}
    assert created == {vm.name for vm in vms}


def _provision_round_trips(redis_url: str, requests: int) -> int:
    """Client round trips of one provision batch of ``requests`` one-VM requests at a
    clone limit of 2, all in one claim; the line holds the refused ones in order."""
    trips = RoundTrips()
    client = trips.client(redis_url, decode=True)
    client.flushdb()
    fleet: Fleet = make_fleet(client, make_config(ondemand_clone_limit=2))
    rids = [f"q{i:02d}" for i in range(requests)]
    for rid in rids:
        create_request(fleet.store, rid, [Slot("deb", "debian", 1)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, rids)
    before = trips.count
    lifecycle.provision_batch(fleet)
    spent = trips.count - before
    assert client.zrange(fleet.keys.clone_slot_line, 0, -1) == rids[2:]
    return spent


def test_the_requests_refused_a_slot_are_not_put_in_line_again_one_by_one(
    redis_url: str,
) -> None:
    """Proves: at the clone limit, a claim's requests after the first refused a slot cost
    no round trip each: their reservation's script, refused, put each in the slots' line
    at its place (the step put each there again, one round trip per request: 19 in a
    claim of 20 at the clone limit, about 10 ms under AOF always, traced with MONITOR)."""
    _provision_round_trips(redis_url, 3)  # the scripts loaded: the first run pays their loads
    small = _provision_round_trips(redis_url, 6)
    big = _provision_round_trips(redis_url, 16)
    assert (big - small) / 10 <= 0.2, (small, big)

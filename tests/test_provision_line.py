"""The provision sweep and the clone slots' line: a fleet past its capacity stays cheap.

Proves: with the clone limit met and requests waiting in the clone slots' line, a
provision sweep dispatches none of those whose turn has not come, so none of their locks
is granted (each grant would only find the gate closed; with a burst of 120 requests
every sweep re-granted each waiting request's lock, ~12 grants per request); the
request whose turn has come is still dispatched, even when the turn handed out at the
slot's release was lost; and the requests in line are dispatched when a pool that lends
its ready VMs to requests holds one (the sweep is how a waiting request takes it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.state.records import RequestSettings, Slot
from workers.batching import BatchDispatcher

from lifecyclehelp import create_request, filled, make_config, make_fleet, recorder, warm_config


def _batched_fleet(redis_client: redis.Redis, redis_url: str, **overrides: Any) -> Fleet:
    fleet = make_fleet(redis_client, make_config(**overrides))
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
    return fleet


def _post(fleet: Fleet, rid: str, clone_limit: int = 0) -> None:
    """A request as the API creates it: added to the provision work set in its unit.
    ``clone_limit``: the fleet's, as the API passes it (0: the line is never joined)."""
    out = fleet.store.create_request(
        rid, [Slot("deb", "debian", 1)], RequestSettings.from_config(fleet.config),
        actor="api", work_set=fleet.keys.work_set(Job.PROVISION_REQUEST),
        clone_limit=clone_limit,
    )  # fmt: skip
    assert out.ok, out


def _in_work_set(fleet: Fleet, rid: str) -> bool:
    return fleet.redis.zscore(fleet.keys.work_set(Job.PROVISION_REQUEST), rid) is not None


def _grants(fleet: Fleet, rids: list[str]) -> dict[str, int]:
    """Each request's lock grants so far (its fencing counter)."""
    return {rid: int(fleet.redis.get(fleet.keys.request_fence(rid)) or 0) for rid in rids}


def test_a_sweep_grants_no_lock_to_the_requests_waiting_for_their_turn(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: at the clone limit, a provision sweep and the batch after it grant no lock
    of the requests in line (red on the sweep that dispatched every request short of
    VMs: one more grant each, and the batch only found the gate closed). Once a slot is
    free and nobody handed the turn over (a plain release: the turn was lost), the next
    sweep dispatches the first in line, and only it is served."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    rids = [f"r-{i}" for i in range(6)]
    for rid in rids:
        _post(fleet, rid)
    lifecycle.provision_batch(fleet)  # each found the limit met: all wait in line
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == rids
    before = _grants(fleet, rids)
    assert before == dict.fromkeys(rids, 1)
    swept = []
    for _ in range(3):
        swept.append(lifecycle.provision_sweep(fleet))
        lifecycle.provision_batch(fleet)
    assert _grants(fleet, rids) == before
    assert swept == [0, 0, 0]
    fleet.slots.release("someone-elses-vm")  # a slot free, and no turn handed out
    assert lifecycle.provision_sweep(fleet) == 1
    lifecycle.provision_batch(fleet)
    after = _grants(fleet, rids)
    assert after == {**before, "r-0": 2}, after
    assert fleet.store.get_request("r-0").vm_names  # type: ignore[union-attr]
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == rids[1:]


def test_a_sweep_dispatches_the_requests_in_line_when_a_lending_pool_has_a_ready_vm(
    redis_client: redis.Redis,
) -> None:
    """Proves: the requests waiting in line are dispatched by the sweep when a pool that
    lends its ready VMs to requests holds one (a VM turned ready after they joined the
    line), and the first takes it though no clone slot is free; with the pool lending
    nothing, they are not dispatched."""
    config = dataclasses.replace(warm_config(1), ondemand_clone_limit=1)
    fleet = make_fleet(redis_client, config)
    [ready] = filled(fleet)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    for rid in ("a", "b"):
        create_request(fleet.store, rid, [Slot("debian", "debian", 1)], config)
        fleet.slots.join_line(rid, float(fleet.store.get_request(rid).place))  # type: ignore[union-attr]
    recorder(fleet).take()
    assert lifecycle.provision_sweep(fleet) == 2
    assert recorder(fleet).take() == [(Job.PROVISION_REQUEST, "a"), (Job.PROVISION_REQUEST, "b")]
    assert lifecycle.provision_request(fleet, "a") == []  # nothing cloned: it took the VM
    assert fleet.store.get_vm(ready).request_id == "a"  # type: ignore[union-attr]
    assert lifecycle.provision_sweep(fleet) == 0  # the pool has nothing left to lend
    assert recorder(fleet).take() == []


def test_a_create_batch_claims_one_create_first_so_another_worker_takes_the_next(
    redis_client: redis.Redis, redis_url: str, monkeypatch: Any
) -> None:
    """Proves: a create batch whose pace is not known yet claims one create, so the other
    reserved VM stays free for another worker while the first create runs. Red when the
    first claim took every create in the set (up to 20): a claim's creates run one after
    the other, so with a provider whose create blocks (1 s in bench/overload.py) the
    second VM held its clone slot idle until the first was over, and a burst's creates,
    reserved two at a time, ran one at a time on one worker (one worker busy, one idle
    on average; the burst at ~0.95 requests/s against ~1.7 steady)."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=2)
    for rid in ("r-1", "r-2"):
        _post(fleet, rid)
    lifecycle.provision_batch(fleet)  # two VMs reserved, their creates in the work set
    claims = fleet.keys.work_part(Job.CREATE_VM, "claims")
    provider = fleet.providers["sim"]
    claimed: list[int] = []  # at each call of the provider: how many creates are claimed

    def noting_the_claims(call: Any) -> Any:
        def noted(*args: Any, **kwargs: Any) -> Any:
            claimed.append(int(redis_client.zcard(claims)))
            return call(*args, **kwargs)

        return noted

    for name in ("create_vm", "create_vms"):  # one VM a call, or a claim's VMs at once
        monkeypatch.setattr(provider, name, noting_the_claims(getattr(provider, name)))
    lifecycle.create_vm_batch(fleet)
    assert claimed == [1, 1], claimed


def test_a_request_created_behind_a_full_line_waits_in_it_from_its_creation(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: at the clone limit, a request created while others wait in the slots'
    line joins the line in its create's unit, at its place, and stays out of the
    provision work set, so no provision claim grants its lock only to find no slot (red
    before: in a burst past the limit each new request's first claim did just that, a
    claim of 20 costing four round trips and 20 reservations, half the slots' pace in
    an end-to-end run with AOF). A request created with nobody in line is claimed as
    before; so is the first in line once a slot is free."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    _post(fleet, "r-0", clone_limit=1)
    assert _in_work_set(fleet, "r-0")  # nobody in line: a worker's claim finds it
    lifecycle.provision_batch(fleet)  # the limit met: it waits in line
    rids = [f"r-{i}" for i in range(1, 5)]
    for rid in rids:
        _post(fleet, rid, clone_limit=1)
    line = fleet.keys.clone_slot_line
    assert redis_client.zrange(line, 0, -1) == ["r-0", *rids]
    places = {r: fleet.store.get_request(r).place for r in rids}  # type: ignore[union-attr]
    assert {r: redis_client.zscore(line, r) for r in rids} == places  # at its place
    assert not any(_in_work_set(fleet, rid) for rid in rids)
    lifecycle.provision_batch(fleet)
    assert _grants(fleet, ["r-0", *rids]) == {"r-0": 1, **dict.fromkeys(rids, 0)}
    fleet.slots.release("someone-elses-vm")  # a slot free, and no turn handed out
    assert lifecycle.provision_sweep(fleet) == 1  # the first in line only
    lifecycle.provision_batch(fleet)
    assert fleet.store.get_request("r-0").vm_names  # type: ignore[union-attr]
    assert _grants(fleet, rids) == dict.fromkeys(rids, 0)


def test_a_request_joined_at_its_creation_is_served_in_its_turn(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: the turn a created VM hands back reaches a request that joined the line
    at its creation: every request gets its VM, in the order of the line, each lock
    granted once (in its turn). Red before on its first check only (r-2 went to the work
    set); the rest guards against a request left out of both the work set and the turns
    (it would wait for a provision sweep while the slots cycle)."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    _post(fleet, "r-0", clone_limit=1)
    lifecycle.provision_batch(fleet)  # r-0 reserved: the one slot is its VM's
    _post(fleet, "r-1", clone_limit=1)  # nobody in line yet: claimed, waits in line
    lifecycle.provision_batch(fleet)
    _post(fleet, "r-2", clone_limit=1)  # behind r-1: in line from its creation
    assert not _in_work_set(fleet, "r-2")
    served = []
    for _ in range(6):  # each round: the creates (a slot back, a turn), then provisions
        lifecycle.create_vm_batch(fleet)
        lifecycle.provision_batch(fleet)
        served = [r for r in ("r-0", "r-1", "r-2") if fleet.store.get_request(r).vm_names]  # type: ignore[union-attr]
        if len(served) == 3:
            break
    assert served == ["r-0", "r-1", "r-2"]
    assert _grants(fleet, ["r-1", "r-2"]) == {"r-1": 2, "r-2": 1}
    assert redis_client.zcard(fleet.keys.clone_slot_line) == 0


def test_a_request_whose_pool_holds_a_ready_vm_is_not_put_in_line_at_creation(
    redis_client: redis.Redis,
) -> None:
    """Proves: a pool of the request holding a ready VM (which it may lend) keeps a new
    request in the provision work set even behind a full line: its claim may take it."""
    config = dataclasses.replace(warm_config(1), ondemand_clone_limit=1)
    fleet = make_fleet(redis_client, config)
    filled(fleet)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    create_request(fleet.store, "earlier", [Slot("debian", "debian", 1)], config)
    assert fleet.slots.join_line("earlier", 0.0)
    out = fleet.store.create_request(
        "r-1", [Slot("debian", "debian", 1)], RequestSettings.from_config(config),
        actor="api", work_set=fleet.keys.work_set(Job.PROVISION_REQUEST), clone_limit=1,
    )  # fmt: skip
    assert out.ok, out
    assert _in_work_set(fleet, "r-1")
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == ["earlier"]

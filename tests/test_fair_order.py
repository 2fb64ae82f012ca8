"""First come, first served, and fair across users (docs/invariants.md, invariant 10).

Proves, with the fleet at its clone limit (so that the order in which waiting requests
are offered a slot decides who is served): the oldest request is served first whatever
id its client chose (a client cannot jump the queue by picking an id that sorts first);
and one user's burst cannot starve another user's single request (the policy of
docs/state-machine.md, "Order of service": round-robin across token users, oldest
first within a user); a request past its TTL leaves the clone slots' line at once; and
a slot a create gives back goes to the first in line at once.
"""

from __future__ import annotations

from typing import Any

import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.state.records import Outcome, RequestSettings, Slot
from vmpool.state.store import VMAsk
from workers.batching import BatchDispatcher

from lifecyclehelp import create_request, make_config, make_fleet, recorder
from storehelp import wait_until


def _batched_fleet(redis_client: redis.Redis, redis_url: str, **overrides: Any) -> Fleet:
    fleet = make_fleet(redis_client, make_config(**overrides))
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
    return fleet


def _post(fleet: Fleet, rid: str, user: str = "") -> None:
    """A request as the API creates it: added to the provision work set in its unit."""
    out = fleet.store.create_request(
        rid, [Slot("deb", "debian", 1)], RequestSettings.from_config(fleet.config),
        actor="api", token_user=user, work_set=fleet.keys.work_set("provision_request"),
    )  # fmt: skip
    assert out.ok, out


def _round(fleet: Fleet) -> set[str]:
    """One round of the fleet at its clone limit: the provision sweep dispatches the
    requests still short of VMs but those waiting in the clone slots' line before their
    turn, a provision batch reserves what the limit allows (and serves the turns handed
    on meanwhile), and a create batch creates them (each create gives its slot back and
    hands it to the first in line). Returns the requests that got a VM reserved in this
    round."""
    before = _reserved(fleet)
    lifecycle.provision_sweep(fleet)
    lifecycle.provision_batch(fleet)
    lifecycle.create_vm_batch(fleet)
    return _reserved(fleet) - before


def _reserved(fleet: Fleet) -> set[str]:
    out = set()
    for key in fleet.redis.scan_iter(match=fleet.keys.request_pattern()):
        rid = fleet.keys.request_id_from_key(key if isinstance(key, str) else key.decode())
        req = fleet.store.get_request(rid)
        if req is not None and req.vm_names:
            out.add(rid)
    return out


def test_the_oldest_request_is_served_first_whatever_its_id(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: arrival order, not the id, decides. The oldest request's id sorts last;
    twelve younger ones sort first. With 2 clone slots, the oldest gets one in the first
    round (on the code that scored every work-set entry 0, Redis ordered them by id and
    the oldest got none in six rounds)."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=2)
    oldest = "ffffffff-0000-4000-8000-000000000000"
    _post(fleet, oldest)
    younger = [f"00000000-0000-4000-8000-{i:012d}" for i in range(12)]
    for rid in younger:
        _post(fleet, rid)
    served = [_round(fleet) for _ in range(6)]
    assert oldest in served[0], served
    # and after it, the younger ones in their own order of arrival, two per round
    order = [sorted(r) for r in served]
    assert order[1:] == [younger[i : i + 2] for i in range(1, 11, 2)], order


def test_one_users_burst_cannot_starve_another_users_request(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: round-robin across token users. Alice posts ten requests, then Bob one
    (whose id sorts last). With one clone slot, one request is served per round; Bob's
    is served in the second round, right after Alice's first (served by arrival or by
    id alone, it would wait for all ten of hers)."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    alice = [f"a-{i:02d}" for i in range(10)]
    for rid in alice:
        _post(fleet, rid, user="alice")
    _post(fleet, "zz-bob", user="bob")
    served = [_round(fleet) for _ in range(4)]
    assert served == [{"a-00"}, {"zz-bob"}, {"a-01"}, {"a-02"}], served


def test_a_slot_freed_during_a_batch_waits_for_the_older_request(
    redis_client: redis.Redis, redis_url: str, monkeypatch: Any
) -> None:
    """Proves: within one provision batch, once the oldest request met the clone limit,
    a slot freed a moment later (a create elsewhere finished) is not taken by a younger
    request of the same batch; the older one gets it at its next turn. The slot is
    freed at the exact moment of the older request's refusal, so the test is
    deterministic (without the batch's gate and the slots' line the younger one takes
    it). The claim's reservations are one pipeline, whose scripts other clients' commands
    may come between: here they are sent one by one, the slot freed right after the
    refusal; a request's own step, reserving alone, frees it the same way."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    _post(fleet, "old")
    _post(fleet, "young")
    reserve, reserve_all = fleet.store.reserve_vm, fleet.store.reserve_vms

    def free_if_refused(got: Outcome | Exception) -> Outcome | Exception:
        if isinstance(got, Outcome) and got.code == "clone_limit":
            fleet.slots.release("someone-elses-vm")  # the other create just ended
        return got

    def reserve_then_free(request_id: str, **kwargs: Any) -> Outcome | Exception:
        return free_if_refused(reserve(request_id, **kwargs))

    def reserve_all_then_free(asks: list[VMAsk], **kwargs: Any) -> list[Outcome | Exception]:
        return [free_if_refused(reserve_all([ask], **kwargs)[0]) for ask in asks]

    monkeypatch.setattr(fleet.store, "reserve_vm", reserve_then_free)
    monkeypatch.setattr(fleet.store, "reserve_vms", reserve_all_then_free)
    lifecycle.provision_batch(fleet)
    assert _reserved(fleet) == set()
    monkeypatch.setattr(fleet.store, "reserve_vm", reserve)
    monkeypatch.setattr(fleet.store, "reserve_vms", reserve_all)
    assert _round(fleet) == {"old"}


def test_requests_behind_a_closed_gate_wait_in_the_clone_slot_line(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: the requests a provision batch leaves unreserved once an older one met the
    clone limit wait in the clone slots' line at their places, so the slots freed go to
    them in turn at once. Left out of the line (only the first refused joined it), they
    waited for the next provision sweep (every 5 s) while freed slots stood idle: 3
    VMs/s end to end at the default clone limit."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    for rid in ("a", "b", "c"):
        _post(fleet, rid)
    lifecycle.provision_batch(fleet)
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == ["a", "b", "c"]
    assert fleet.slots.release_to_line("someone-elses-vm") == ["a"]
    fleet.store.delete_request("c", actor="api")
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == ["a", "b"]


def test_a_request_past_its_ttl_leaves_the_clone_slot_line(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a request that waited in the clone slots' line and whose TTL passed before
    its turn (not yet failed by the expiry sweep) holds nobody back. At clone limit 1,
    "old" (TTL 0.6 s) and "young" both wait for the one slot; once old's TTL is over and
    the slot is free, the provision round that finds old past its deadline takes it out
    of the line, and young is served in that same round (left in line, old counts as
    ahead of young until the expiry sweep fails it, and young gets no slot)."""
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=1)
    assert fleet.slots.acquire("someone-elses-vm") is not None  # the fleet is full
    short = RequestSettings(ttl_s=0.6)
    out = fleet.store.create_request(
        "old", [Slot("deb", "debian", 1)], short, actor="api",
        work_set=fleet.keys.work_set("provision_request"),
    )  # fmt: skip
    assert out.ok, out
    _post(fleet, "young")
    assert _round(fleet) == set()
    line = fleet.keys.clone_slot_line
    assert redis_client.zrange(line, 0, -1) == ["old", "young"]  # young behind the gate
    deadline = float(redis_client.hget(fleet.keys.request("old"), "deadline") or 0)
    wait_until(lambda: fleet.store.server_time() > deadline, timeout=5)
    fleet.slots.release("someone-elses-vm")
    assert _round(fleet) == {"young"}
    assert redis_client.zrange(line, 0, -1) == []


def test_a_slot_freed_by_a_create_goes_to_the_first_in_line_at_once(
    redis_client: redis.Redis,
) -> None:
    """Proves: when a create gives its clone slot back, the request first in line for one
    is dispatched its provision in the same step, not at the next pending sweep: with a
    line waiting, the fleet keeps the pace it has without one (else every slot freed
    idles until a sweep and one more job hand it over, and a load the fleet serves
    without a line grows one once a line forms)."""
    fleet = make_fleet(redis_client, make_config(ondemand_clone_limit=1))
    for rid in ("first", "second"):
        create_request(fleet.store, rid, [Slot("deb", "debian", 1)], fleet.config)
    [name] = lifecycle.provision_request(fleet, "first")
    assert lifecycle.provision_request(fleet, "second") == []  # no slot: it waits in line
    assert redis_client.zrange(fleet.keys.clone_slot_line, 0, -1) == ["second"]
    recorder(fleet).take()
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert (Job.PROVISION_REQUEST, "second") in recorder(fleet).take()
    assert lifecycle.provision_request(fleet, "second") != []


def test_a_served_request_left_in_the_slot_line_leaves_it_at_its_next_turn(
    redis_client: redis.Redis,
) -> None:
    """Proves: a request whose VMs are all reserved but which still sits in the clone
    slots' line (data of a fleet whose join let such a request in; fulfil relies on its
    last reservation having taken it out) does not hold the line up for good: the first
    provision it is dispatched finds nothing left to reserve and takes it out, so the
    request placed after it is served. Red without the leave: "served" stayed first in
    line, counted ahead of "next", and "next" got no slot though one was free."""
    fleet = make_fleet(redis_client, make_config(ondemand_clone_limit=1))
    for rid in ("served", "next"):
        create_request(fleet.store, rid, [Slot("deb", "debian", 1)], fleet.config)
    [name] = lifecycle.provision_request(fleet, "served")
    assert lifecycle.create_vm(fleet, name) == "pending"
    assert fleet.store.vm_ready(name, actor="test").code == "fulfilled"
    line = fleet.keys.clone_slot_line
    redis_client.zadd(line, {"served": 0.0})  # left behind by an older join
    assert lifecycle.provision_request(fleet, "served") == []
    assert redis_client.zrange(line, 0, -1) == []
    assert lifecycle.provision_request(fleet, "next") != []

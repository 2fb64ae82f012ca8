"""Batch jobs: one RQ job runs the per-subject work of many subjects.

Proves: the batched path brings requests to ready with every VM's change its own
checked transition (the trail is complete and the audit clean); the work set
deduplicates; a batch whose worker died loses nothing (its claimed subjects come back
after the lease, and the dead claimer cannot remove a newer claim); the clone limit
holds in a batch; the dispatcher queues a bounded number of batch jobs in a constant
number of round trips.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher, batch
from vmpool.lifecycle.batch import run_batch
from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.locks import FencedLock
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.batching import LANES, BatchDispatcher
from workers.table import job_id

from lifecyclehelp import create_request, make_config, make_fleet
from redishelp import RoundTrips


def _batched_fleet(redis_client: redis.Redis, redis_url: str, **overrides: Any) -> Fleet:
    fleet = make_fleet(redis_client, make_config(**overrides))
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys)
    return fleet


def _drain(fleet: Fleet) -> None:
    """Run the batch jobs in-process (as the workers would) until every set is empty."""
    work = WorkSet(fleet.redis, fleet.keys)
    for _ in range(50):
        lifecycle.provision_batch(fleet)
        lifecycle.create_vm_batch(fleet)
        lifecycle.check_pending_batch(fleet)
        if not any(work.size(j) for j in ("provision_request", "create_vm", "check_pending_vm")):
            return
    raise AssertionError("the work sets did not drain")


def test_batches_bring_requests_to_ready_one_transition_each(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = _batched_fleet(redis_client, redis_url)
    rids = [f"r{i}" for i in range(5)]
    for rid in rids:
        create_request(fleet.store, rid, [Slot("deb", "debian", 2)], fleet.config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, rids)
    fleet.dispatch.send(Job.PROVISION_REQUEST, rids)  # dispatched twice: the set holds each once
    assert WorkSet(fleet.redis, fleet.keys).size("provision_request") == 5
    _drain(fleet)
    for rid in rids:
        req = fleet.store.get_request(rid)
        assert req is not None and req.status == "ready"
        trail = fleet.store.history(rid)
        assert check_trail(rid, trail) == []
        # one reserve, one create, one ready per VM: nothing made twice
        assert sum(1 for e in trail if e.entity.startswith("vm:")) == 2 * 3


def test_a_dead_claimer_loses_nothing_and_cannot_remove_a_newer_claim(
    redis_client: redis.Redis, keys: Keys
) -> None:
    work = WorkSet(redis_client, keys)
    work.add("create_vm", ["vm-a", "vm-b", "vm-c"])
    dead = work.claim("create_vm", 2, lease_s=60)
    assert sorted(dead.subjects) == ["vm-a", "vm-b"]
    assert work.claim("create_vm", 5, lease_s=60).subjects == ["vm-c"]  # claimed: hidden
    assert work.claim("create_vm", 5, lease_s=60).subjects == []
    # the dead claimer's lease ends (aged here rather than waited for)
    claims = keys.work_part("create_vm", "claims")
    redis_client.zadd(claims, {"vm-a": 1, "vm-b": 1}, xx=True)
    again = work.claim("create_vm", 5, lease_s=120)
    assert sorted(again.subjects) == ["vm-a", "vm-b"]
    assert work.done("create_vm", dead, dead.subjects) == 0  # not its claim any more
    assert work.done("create_vm", again, again.subjects) == 2
    assert work.size("create_vm") == 1  # vm-c, still claimed by its (live) job
    # a job that ran out of time releases what it did not run: claimable at once
    live = WorkSet(redis_client, keys)
    assert live.claim("create_vm", 5, lease_s=60).subjects == []
    redis_client.zadd(claims, {"vm-c": 1}, xx=True)
    late = live.claim("create_vm", 5, lease_s=90)
    assert late.subjects == ["vm-c"]
    assert live.release("create_vm", late, late.subjects) == 1
    assert live.claim("create_vm", 5, lease_s=60).subjects == ["vm-c"]


def test_one_bad_subject_does_not_stop_the_batch(redis_client: redis.Redis, redis_url: str) -> None:
    fleet = _batched_fleet(redis_client, redis_url)
    WorkSet(fleet.redis, fleet.keys).add("create_vm", ["a-1", "boom", "a-2"])
    seen: list[str] = []

    def fn(_: Fleet, subject: str) -> str:
        seen.append(subject)
        if subject == "boom":
            raise RuntimeError("provider exploded")
        return "pending"

    counts = run_batch(fleet, "create_vm", fn)
    assert sorted(seen) == ["a-1", "a-2", "boom"]
    assert counts == {"pending": 2, "error": 1}
    assert WorkSet(fleet.redis, fleet.keys).size("create_vm") == 0


def test_the_clone_limit_holds_in_a_batch(redis_client: redis.Redis, redis_url: str) -> None:
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=3)
    create_request(fleet.store, "big", [Slot("deb", "debian", 8)], fleet.config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, ["big"])
    lifecycle.provision_batch(fleet)
    req = fleet.store.get_request("big")
    assert req is not None and len(req.vm_names) == 3  # reserved within the limit only
    _drain(fleet)  # creates free the slots; the next provision reserves more
    for _ in range(10):
        lifecycle.provision_sweep(fleet)
        _drain(fleet)
    req = fleet.store.get_request("big")
    assert req is not None and req.status == "ready"


def test_lanes_are_bounded_and_cost_constant_round_trips(conn: redis.Redis, keys: Keys) -> None:
    dispatch = BatchDispatcher(conn, keys)
    lanes = dispatch.lanes[Job.CREATE_VM]
    assert dispatch.queue_lanes(lanes, want=10) == LANES
    assert dispatch.queue_lanes(lanes, want=10) == 0  # all live
    queued = conn.lrange(keys.rq_queue("vms"), 0, -1)
    assert queued == [job_id(keys, "create_vm_batch", run=i).encode() for i in range(LANES)]


def test_a_batch_yields_on_time_and_queues_its_continuation(
    redis_client: redis.Redis, redis_url: str, conn: redis.Redis, monkeypatch: Any
) -> None:
    """Proves: a batch job stops claiming once its time is over, says there is more, and
    its continuation (the other id of its lane, since its own is still live) is queued
    at the back of the queue; the subjects stay in the set for it."""
    fleet = _batched_fleet(redis_client, redis_url)
    WorkSet(fleet.redis, fleet.keys).add("create_vm", ["a-1", "a-2"])
    monkeypatch.setattr(batch, "BATCH_TIME_S", 0.0)
    assert run_batch(fleet, "create_vm", lambda f, s: "pending") == {"more": 1}
    assert WorkSet(fleet.redis, fleet.keys).size("create_vm") == 2
    current = job_id(fleet.keys, "create_vm_batch", run=1)
    assert BatchDispatcher(conn, fleet.keys).continue_batch(Job.CREATE_VM_BATCH, current)
    assert conn.lrange(fleet.keys.rq_queue("vms"), 0, -1) == [
        job_id(fleet.keys, "create_vm_batch", run=1 + LANES).encode()
    ]


def test_lanes_follow_the_config(
    redis_client: redis.Redis, redis_url: str, conn: redis.Redis
) -> None:
    """Proves: the lanes of each batch job are ``batch_lanes`` (12 here), not the fixed
    4 of the first batching code, which capped the fleet at 4 creates calling the
    provider at once whatever the workers and clone slots (a provider whose create
    blocks needs more)."""
    fleet = make_fleet(redis_client, make_config(ondemand_clone_limit=12, batch_lanes=12))
    dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
    for i in range(20):
        dispatch.send(
            Job.CREATE_VM, [f"vm-{i}"]
        )  # one by one, as provision_request dispatches them
    queued = set(conn.lrange(fleet.keys.rq_queue("vms"), 0, -1))
    lanes = {job_id(fleet.keys, "create_vm_batch", run=i).encode() for i in range(12)}
    # Each dispatch checks a window of 4 lanes from a random one (its cost does not grow
    # with the lanes); 20 dispatches leave more than the old cap of 4 queued, all of them
    # lanes of the 12 (the chance of staying at 4 is about 1e-17).
    assert 4 < len(queued) <= 12 and queued <= lanes, queued
    # a run of a lane the config no longer has continues on a lane it has
    two = BatchDispatcher(conn, fleet.keys, dataclasses.replace(fleet.config, batch_lanes=2))
    two.continue_batch(Job.CREATE_VM_BATCH, job_id(fleet.keys, "create_vm_batch", run=40))
    assert any(
        conn.exists(fleet.keys.rq_job(job_id(fleet.keys, "create_vm_batch", run=r)))
        for r in range(4)
    )


def test_a_dispatch_costs_the_same_with_many_lanes(conn: redis.Redis, keys: Keys) -> None:
    """Proves: with 64 lanes (a clone limit of 64 or more) one dispatch checks a window
    of lanes only, and all in one script: the work-set add and the window's reclaim
    checks are one EVALSHA (they were a SCRIPT EXISTS and a pipeline of 8 reclaim
    scripts), plus one enqueue when a lane is free."""

    def calls(*names: str) -> int:
        stats = conn.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k in names)

    work = WorkSet(conn, keys)
    dispatch = BatchDispatcher(conn, keys, dataclasses.replace(make_config(), batch_lanes=64))
    lanes = dispatch.lanes[Job.CREATE_VM]
    scripts = ("cmdstat_evalsha", "cmdstat_eval")
    before = calls(*scripts)
    assert dispatch.queue_lanes(lanes, 1, ["vm-1"]) == 1
    # the probe (its first EVALSHA meets NOSCRIPT and is sent again) + one enqueue
    assert calls(*scripts) - before <= 3
    before, before_exists = calls(*scripts), calls("cmdstat_script|exists")
    for lane in range(64):  # every lane live: the next dispatch queues nothing
        conn.hset(keys.rq_job(job_id(keys, "create_vm_batch", run=lane)), "status", "queued")
    assert dispatch.queue_lanes(lanes, 1, ["vm-2"]) == 0
    assert calls(*scripts) - before == 1  # the probe alone, no SCRIPT EXISTS round trip
    assert calls("cmdstat_script|exists") == before_exists
    assert work.size("create_vm") == 2


class _CountingDispatcher(RecordingDispatcher):
    """Records each send it gets as (job, subjects): one entry per send."""

    def __init__(self) -> None:
        super().__init__()
        self.sends: list[tuple[str, list[str]]] = []

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        self.sends.append((job, list(subjects)))


def test_a_claims_follow_ups_are_dispatched_once_per_claim(
    redis_client: redis.Redis, monkeypatch: Any
) -> None:
    """Proves: the checks a create batch dispatches go out as ONE batched dispatch per
    claim (one lane check for all of them), not one dispatch per VM (each a pipeline of
    lane checks: most of a VM's Redis commands), and every VM is in it once. The batch's
    first claim takes every create here (as the claims after a first one of a fast
    provider do), so the batch is that one claim."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = make_fleet(redis_client, make_config())
    names: list[str] = []
    for i in range(3):
        create_request(fleet.store, f"r{i}", [Slot("deb", "debian", 1)], fleet.config)
        names += lifecycle.provision_request(fleet, f"r{i}")
    WorkSet(fleet.redis, fleet.keys).add("create_vm", names)
    counting = _CountingDispatcher()
    fleet.dispatch = counting
    assert lifecycle.create_vm_batch(fleet) == {"pending": 3}
    assert [(j, sorted(s)) for j, s in counting.sends] == [("check_pending_vm", sorted(names))]
    assert fleet.dispatch is counting  # the batch's deferral stayed inside the batch


def test_a_claims_locks_are_granted_together_and_a_busy_one_is_skipped(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a create batch grants the locks of its claimed VMs together (each its own
    lock and token) and runs the VMs it got; a VM whose lock another worker holds is
    'busy' and left to that worker (not created, its lock untouched), without stopping
    the others; every lock the batch took is released once it ran."""
    fleet = _batched_fleet(redis_client, redis_url)
    names: list[str] = []
    for i in range(3):
        create_request(fleet.store, f"r{i}", [Slot("deb", "debian", 1)], fleet.config)
        names += lifecycle.provision_request(fleet, f"r{i}")
    WorkSet(fleet.redis, fleet.keys).add("create_vm", names)
    other = FencedLock(fleet.redis, fleet.keys, "vm", names[1], expire_s=60, holder="other")
    assert other.acquire()
    assert lifecycle.create_vm_batch(fleet) == {"pending": 2, "busy": 1}
    states = {vm.name: vm.state for vm in fleet.store.get_vms(names)}
    assert states == {names[0]: "pending", names[1]: "reserved", names[2]: "pending"}
    assert fleet.redis.get(fleet.keys.lock("vm", names[1])) == other.id
    assert not any(fleet.redis.exists(fleet.keys.lock("vm", n)) for n in (names[0], names[2]))


def _round_trips_per_vm(redis_url: str, vms: int) -> dict[str, int]:
    """Client round trips of each batch step for ``vms`` one-VM requests (a fresh fleet
    whose clients count their writes; see tests/test_sweep_batching.py)."""
    trips = RoundTrips()
    client = trips.client(redis_url, decode=True)
    client.flushdb()
    fleet = make_fleet(client, make_config(ondemand_clone_limit=100))
    fleet.dispatch = BatchDispatcher(trips.client(redis_url, decode=False), fleet.keys)
    rids = [f"rt{i}" for i in range(vms)]
    for rid in rids:
        create_request(fleet.store, rid, [Slot("deb", "debian", 1)], fleet.config)
    fleet.dispatch.send(Job.PROVISION_REQUEST, rids)
    out: dict[str, int] = {}
    for step in (lifecycle.provision_batch, lifecycle.create_vm_batch,
                 lifecycle.check_pending_batch):  # fmt: skip
        before = trips.count
        assert "more" not in step(fleet)
        out[step.__name__] = trips.count - before
    assert all(fleet.store.get_request(rid).status == "ready" for rid in rids)  # type: ignore[union-attr]
    return out


def test_per_vm_round_trips_of_the_batch_steps(redis_url: str) -> None:
    """Proves: what each further VM costs a batch step in client round trips (the
    difference between 12 VMs and 2, per VM) is its own work only: a provider call and
    its transition, one lock check before the provider call; a reservation nothing (a
    claim's are one round trip); not a lock grant, a
    release, a read and a re-read, a clone slot's acquire, renewal or release, a status
    call and a dispatch of its own (a per-VM path costs 9-13 per VM and step). A check
    claim costs nothing per VM: its VMs' ready transitions are one script (one round
    trip per VM when each VM's vm_ready is its own call)."""
    _round_trips_per_vm(redis_url, 1)  # the scripts loaded: the first run pays their loads
    small = _round_trips_per_vm(redis_url, 2)
    big = _round_trips_per_vm(redis_url, 12)
    per_vm = {step: (big[step] - small[step]) / 10 for step in big}
    # reserve: nothing (the claim's reservations, each taking its clone slot, are one
    # round trip; one per VM when each request's step makes its own); create:
    # lock check, the provider's create, vm_created, which gives the slot back (the
    # claim's slots are renewed in one script); check: nothing (the claim's VMs are
    # asked in one status call, on the simulated provider one script, and recorded
    # ready in one script).
    assert per_vm["provision_batch"] <= 0.2, per_vm
    assert per_vm["create_vm_batch"] <= 4.0, per_vm
    assert per_vm["check_pending_batch"] <= 0.2, per_vm


def test_a_claims_own_round_trips(redis_url: str) -> None:
    """Proves: what a claim costs in round trips beyond its subjects' work. A check
    claim of 2 VMs: its claim, its locks' grant, the status call, the ready record, then
    its end (the locks released and the subjects marked done: one pipeline), and the
    empty claim that ends the job: 6 (7 with the end in two). A create claim takes its
    clone slots and checks its locks in one round trip before its provider call: the
    job's two claims (the first is of one VM) cost 19 (21 in two). A provision claim
    reads which lending pools hold a ready VM in the round trip that grants its locks:
    its job costs 8 (9 with the read a round trip of its own)."""
    _round_trips_per_vm(redis_url, 1)  # the scripts loaded
    small = _round_trips_per_vm(redis_url, 2)
    assert small["check_pending_batch"] <= 6, small
    assert small["create_vm_batch"] <= 19, small
    assert small["provision_batch"] <= 8, small


def test_a_create_claims_clone_slots_hold_the_limit(
    redis_client: redis.Redis, redis_url: str, monkeypatch: Any
) -> None:
    """Proves: when a create claim takes its VMs' clone slots in one script, the limit
    still holds: with the reservations' leases gone (lapsed) and 2 of 3 slots held by
    others, one VM is created and the other two wait ('throttled', still reserved),
    never more than 3 leases live; the created VM's slot is given back. The batch's
    first claim takes all three (as a claim after a fast first one does)."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = _batched_fleet(redis_client, redis_url, ondemand_clone_limit=3)
    create_request(fleet.store, "big", [Slot("deb", "debian", 3)], fleet.config)
    names = lifecycle.provision_request(fleet, "big")
    assert len(names) == 3 and fleet.slots.count() == 3
    fleet.redis.delete(fleet.keys.clone_slots)  # the three leases lapsed
    others = [("other-1", 0), ("other-2", 0)]
    assert fleet.slots.acquire_all(others) == {"other-1": True, "other-2": True}
    WorkSet(fleet.redis, fleet.keys).add("create_vm", names)
    assert lifecycle.create_vm_batch(fleet) == {"pending": 1, "throttled": 2}
    states = sorted(vm.state for vm in fleet.store.get_vms(names))
    assert states == ["pending", "reserved", "reserved"]
    assert sorted(fleet.slots.holders()) == ["other-1", "other-2"]


def _pending_vms(fleet: Fleet, n: int) -> list[str]:
    """``n`` one-VM requests reserved and created: their VMs booting, in the check set."""
    names: list[str] = []
    for i in range(n):
        create_request(fleet.store, f"p{i}", [Slot("deb", "debian", 1)], fleet.config)
        names += lifecycle.provision_request(fleet, f"p{i}")
    for name in names:
        assert lifecycle.create_vm(fleet, name) == "pending"
    WorkSet(fleet.redis, fleet.keys).add("check_pending_vm", names)
    return names


def test_a_check_claim_asks_its_provider_once_for_all_its_vms(
    redis_client: redis.Redis, monkeypatch: Any
) -> None:
    """Proves: a check batch asks a provider that answers for many (the simulated
    cloud) about its claim's booting VMs in one call, made after their locks were
    granted, and each VM's transition uses that answer (red when each VM asks alone:
    three calls of one name each)."""
    fleet = make_fleet(redis_client, make_config())
    names = _pending_vms(fleet, 3)
    sim = fleet.providers["sim"]
    asked: list[list[str]] = []
    statuses = sim.statuses  # type: ignore[attr-defined]

    def counted(vms: Sequence[str]) -> Any:
        asked.append(sorted(vms))
        assert all(fleet.redis.exists(fleet.keys.lock("vm", n)) for n in vms)  # locked
        return statuses(vms)

    monkeypatch.setattr(sim, "statuses", counted)
    assert lifecycle.check_pending_batch(fleet) == {"fulfilled": 3}
    assert asked == [sorted(names)]


def test_a_check_claim_whose_provider_fails_to_answer_asks_vm_by_vm(
    redis_client: redis.Redis, monkeypatch: Any
) -> None:
    """Proves: when the claim's one status call fails, nothing is lost: each VM asks
    the provider alone, as a per-VM check would, and turns ready."""
    fleet = make_fleet(redis_client, make_config())
    names = _pending_vms(fleet, 3)
    sim = fleet.providers["sim"]
    asked: list[list[str]] = []
    statuses = sim.statuses  # type: ignore[attr-defined]

    def first_fails(vms: Sequence[str]) -> Any:
        asked.append(sorted(vms))
        if len(asked) == 1:
            raise ConnectionError("the cloud's list call timed out")
        return statuses(vms)

    monkeypatch.setattr(sim, "statuses", first_fails)
    assert lifecycle.check_pending_batch(fleet) == {"fulfilled": 3}
    assert asked[0] == sorted(names)
    assert sorted(asked[1:]) == sorted([n] for n in names)

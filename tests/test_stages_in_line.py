"""Stages run in line: a batch job runs its claims' quick follow-up stages itself.

Proves: with a worker's pace (StagePace) that has seen quick creates and checks, one
provision batch job brings a request to ready (reserve, create, check) and queues no
create or check batch job; a stage that has been slow is queued as before; a stage run
in line that finds the job's time over queues a batch job for what the job held back,
so nothing waits for a sweep; a request's VMs still get one transition each.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import redis

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, batch, chain, stages
from vmpool.lifecycle.batch_time import StageTime
from vmpool.lifecycle.pace import RECENT_CLAIMS, StagePace
from vmpool.state.audit import check_trail
from vmpool.state.locks import grant_call, release_all, take_granted
from vmpool.state.records import Slot
from vmpool.state.workset import Claim, WorkSet
from workers.batching import BatchDispatcher

from lifecyclehelp import create_request, make_config, make_fleet
from redishelp import RoundTrips

QUICK, SLOW = 0.001, 1.0


def _fleet(client: redis.Redis, url: str, seconds: dict[Job, float]) -> Fleet:
    """A fleet as a worker builds it (batching dispatch, a pace) with ``seconds`` seen."""
    fleet = make_fleet(client, make_config())
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(url), fleet.keys)
    fleet.pace = StagePace()
    for job, took in seconds.items():
        fleet.pace.record(job, took, 1)
    return fleet


def _queued(client: redis.Redis, fleet: Fleet) -> list[Any]:
    return [
        *client.lrange(fleet.keys.rq_queue("vms"), 0, -1),
        *client.lrange(fleet.keys.rq_queue("requests"), 0, -1),
    ]


def _request(fleet: Fleet, rid: str, count: int = 2) -> None:
    create_request(fleet.store, rid, [Slot("deb", "debian", count)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, [rid])


def test_one_provision_job_brings_a_request_to_ready_when_its_stages_are_quick(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Red without stages in line: the job reserves and queues a create batch job. The
    check has no claim seen yet: it is taken for quick (QUICK_UNSEEN), so it runs too."""
    fleet = _fleet(redis_client, redis_url, {Job.CREATE_VM: QUICK})
    _request(fleet, "r1")
    counts = lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready", counts
    assert _queued(redis_client, fleet) == []  # no create or check batch job
    work = WorkSet(fleet.redis, fleet.keys)
    assert [work.size(j) for j in stages.STAGES] == [0, 0, 0]
    assert counts.get("create_vm:pending") == 2, counts  # both created, in this job
    trail = fleet.store.history("r1")
    assert check_trail("r1", trail) == []
    assert sum(1 for e in trail if e.entity.startswith("vm:")) == 2 * 3  # once each


def test_a_stage_not_seen_quick_is_queued_as_before(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """A create that took a second (a blocking clone), or none seen yet: queued."""
    for seen in ({Job.CREATE_VM: SLOW, Job.CHECK_PENDING_VM: QUICK}, {}):
        fleet = _fleet(redis_client, redis_url, seen)
        redis_client.flushdb()
        _request(fleet, "r1")
        lifecycle.provision_batch(fleet)
        request = fleet.store.get_request("r1")
        assert request is not None and request.status == "pending"
        assert WorkSet(fleet.redis, fleet.keys).size(Job.CREATE_VM) == 2
        assert any("create_vm_batch" in str(jid) for jid in _queued(redis_client, fleet))


def test_a_stage_in_line_out_of_time_queues_a_job_for_what_was_held_back(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's time ends between the hold of the creates and their run in line (a
    failpoint): the creates are queued as a dispatch would have, not left to a sweep,
    and the claim made ahead for them is let go, the locks granted with it released
    (red without: the queued job finds them claimed, or their locks held, and the
    request stays pending)."""
    quick = {Job.CREATE_VM: QUICK, Job.CHECK_PENDING_VM: QUICK}
    fleet = _fleet(redis_client, redis_url, quick)
    add_call = chain.Chain.add_call

    def add_then_time_over(chain: Any, job: Job, subjects: list[str]) -> Any:
        call = add_call(chain, job, subjects)
        chain.clock.deadline = chain.in_line_until = 0.0
        return call

    monkeypatch.setattr(chain.Chain, "add_call", add_then_time_over)
    _request(fleet, "r1")
    counts = lifecycle.provision_batch(fleet)
    assert counts.get("create_vm:more") == 1
    assert WorkSet(fleet.redis, fleet.keys).size(Job.CREATE_VM) == 2
    assert any("create_vm_batch" in str(jid) for jid in _queued(redis_client, fleet))
    assert redis_client.keys(fleet.keys.lock("*", "*")) == []
    monkeypatch.undo()
    lifecycle.create_vm_batch(fleet)  # the queued job: creates, and checks in line
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready"


def test_a_stage_is_quick_while_most_of_its_last_claims_were() -> None:
    pace = StagePace()
    assert not pace.quick(Job.CREATE_VM)  # a create none was seen of: it may block
    assert pace.quick(Job.CHECK_PENDING_VM) and pace.quick(Job.PROVISION_REQUEST)
    pace.record(Job.CREATE_VM, 2.0, 1)  # a blocking clone first: not quick
    assert not pace.quick(Job.CREATE_VM)
    pace.record(Job.CREATE_VM, 0.2, 20)  # 10 ms a VM: one of two, not more than half
    assert not pace.quick(Job.CREATE_VM)
    pace.record(Job.CREATE_VM, 0.001, 1)
    assert pace.quick(Job.CREATE_VM)  # two of three
    for _ in range(RECENT_CLAIMS):  # a provider whose creates block, from now on
        pace.record(Job.CREATE_VM, 1.5, 1)
        if not pace.quick(Job.CREATE_VM):
            break
    assert not pace.quick(Job.CREATE_VM)
    pace.record(Job.CHECK_PENDING_VM, 0.3, 1)  # a slow status call, seen first
    assert not pace.quick(Job.CHECK_PENDING_VM)
    slow_once = StagePace()
    for took in [0.001] * (RECENT_CLAIMS - 1) + [0.5]:  # one descheduled claim
        slow_once.record(Job.CREATE_VM, took, 1)
    assert slow_once.quick(Job.CREATE_VM)
    slow_once.record(Job.CREATE_VM, 5.0, 0)  # a claim that ran nothing says nothing
    assert slow_once.quick(Job.CREATE_VM)


def test_a_create_jobs_first_claim_is_of_one_vm_unless_creates_have_been_quick(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create batch job's first claim is kept to one VM (FIRST_CLAIM: a clone may
    block) while creates have not been quick here; once they have, it takes every
    reserved VM at once. Red with the first claim always of one: [1, 1]."""
    claim = WorkSet.claim
    sizes: list[int] = []

    def counted(work: WorkSet, job: Job, n: int, lease_s: float) -> Any:
        if job == Job.CREATE_VM:
            sizes.append(n)
        return claim(work, job, n, lease_s)

    monkeypatch.setattr(WorkSet, "claim", counted)
    firsts = []
    for seen in ({}, {Job.CREATE_VM: QUICK}):
        redis_client.flushdb()
        fleet = _fleet(redis_client, redis_url, seen)
        create_request(fleet.store, "r1", [Slot("deb", "debian", 3)], fleet.config)
        names = lifecycle.provision_request(fleet, "r1")
        WorkSet(fleet.redis, fleet.keys).add(Job.CREATE_VM, names)
        sizes.clear()
        lifecycle.create_vm_batch(fleet)
        firsts.append(sizes[0])
    assert firsts == [1, batch.CLAIM_SIZE]


def _round_trips_to_ready(url: str) -> int:
    """Client round trips of one provision job that brings a 2-VM request to ready,
    its create and check stages run in line (the scripts loaded by a run before)."""
    trips = RoundTrips()
    client = trips.client(url, decode=True)
    fleet = make_fleet(client, make_config())
    fleet.dispatch = BatchDispatcher(trips.client(url, decode=False), fleet.keys)
    fleet.pace = StagePace()
    fleet.pace.record(Job.CREATE_VM, QUICK, 1)
    client.flushdb()
    _request(fleet, "r1")
    before = trips.count
    lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready"
    return trips.count - before


def test_a_stage_run_in_line_claims_and_locks_in_the_round_trip_that_ended_the_claim_before(
    redis_url: str,
) -> None:
    """Proves: the first claim of a stage run in line rides on the round trip that ends
    the claim whose follow-ups it runs (its locks released, its subjects done): the
    create stage's on the provision claim's end, the check stage's on the create
    claim's, each with the grant of its subjects' locks. A provision job bringing a
    request to ready costs 13 round trips (its lending pools read with its locks'
    grant); 15 when each stage's grant is a round trip of its own, 17 when its claim
    is too."""
    _round_trips_to_ready(redis_url)
    assert _round_trips_to_ready(redis_url) <= 13


def test_a_create_claims_vms_made_at_once_are_run_even_once_its_time_is_over(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the stage's time ending in the course of a create claim whose VMs its
    provider made at once lets none of them go. Each one's step runs (recording its
    create, dispatching its check, handing on its slot's turn), none stays in the
    create work set to be claimed and locked again only to find itself created. Red
    before: one step ran, two VMs were let go, their steps not run."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = _fleet(redis_client, redis_url, {})
    create_request(fleet.store, "r1", [Slot("deb", "debian", 3)], fleet.config)
    names = lifecycle.provision_request(fleet, "r1")
    work = WorkSet(fleet.redis, fleet.keys)
    work.add(Job.CREATE_VM, names)
    calls = iter([False])  # the loop's first look: time left; every look after: over

    monkeypatch.setattr(StageTime, "over", lambda self: next(calls, True))
    counts = lifecycle.create_vm_batch(fleet)
    assert counts.get("pending") == 3, counts  # the job then stops on time ('more')
    assert work.size(Job.CREATE_VM) == 0
    assert all(vm.state == "pending" for vm in fleet.store.get_vms(names))


def test_a_claim_made_ahead_that_found_nothing_yet_claims_again(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a stage's claim made ahead that came back empty although its follow-ups
    were just added (the add's script was not on the server: answered NOSCRIPT, it ran
    again after the claim that followed it in the pipeline) claims again, so the
    follow-ups run in this job. Red before: the stage ended at its empty claim, the
    created VMs' follow-ups stayed in their work set with no job queued for them, and
    the request waited for a sweep (seen as a 10 s stall on a fresh Redis)."""
    fleet = _fleet(redis_client, redis_url, {Job.CREATE_VM: QUICK})
    _request(fleet, "r1")
    redis_client.script_flush()  # a fresh or restarted Redis: no script loaded
    WorkSet(fleet.redis, fleet.keys).claim(Job.CREATE_VM, 1, 10.0)  # the claim's only
    counts = lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready", counts
    assert _queued(redis_client, fleet) == []
    work = WorkSet(fleet.redis, fleet.keys)
    assert [work.size(j) for j in stages.STAGES] == [0, 0, 0]


def _round_trips_for_a_turn(url: str) -> tuple[int, int, int]:
    """Client round trips of one provision job that brings two 1-VM requests to ready at
    a clone limit of 1 (the second waits for the first's turn), and the provision claims
    and the provision grants it made on round trips of their own."""
    trips = RoundTrips()
    client = trips.client(url, decode=True)
    config = make_config()
    config = dataclasses.replace(config, ondemand_clone_limit=1)
    fleet = make_fleet(client, config)
    fleet.dispatch = BatchDispatcher(trips.client(url, decode=False), fleet.keys)
    # Quick however long one claim of this run takes (a loaded machine's claims would
    # otherwise turn the verdict to slow, and the stages would grant on their own).
    fleet.pace = StagePace(quick_s=math.inf)
    for _ in range(RECENT_CLAIMS):
        fleet.pace.record(Job.CREATE_VM, QUICK, 1)
        fleet.pace.record(Job.CHECK_PENDING_VM, QUICK, 1)
    client.flushdb()
    for rid in ("r1", "r2"):
        _request(fleet, rid, count=1)
    own = {"claims": 0, "grants": 0}
    claim, grant = WorkSet.claim, chain.acquire_all_reading

    def claimed(self: WorkSet, job: Job, size: int, lease_s: float) -> Any:
        own["claims"] += job == Job.PROVISION_REQUEST
        return claim(self, job, size, lease_s)

    def granted(locks: list[Any], reads: Any = None) -> Any:
        own["grants"] += locks[0].kind == "request"
        return grant(locks, reads)

    before = trips.count
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WorkSet, "claim", claimed)
        patch.setattr(chain, "acquire_all_reading", granted)
        lifecycle.provision_batch(fleet)
    for rid in ("r1", "r2"):
        request = fleet.store.get_request(rid)
        assert request is not None and request.status == "ready", rid
    trips_taken = trips.count - before
    assert client.keys(fleet.keys.lock("*", "*")) == []  # every lock granted ahead let go
    return trips_taken, own["claims"], own["grants"]


def test_a_turn_handed_back_to_the_open_provision_loop_is_claimed_on_the_create_claims_end(
    redis_url: str,
) -> None:
    """Proves: the turn a create hands back (its VM created, its clone slot free for the
    next request in line) is claimed by the provision loop still open in this job in the
    round trip that ends the create claim, not in one of its own after the check stage:
    at a clone limit of 1, two requests come to ready with the provision loop claiming
    on its own only at its start and at its end (finding nothing), not for the turn.
    Red before: a claim of its own for the turn too (three), after the check stage."""
    _round_trips_for_a_turn(redis_url)  # the scripts loaded
    _, own_claims, _ = _round_trips_for_a_turn(redis_url)
    assert own_claims <= 2


def test_the_locks_of_a_provision_claim_made_ahead_ride_on_the_next_claims_end(
    redis_url: str,
) -> None:
    """Proves: the provision loop's claim made ahead on a create claim's end (the turn it
    hands back) has its locks granted, with its read of the lending pools, on the end of
    the check claim that runs before it: the loop grants locks on its own only for its
    first claim. The run takes 23 round trips (24 with that grant a round trip of its
    own, 28 with the create and check stages' grants too). Red before: two grants of its
    own."""
    _round_trips_for_a_turn(redis_url)  # the scripts loaded
    trips, _, own_grants = _round_trips_for_a_turn(redis_url)
    assert own_grants == 1
    assert trips <= 23


def test_a_reading_claim_whose_locks_were_not_all_granted_ahead_asks_them_all_again(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a provision claim (a Reading: its read of the lending pools goes with its
    grant) that got a subject whose lock was not granted ahead lets go of those that
    were and asks every lock again, its read made with them, not the one made ahead:
    what it reads rests on locks it holds. Red with the read made ahead used anyway."""
    fleet = _fleet(redis_client, redis_url, {})
    for rid in ("r1", "r2"):
        _request(fleet, rid, count=1)
    early = fleet.lock("request", "r1", "provision", read_record=True)
    assert take_granted([early], grant_call([early]).run()) == [early]
    made = chain.Ahead(Claim("c1", ["r1", "r2"]), {"r1": early}, True, reads=["made ahead"])
    seen: list[Any] = []

    def prepare(fleet: Fleet, locks: list[Any], replies: list[Any]) -> chain.Prepared:
        seen.extend(replies)
        return chain.Prepared({})

    reading = chain.Reading(lambda fleet, pipe: pipe.get("vmpool:nothing"), prepare)
    held, _ = chain.grant_claim(fleet, ("request", "provision"), made, reading)
    assert sorted(held) == ["r1", "r2"]
    assert held["r1"] is not early and not early.held
    assert seen == [None]
    release_all(list(held.values()))


def test_a_claims_locks_are_let_go_when_its_per_claim_work_fails(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Proves: a claim whose per-claim work raises after its grant (Redis gone in the
    create claim's slots call, say) lets go of every lock it was granted, those granted
    ahead included: the claim never held them, so its end would not release them, and
    the renewer would keep them taken for as long as the worker lives. Red before: both
    locks still held after the error."""
    fleet = _fleet(redis_client, redis_url, {})
    for rid in ("r1", "r2"):
        _request(fleet, rid, count=1)
    early = fleet.lock("request", "r1", "provision", read_record=True)
    assert take_granted([early], grant_call([early]).run()) == [early]
    made = chain.Ahead(Claim("c1", ["r1", "r2"]), {"r1": early}, True)

    def failing(fleet: Fleet, locks: list[Any]) -> chain.Prepared:
        raise redis.ConnectionError("gone")

    with pytest.raises(redis.ConnectionError):
        chain.grant_claim(fleet, ("request", "provision"), made, failing)
    assert redis_client.keys(fleet.keys.lock("*", "*")) == []
    assert not early.held

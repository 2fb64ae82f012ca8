"""A batch job gives its worker back to a waiting sweep (vmpool/lifecycle/batch.py).

Proves: a batch job that still has time and work left stops at the next subject once a
sweep waits in the sweeps queue. It returns 'more' (its continuation is queued behind
the sweep), and the subjects it has not started go back in line. The expiry sweep's
settle bound (TTL plus one sweep interval) rests on a worker taking the sweep within
the scheduler's lead, a quarter of the interval. A batch job may run for
``BATCH_TIME_S`` (a second), longer than that lead: with both workers in such jobs the
sweep waited up to a second, and the chaos soaks saw requests fail up to 0.67 s past
TTL + sweep. A job that ran for a second without any sweep waiting is not cut short.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from batchhelp import FirstCreateWaits, OneByOne, batched_fleet, reserved

from vmpool.ids import Job
from vmpool.lifecycle import Fleet, batch, batch_time, create_vm_batch, provision_batch
from vmpool.lifecycle.pace import StagePace
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.queues import enqueue

from lifecyclehelp import create_request, make_config


def _first_create_blocked(fleet: Fleet, n: int) -> tuple[FirstCreateWaits, list[str]]:
    names = reserved(fleet, n)
    slow = FirstCreateWaits(fleet.providers["sim"])  # type: ignore[arg-type]
    fleet.providers = {"sim": slow}
    return slow, names


def _run_in_thread(fleet: Fleet, counts: dict[str, int]) -> threading.Thread:
    worker = threading.Thread(target=lambda: counts.update(create_vm_batch(fleet)))
    worker.start()
    return worker


@pytest.mark.parametrize("sweep_waits", [True, False])
def test_a_batch_job_stops_at_the_next_subject_once_a_sweep_waits(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, sweep_waits: bool
) -> None:
    """Red before: the job ran its claim's other creates (its time was not over) while
    the expiry sweep waited in its queue. The claim holds five creates (as a claim after
    a fast first one may); the first is held in the provider until the sweep is queued.
    Without a sweep waiting, all five run in the one job."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    monkeypatch.setattr(batch_time, "SWEEP_POLL_S", 0.0)  # look at every subject: no clock
    fleet = batched_fleet(redis_client, redis_url, sim_options=None)
    slow, names = _first_create_blocked(fleet, 5)
    counts: dict[str, int] = {}
    worker = _run_in_thread(fleet, counts)
    try:
        assert slow.inside.wait(10)
        if sweep_waits:  # the scheduler queues the expiry sweep meanwhile
            enqueue(redis.Redis.from_url(redis_url), fleet.keys, Job.SWEEP_EXPIRED)
    finally:
        slow.go.set()
        worker.join(30)
    assert not worker.is_alive()
    work = WorkSet(fleet.redis, fleet.keys)
    if sweep_waits:
        assert counts == {"pending": 1, "more": 1}, counts
        assert work.size("create_vm") == 4  # the others, back in line for the continuation
    else:
        assert counts == {"pending": 5}, counts
        assert work.size("create_vm") == 0
    created = [fleet.store.get_vm(n) for n in names]
    assert sum(vm is not None and vm.state == "pending" for vm in created) == counts["pending"]


def test_a_job_looks_at_the_sweeps_queue_only_after_its_poll_interval(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check costs a read: a job that ends within ``SWEEP_POLL_S`` makes none (a
    waiting sweep is taken at the next dequeue anyway). The default interval is well
    within the expiry sweep's lead."""
    monkeypatch.setattr(batch_time, "SWEEP_POLL_S", 60.0)
    fleet = batched_fleet(redis_client, redis_url)
    reserved(fleet, 3)
    enqueue(redis.Redis.from_url(redis_url), fleet.keys, Job.SWEEP_EXPIRED)
    looked: list[Any] = []
    dispatch: Any = fleet.dispatch
    original = dispatch.sweep_waiting
    dispatch.sweep_waiting = lambda: looked.append(1) or original()
    counts = create_vm_batch(fleet)
    assert counts == {"pending": 3}, counts
    assert looked == []
    monkeypatch.undo()
    assert make_config().schedule.sweep_expired / 4 > 2 * batch_time.SWEEP_POLL_S


class _SweepQueuedAtFirstCreate(OneByOne):
    """The simulated provider, one VM per call; its first create queues the expiry sweep
    first (the scheduler's move lands while the job runs its creates in line)."""

    def __init__(self, fleet: Fleet, url: str) -> None:
        self.sim = fleet.providers["sim"]  # type: ignore[assignment]
        self.keys = fleet.keys
        self.url = url
        self.creates = 0

    def create_vm(self, pool: str, template: str, vm_name: str) -> Any:
        self.creates += 1
        if self.creates == 1:
            enqueue(redis.Redis.from_url(self.url), self.keys, Job.SWEEP_EXPIRED)
        return self.sim.create_vm(pool, template, vm_name)


def test_stages_run_in_line_stop_for_a_waiting_sweep_and_queue_what_they_held(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provision job whose creates run in line (a worker's pace has seen them quick)
    stops after the create that saw the sweep queued: the rest of the creates, and the
    checks, are queued as batch jobs (behind the sweep), not run in this job. Red without
    the look at the sweeps' queue: the job ran every create and check in line and the
    request was ready before the sweep could run."""
    monkeypatch.setattr(batch_time, "SWEEP_POLL_S", 0.0)
    fleet = batched_fleet(redis_client, redis_url)
    fleet.pace = StagePace()
    fleet.pace.record(Job.CREATE_VM, 0.001, 1)
    provider = _SweepQueuedAtFirstCreate(fleet, redis_url)
    fleet.providers = {"sim": provider}  # type: ignore[dict-item]
    create_request(fleet.store, "r1", [Slot("deb", "debian", 4)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, ["r1"])
    counts = provision_batch(fleet)
    assert provider.creates == 1, counts
    assert counts.get("create_vm:more") == 1, counts
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "pending"
    work = WorkSet(fleet.redis, fleet.keys)
    assert work.size(Job.CREATE_VM) == 3  # queued for their own job
    queued = redis_client.lrange(fleet.keys.rq_queue("vms"), 0, -1)
    assert queued, "the creates held back for the job were not queued"

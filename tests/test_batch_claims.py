"""A batch job's claim while it works (vmpool/lifecycle/batch.py).

Proves: a subject whose lock another worker holds stays in its work set ('busy' defers
it) and is run once the other holder is gone, and the next pending sweep has a batch
job queued for it; a claim's lease is renewed for as long as its subject runs (no second
batch job takes a subject in flight); and one slow create does not hold the claim's
other subjects: once the batch's time is over, the ones it has not started are let go
(their locks released, back in line), and another worker creates them meanwhile.
"""

from __future__ import annotations

import threading

import pytest
import redis
from batchhelp import FirstCreateWaits, batched_fleet, reserved

from vmpool import lifecycle
from vmpool.lifecycle import batch
from vmpool.state.workset import WorkSet

from lifecyclehelp import make_fleet
from storehelp import wait_until


def test_a_busy_subject_stays_in_its_work_set_and_is_run_later(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """Red before: the batch counted the subject 'busy' and removed it from the set;
    when the other holder stopped, nothing brought it back until the stale-reservation
    pass (10 s or more)."""
    fleet = batched_fleet(redis_client, redis_url)
    (name,) = reserved(fleet, 1)
    other = fleet.lock("vm", name, "create")
    assert other.acquire()  # another worker is on it
    assert lifecycle.create_vm_batch(fleet) == {"busy": 1}
    work = WorkSet(fleet.redis, fleet.keys)
    assert work.size("create_vm") == 1, "the busy subject left its work set"
    other.release()  # ...and then it stopped without creating the VM
    # the deferral ends (aged rather than waited for): the pending sweep sees it due and
    # dispatches it (a batch job is queued), and the batch job runs it
    fleet.redis.zadd(fleet.keys.work_part("create_vm", "claims"), {name: 1}, xx=True)
    assert lifecycle.check_pending_sweep(fleet) == 1
    assert lifecycle.create_vm_batch(fleet) == {"pending": 1}
    assert work.size("create_vm") == 0


@pytest.mark.slow
def test_a_slow_create_keeps_its_claim_and_lets_the_others_go(
    redis_client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red before: the claim's lease ran out under the slow create (a second batch job
    claimed the subject in flight, found it busy and dropped it), and the other subject
    of the claim stayed locked, renewed, until the slow create returned (a cloud create
    retries for up to 60 s). The claim holds both creates (as a claim after a fast first
    one may: a batch's first claim takes one create)."""
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})
    fleet = batched_fleet(redis_client, redis_url, lock_expire_s=1)  # claim lease 1 s
    names = reserved(fleet, 2)
    slow = FirstCreateWaits(fleet.providers["sim"])  # type: ignore[arg-type]
    fleet.providers = {"sim": slow}
    counts: dict[str, int] = {}
    worker = threading.Thread(target=lambda: counts.update(lifecycle.create_vm_batch(fleet)))
    worker.start()
    try:
        assert slow.inside.wait(10)
        (other,) = [n for n in names if n != slow.first]
        started = fleet.store.server_time()
        # the other subject is let go once the batch's time is over: its lock is free
        wait_until(lambda: not fleet.redis.exists(fleet.keys.lock("vm", other)), 10)
        # and the claim of the slow one outlives its first lease (passing time is what
        # is tested: the lease is renewed while the create runs)
        wait_until(lambda: fleet.store.server_time() > started + 1.5, 10)
        second = make_fleet(redis_client, fleet.config, actor="worker:test:2")
        second.dispatch = fleet.dispatch
        assert lifecycle.create_vm_batch(second) == {"pending": 1}  # the other one only
        vm = fleet.store.get_vm(other)
        assert vm is not None and vm.state == "pending"
    finally:
        slow.go.set()
        worker.join(30)
    assert counts.get("pending") == 1 and counts.get("released") == 1, counts
    assert WorkSet(fleet.redis, fleet.keys).size("create_vm") == 0
    assert batch.BATCH_TIME_S <= 1.0  # the bound the test waits within

"""The fleet-wide clone semaphore (vmpool/state/semaphore.py) against a real Redis."""

from __future__ import annotations

import threading

import pytest
import redis

from vmpool.state.keys import Keys
from vmpool.state.semaphore import CloneSemaphore, SlotStats

from storehelp import poll


def test_limit_holds_under_concurrent_acquirers(redis_url: str, keys: Keys) -> None:
    """Proves: 24 threads, each with its own connection (as separate worker processes
    would have), acquiring at the same moment get exactly `limit` slots. A check-then-add
    done in two round trips would let several through at once; the barrier makes them
    race for real, so this fails if the check and the add ever stop being one unit."""
    limit = 5
    clients = [redis.Redis.from_url(redis_url, decode_responses=True) for _ in range(24)]
    clients[0].flushdb()
    sems = [CloneSemaphore(c, keys, limit=limit, lease_s=60) for c in clients]
    barrier = threading.Barrier(len(sems))
    granted: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        lease = sems[i].acquire(f"vm-{i}")
        if lease is not None:
            with lock:
                granted.append(lease)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(sems))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == limit
    assert sems[0].count() == limit
    for c in clients:
        c.close()


def test_two_instances_share_one_limit(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: the limit is fleet-wide, not per process: two semaphores (two workers)
    see each other's leases; the second cannot exceed what the first left."""
    a = CloneSemaphore(redis_client, keys, limit=2, lease_s=60)
    b = CloneSemaphore(redis_client, keys, limit=2, lease_s=60)
    assert a.acquire("vm-a") == "vm-a"
    assert b.acquire("vm-b") == "vm-b"
    assert a.acquire("vm-c") is None
    assert b.acquire("vm-c") is None
    assert b.release("vm-a") is True  # any process may release a lease by its id
    assert a.acquire("vm-c") == "vm-c"
    assert a.count() == b.count() == 2


def test_reacquire_renews_without_taking_a_second_slot(
    redis_client: redis.Redis, keys: Keys
) -> None:
    sem = CloneSemaphore(redis_client, keys, limit=2, lease_s=60)
    assert sem.acquire("vm-a") == "vm-a"
    assert sem.acquire("vm-a") == "vm-a"  # a create job run twice
    assert sem.count() == 1
    assert sem.acquire("vm-b") == "vm-b"
    assert sem.acquire("vm-a") == "vm-a"  # renewal works even when full
    assert sem.acquire("vm-c") is None


def test_killed_holders_lease_comes_back_by_itself(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: a holder that never releases (a SIGKILLed worker) loses its slot when
    the lease expires, with nobody cleaning up; before expiry the slot stays taken."""
    dead = CloneSemaphore(redis_client, keys, limit=1, lease_s=0.3)
    alive = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    assert dead.acquire("vm-dead") == "vm-dead"
    del dead  # "killed": it will never release
    assert alive.acquire("vm-next") is None
    assert poll(lambda: alive.acquire("vm-next") is not None, timeout_s=5)
    assert alive.count() == 1
    assert alive.holders() == ["vm-next"]


def test_release_is_idempotent_and_reports(redis_client: redis.Redis, keys: Keys) -> None:
    sem = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    assert sem.release("nobody") is False
    sem.acquire("vm-a")
    assert sem.release("vm-a") is True
    assert sem.release("vm-a") is False
    assert sem.count() == 0


def test_a_lease_with_no_holder_recorded_is_released_as_token_zeros(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: release looks a lease up by its holder first, and a lease written with
    no holder (before holders were kept) is still released by any token, as token 0's;
    a holder's lease is released only by its holder or a newer one, and only once."""
    sem = CloneSemaphore(redis_client, keys, limit=2, lease_s=60)
    redis_client.zadd(keys.clone_slots, {"vm-old": 2e9})  # a lease with no holder
    assert sem.release("vm-old", 3) is True and sem.count() == 0
    assert sem.release("vm-old", 3) is False
    assert sem.acquire("vm-a", 4) == "vm-a"
    assert sem.release("vm-a", 3) is False and sem.count() == 1
    assert sem.release("vm-a", 4) is True and sem.count() == 0
    assert redis_client.hlen(keys.clone_slot_holders) == 0


def test_rejects_nonsense_limits(redis_client: redis.Redis, keys: Keys) -> None:
    with pytest.raises(ValueError):
        CloneSemaphore(redis_client, keys, limit=0, lease_s=1)
    with pytest.raises(ValueError):
        CloneSemaphore(redis_client, keys, limit=1, lease_s=0)


def test_keys_live_under_the_prefix(redis_client: redis.Redis) -> None:
    keys = Keys("othertenant")
    sem = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    sem.acquire("vm-a")
    assert sorted(redis_client.keys("*")) == [
        "othertenant:clone-slots",
        "othertenant:clone-slots:holders",
        "othertenant:clone-slots:stats",
    ]


def test_acquire_all_takes_each_in_turn_within_the_limit(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: one call for many holders (a create claim's VMs) is the same as acquiring
    each in turn: a live lease is renewed without a second slot, new ones are taken
    while slots are free, and the rest are refused; the limit holds."""
    sem = CloneSemaphore(redis_client, keys, limit=3, lease_s=60)
    assert sem.acquire("a") == "a"
    got = sem.acquire_all([("a", 0), ("b", 0), ("c", 0), ("d", 0), ("a", 0)])
    assert got == {"a": True, "b": True, "c": True, "d": False}
    assert sem.count() == 3 and sorted(sem.holders()) == ["a", "b", "c"]
    assert sem.acquire_all([]) == {}


def test_a_lease_is_released_and_renewed_by_its_holder_only(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: the token decides. A newer token (a later grant of the VM's lock) takes
    a lease over; an older one can neither take it back, nor release it, nor renew it;
    the newer holder releases it."""
    sem = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    assert sem.acquire("vm-a") == "vm-a"  # at the reservation: token 0
    assert sem.acquire("vm-a", 5) == "vm-a"  # the create under fence 5 takes it over
    assert sem.acquire("vm-a", 7) == "vm-a"  # a newer creator (fence 7) takes it over
    assert sem.acquire("vm-a", 5) is None  # the older cannot take it back
    assert sem.release("vm-a", 5) is False  # nor release it
    assert sem._renew(("vm-a", 5)) is False  # its renewals stop
    assert sem.count() == 1 and sem.acquire("vm-b") is None
    assert sem.release("vm-a", 7) is True
    assert sem.stats().peak == 1 and sem.stats().overruns == 0


def test_a_lapsed_lease_renewed_with_no_slot_free_is_an_overrun(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: a create whose lease lapsed (its process paused past it) while another
    took the last slot is re-registered over the limit when it renews (its clone is
    under way) and counted: the peak shows the limit exceeded, and no new slot is
    granted until the count is back under the limit."""
    sem = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    assert sem.acquire("vm-a", 3) == "vm-a"
    redis_client.zadd(keys.clone_slots, {"vm-a": 1}, xx=True)  # lapsed
    assert sem.acquire("vm-b", 4) == "vm-b"  # the slot went to another create
    assert sem._renew(("vm-a", 3)) is True  # vm-a's create goes on, counted
    assert sem.stats() == SlotStats(live=2, peak=2, overruns=1)
    assert sem.acquire("vm-c") is None
    assert sem.release("vm-a", 3) and sem.release("vm-b", 4)
    assert sem.acquire("vm-c") == "vm-c"

"""Fenced locks (vmpool/state/locks.py) against a real Redis, with the store as the resource
they protect."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from vmpool.state.keys import Keys
from vmpool.state.locks import (
    FencedLock,
    LockBusy,
    LockLost,
    LockRenewer,
    acquire_all,
    acquire_all_reading,
    release_all,
)
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store

from storehelp import poll


def reserved_vm(store: Store, rid: str = "r1", name: str = "vm-one") -> str:
    store.create_request(rid, [Slot("deb", "debian", 1)], RequestSettings(ttl_s=600), actor="t")
    out = store.reserve_vm(
        rid,
        name=name,
        alias="deb",
        pool="debian",
        template="debian-12",
        provider="sim",
        domain=None,
        actor="t",
    )
    assert out.ok, out
    return name


def force_expire(client: redis.Redis, key: str) -> None:
    """The lock's lease runs out while its holder is paused (what SIGSTOP does)."""
    client.pexpire(key, 1)
    assert poll(lambda: client.exists(key) == 0)


def test_second_acquirer_is_busy_and_fences_increase(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: while one holder has the lock, a non-blocking acquirer gets 'busy'; each
    grant gets a larger fencing token than the one before."""
    first = FencedLock(redis_client, keys, "request", "r1", expire_s=60, holder="a")
    second = FencedLock(redis_client, keys, "request", "r1", expire_s=60, holder="b")
    with first:
        assert first.fence == 1
        assert second.acquire() is False
        with pytest.raises(LockBusy):
            second.__enter__()
        first.ensure_held()
    assert redis_client.exists(keys.lock("request", "r1")) == 0
    with second:
        assert second.fence == 2
    assert int(redis_client.get(keys.request_fence("r1")) or 0) == 2


def test_lock_key_is_the_schema_key(redis_client: redis.Redis, keys: Keys) -> None:
    """The lock lives at keys.lock(kind, subject) (under the prefix), not at
    python-redis-lock's own 'lock:<name>'."""
    with FencedLock(redis_client, keys, "vm", "vm-one", expire_s=60, holder="a") as lock:
        assert redis_client.get(keys.lock("vm", "vm-one")) == lock.id
        assert all(str(k).startswith("vmpool:") for k in redis_client.keys("*"))


def test_stale_holder_is_refused_by_the_store(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: a holder whose lock expired while it was paused, and was granted to
    another worker, (1) is told by ensure_held (LockLost), and (2) even if it goes on
    regardless, the store refuses its write with 'stale_fence' while the new holder's
    write succeeds. The last step shows the test can fail: the very same stale write
    without its fence goes through, which is what happens without fencing."""
    store = Store(redis_client, keys)
    name = reserved_vm(store)
    stale = FencedLock(
        redis_client, keys, "vm", name, expire_s=1, holder="paused", auto_renewal=False
    )
    assert stale.acquire()
    force_expire(redis_client, keys.lock("vm", name))
    fresh = FencedLock(redis_client, keys, "vm", name, expire_s=60, holder="fresh")
    assert fresh.acquire()
    assert fresh.fence > stale.fence

    with pytest.raises(LockLost):
        stale.ensure_held()
    refused = store.vm_created(name, actor="paused", fence=stale.fence)
    assert (refused.ok, refused.code) == (False, "stale_fence")
    vm = store.get_vm(name)
    assert vm is not None and vm.state == "reserved"

    # Without the fence, the stale holder's write would have gone through:
    unfenced = store.vm_created(name, actor="paused")
    assert unfenced.ok and unfenced.code == "pending"
    # ...and the rightful holder then finds its work already done by a stale writer.
    assert store.vm_created(name, actor="fresh", fence=fresh.fence).code == "vm_pending"

    stale.release()  # logs, does not raise, and leaves the new owner's lock alone
    assert redis_client.get(keys.lock("vm", name)) == fresh.id
    fresh.release()


def test_request_fence_guards_reservations(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: reserve_vm under a request lock that was lost and re-granted is refused,
    so a paused provisioner cannot over-reserve; the new holder reserves normally."""
    store = Store(redis_client, keys)
    store.create_request("r2", [Slot("deb", "debian", 2)], RequestSettings(ttl_s=600), actor="t")
    stale = FencedLock(redis_client, keys, "request", "r2", expire_s=1, auto_renewal=False)
    assert stale.acquire()
    force_expire(redis_client, keys.lock("request", "r2"))
    fresh = FencedLock(redis_client, keys, "request", "r2", expire_s=60)
    assert fresh.acquire()
    common: dict[str, Any] = dict(
        alias="deb", pool="debian", template="t", provider="sim", domain=None
    )
    out = store.reserve_vm("r2", name="vm-stale", actor="stale", fence=stale.fence, **common)
    assert out.code == "stale_fence"
    out = store.reserve_vm("r2", name="vm-fresh", actor="fresh", fence=fresh.fence, **common)
    assert out.ok
    fresh.release()


def test_silent_renewal_death_is_noticed(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: with auto-renewal on, a lost lock is still noticed by ensure_held.
    python-redis-lock's renewal thread dies with NotAcquired and tells nobody; the
    holder's own check is what catches it."""
    lock = FencedLock(redis_client, keys, "vm", "vm-two", expire_s=1, holder="a")
    assert lock.acquire()
    key = keys.lock("vm", "vm-two")
    redis_client.set(key, "someone-else", px=60_000)  # expired and taken by another
    with pytest.raises(LockLost):
        lock.ensure_held()
    lock.release()
    assert redis_client.get(key) == "someone-else"


@pytest.mark.slow
def test_auto_renewal_keeps_a_slow_holder(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: a holder working longer than the expiry keeps its lock (renewal), so a
    second acquirer stays 'busy' and the holder's fence stays current."""
    lock = FencedLock(redis_client, keys, "vm", "vm-three", expire_s=1, holder="slow")
    other = FencedLock(redis_client, keys, "vm", "vm-three", expire_s=1, holder="other")
    with lock:
        started = time.monotonic()
        key = keys.lock("vm", "vm-three")
        # 1.6 s of "work", longer than the 1 s expiry: the key must hold our id throughout
        # (without renewal it is gone after 1 s and the poll below fails).
        assert poll(
            lambda: redis_client.get(key) != lock.id or time.monotonic() - started > 1.6, 3.0
        )
        assert redis_client.get(key) == lock.id
        assert other.acquire() is False
        lock.ensure_held()


@pytest.mark.slow
def test_blocking_acquire_waits_for_release(redis_client: redis.Redis, keys: Keys) -> None:
    holder = FencedLock(redis_client, keys, "vm", "vm-four", expire_s=60)
    assert holder.acquire()
    waiter = FencedLock(
        redis_client, keys, "vm", "vm-four", expire_s=60, blocking=True, timeout_s=1
    )
    assert waiter.acquire() is False  # timed out while held
    holder.release()
    assert waiter.acquire() is True
    assert waiter.fence == 2
    waiter.release()


def test_fence_of_a_subject_without_record_gets_a_ttl(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """A lock taken on a VM with no record (reconcile of a leak) leaves no eternal key."""
    with FencedLock(redis_client, keys, "vm", "vm-gone", expire_s=60, orphan_fence_ttl_s=30):
        pass
    ttl = redis_client.pttl(keys.vm_fence("vm-gone"))
    assert 0 < ttl <= 30_000


def test_a_first_fence_follows_its_subjects_ttl_when_the_grant_reads_the_record(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """A grant that reads the record (read_record) knows a live subject has no TTL and a
    missing one none either, without asking: the counter of a live VM or pending
    request gets none, of a tombstone the tombstone's, of no record the orphan TTL."""
    store = Store(redis_client, keys)
    name = reserved_vm(store)
    redis_client.hset(keys.vm("vm-dead"), mapping={"state": "destroyed", "name": "vm-dead"})
    redis_client.pexpire(keys.vm("vm-dead"), 50_000)
    redis_client.hset(keys.request("r-done"), mapping={"status": "ready", "id": "r-done"})
    redis_client.pexpire(keys.request("r-done"), 40_000)

    def lock(kind: Any, subject: str) -> FencedLock:
        return FencedLock(redis_client, keys, kind, subject, expire_s=60,
                          orphan_fence_ttl_s=30, read_record=True)  # fmt: skip

    locks = [lock("vm", name), lock("request", "r1"), lock("vm", "vm-dead"),
             lock("request", "r-done"), lock("vm", "vm-none")]  # fmt: skip
    assert len(acquire_all(locks)) == 5
    assert [lk.fence for lk in locks] == [1, 1, 1, 1, 1]
    assert redis_client.pttl(keys.vm_fence(name)) == -1
    assert redis_client.pttl(keys.request_fence("r1")) == -1
    assert 30_000 < redis_client.pttl(keys.vm_fence("vm-dead")) <= 50_000
    assert 20_000 < redis_client.pttl(keys.request_fence("r-done")) <= 40_000
    assert 0 < redis_client.pttl(keys.vm_fence("vm-none")) <= 30_000
    assert locks[0].record["state"] == "reserved" and locks[4].record == {}
    release_all(locks)


@pytest.mark.slow
def test_error_after_grant_leaves_no_renewed_lease(
    redis_client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: when the grant's reply is lost (Redis restarting right after the grant
    ran: seen in the chaos soak, seed 11), the lease is not kept alive by a renewal
    thread. The lock was then a SET NX (which started python-redis-lock's renewal
    thread) followed by the fencing-token script; when the second failed, the thread
    went on renewing the lock of a job that had already failed, in a worker that lived
    on, and every later job on that VM answered 'busy': a completed VM was never
    destroyed. Whatever the grant's shape, the key must now expire within its lease."""
    renewer = LockRenewer()
    lock = FencedLock(redis_client, keys, "vm", "vm-one", expire_s=1, holder="w", renewer=renewer)
    granted = lock._grant

    def lost_reply(*args: Any, **kwargs: Any) -> int:
        granted(*args, **kwargs)  # the grant happens in Redis ...
        raise redis.ConnectionError("Connection reset by peer")  # ... its answer is lost

    monkeypatch.setattr(lock, "_grant", lost_reply)
    with pytest.raises(redis.ConnectionError):
        lock.acquire()
    assert lock.held is False
    assert redis_client.exists(lock.key) == 1  # granted in Redis, unknown to the holder
    # Renewal (every 2/3 of the 1 s lease) would keep the key forever; without it the
    # key is gone within the lease.
    key = lock.key  # the lock object stays referenced: a renewal could live on
    assert poll(lambda: redis_client.exists(key) == 0, timeout_s=4.0)
    other = FencedLock(redis_client, keys, "vm", "vm-one", expire_s=1, holder="x", renewer=renewer)
    assert other.acquire() is True  # the next job on the VM is not 'busy'
    other.release()
    assert lock.fence == 0


def test_acquire_all_grants_each_lock_on_its_own(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: a batch grant (one script for many subjects) grants each free lock with
    its own token and record, refuses a held one without stopping the others, and a
    batch release deletes only the locks still ours (one taken over meanwhile by
    another holder is left to it)."""
    store = Store(redis_client, keys)
    names = [reserved_vm(store, f"r-all-{i}", f"vm-all-{i}") for i in range(3)]
    other = FencedLock(redis_client, keys, "vm", names[1], expire_s=60, holder="other")
    assert other.acquire()
    asked = [
        FencedLock(redis_client, keys, "vm", n, expire_s=60, holder="batch", read_record=True)
        for n in names
    ]
    granted = acquire_all(asked)
    assert [lk.subject for lk in granted] == [names[0], names[2]]
    assert not asked[1].held and asked[1].record == {}
    for lock in granted:
        assert lock.fence == 1 and lock.record["name"] == lock.subject
        assert lock.record["state"] == "reserved"
        assert redis_client.get(keys.lock("vm", lock.subject)) == lock.id
    # the first lock expires and goes to another holder before the batch releases
    force_expire(redis_client, keys.lock("vm", names[0]))
    taker = FencedLock(redis_client, keys, "vm", names[0], expire_s=60, holder="taker")
    assert taker.acquire() and taker.fence == 2
    release_all(granted)
    assert redis_client.get(keys.lock("vm", names[0])) == taker.id  # not ours: kept
    assert redis_client.exists(keys.lock("vm", names[2])) == 0  # ours: released
    assert redis_client.get(keys.lock("vm", names[1])) == other.id
    assert not any(lk.held for lk in granted)


def test_ensure_held_writes_nothing(redis_client: redis.Redis, keys: Keys) -> None:
    """Proves: the ownership check before a provider call is a read: it leaves the
    lock's expiry to the renewer and makes no write (under ``appendfsync always`` a
    write costs an fsync), where an extend would write."""
    lock = FencedLock(redis_client, keys, "vm", "vm-read", expire_s=60, auto_renewal=False)
    assert lock.acquire()
    redis_client.pexpire(lock.key, 30_000)

    def writes() -> int:
        return int(redis_client.info("persistence")["rdb_changes_since_last_save"])

    before = writes()
    lock.ensure_held()
    assert writes() == before
    assert 0 < redis_client.pttl(lock.key) <= 30_000
    lock.release()


def test_a_grant_with_reads_answers_both_even_after_a_script_flush(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: reads queued with a batch grant (a provision claim's read of its lending
    pools) come back after the grant's reply, read after it; with the server's scripts
    flushed (a restart) the grant is loaded and run again, and the reads read again
    after it, so the replies still say what the state was after the grant."""
    store = Store(redis_client, keys)
    names = [reserved_vm(store, f"r-rd-{i}", f"vm-rd-{i}") for i in range(2)]

    def reads(pipe: Any) -> None:
        pipe.exists(keys.lock("vm", names[0]))
        pipe.zcard("no-such-set")

    for flushed in (False, True):
        if flushed:
            redis_client.script_flush()
        asked = [FencedLock(redis_client, keys, "vm", n, expire_s=60) for n in names]
        granted, replies = acquire_all_reading(asked, reads)
        assert [lk.subject for lk in granted] == names
        assert replies == [1, 0]  # the lock, granted before the read
        release_all(granted)

"""Quotas per user in the store: counted and checked inside the units that reserve and
free VMs (vmpool/state/scripts/_quota.lua), so no interleaving of callers exceeds them.

Proves: a user's count follows every move that starts or ends a VM they hold (reserve,
claim, checkout; fail, give back, delete, lifetime end) and its peak is kept; a
reservation, a claim or a checkout over quota is refused and changes nothing; a request
reserves only while all it still needs fits (so partial reservations never all wait on
each other); a request waiting for its quota still fails at its TTL; 20 threads racing
to reserve for one user with max_vms 5 reserve exactly 5, where the read-then-reserve
check a caller could make in Python lets more through (shown by the same race against
it); a park finds room freed since the refusal (no lost wake-up) and a VM freed later
unparks every request of the user.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from vmpool.state.keys import Keys
from vmpool.state.quotas import QuotaLimits
from vmpool.state.records import Slot
from vmpool.state.store import Store

from storehelp import ACTOR, make_ready, refused, settings, snapshot, wait_until

TWO = QuotaLimits(max_vms=2)


def _store(client: redis.Redis) -> Store:
    return Store(client, Keys("vmpool"))


def _request(store: Store, rid: str, n: int = 1, user: str = "alice", pool: str = "debian") -> None:
    out = store.create_request(rid, [Slot(pool, pool, n)], settings(), actor=ACTOR, token_user=user)
    assert out.ok, out


def _reserve(store: Store, rid: str, name: str, quota: QuotaLimits = TWO, pool: str = "debian"):  # type: ignore[no-untyped-def]
    return store.reserve_vm(
        rid, name=name, alias=pool, pool=pool, template="t", provider="sim",
        domain=None, actor=ACTOR, quota=quota,
    )  # fmt: skip


def _held(store: Store, user: str = "alice") -> tuple[int, int]:
    held = store.quotas.held().get(user)
    return (held.vms, held.peak_vms) if held else (0, 0)


def test_the_count_follows_reservations_and_every_way_a_vm_is_freed(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client)
    for rid in ("r1", "r2", "r3"):
        _request(store, rid)
    assert _reserve(store, "r1", "vm-a").ok
    assert _reserve(store, "r2", "vm-b").ok
    assert _held(store) == (2, 2)
    assert refused(_reserve(store, "r3", "vm-c"), "quota_max_vms")
    # a failed boot frees the user's VM (the retry reserves a new one, counted again)
    assert store.vm_created("vm-a", actor=ACTOR).ok
    assert store.vm_failed("vm-a", "boom", actor=ACTOR).code == "retry"
    assert _held(store) == (1, 2)
    assert _reserve(store, "r3", "vm-c").ok
    assert refused(_reserve(store, "r1", "vm-a2"), "quota_max_vms")
    # a deleted request frees its VMs
    assert store.delete_request("r2", actor=ACTOR).ok
    assert _held(store) == (1, 2)
    assert _reserve(store, "r1", "vm-a2").ok
    # a VM given back (running -> completed) frees it; destroying it changes nothing more
    assert store.vm_created("vm-c", actor=ACTOR).ok
    assert store.vm_ready("vm-c", actor=ACTOR).code == "fulfilled"
    assert store.pools.give_back("vm-c", actor=ACTOR).ok
    assert store.vm_destroyed("vm-c", actor=ACTOR).ok
    assert _held(store) == (1, 2)
    # a lifetime ended
    assert store.vm_created("vm-a2", actor=ACTOR).ok
    assert store.vm_ready("vm-a2", actor=ACTOR).ok
    assert store.end_vm_lifetime("vm-a2", actor=ACTOR, force=True).ok
    assert _held(store) == (0, 2)
    assert store.quotas.held()["alice"].cores == 0


def test_a_request_reserves_only_while_all_it_still_needs_fits(redis_client: redis.Redis) -> None:
    """Two VMs asked, one of the quota free: nothing is reserved for it (a partial
    reservation could wait forever on another partial one of the same user)."""
    store = _store(redis_client)
    _request(store, "one")
    _request(store, "pair", n=2)
    assert _reserve(store, "one", "vm-1").ok
    before = snapshot(redis_client)
    assert refused(_reserve(store, "pair", "vm-2"), "quota_max_vms")
    assert snapshot(redis_client) == before  # a refusal changes nothing
    assert _reserve(store, "pair", "vm-2", quota=QuotaLimits(max_vms=3)).ok
    assert _reserve(store, "pair", "vm-3", quota=QuotaLimits(max_vms=3)).ok


def test_cores_are_counted_by_the_pools_cores(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    _request(store, "big", n=2)
    eight = QuotaLimits(max_cores=8, cores={"debian": 4})
    assert _reserve(store, "big", "vm-1", quota=eight).ok
    assert _reserve(store, "big", "vm-2", quota=eight).ok
    _request(store, "more")
    refusal = _reserve(store, "more", "vm-3", quota=eight)
    assert refused(refusal, "quota_max_cores"), refusal
    held = store.quotas.held()["alice"]
    assert (held.vms, held.cores, held.peak_cores) == (2, 8, 8)


def test_other_users_and_the_anonymous_user_are_not_counted_against_alice(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client)
    _request(store, "a1")
    _request(store, "b1", user="bob")
    _request(store, "anon", user="")
    assert _reserve(store, "a1", "vm-a").ok
    assert _reserve(store, "b1", "vm-b", quota=QuotaLimits(max_vms=1)).ok
    assert _reserve(store, "anon", "vm-x", quota=QuotaLimits(max_vms=0)).ok  # no user
    held = store.quotas.held()
    assert (held["alice"].vms, held["bob"].vms, "" in held) == (1, 1, False)


def test_a_checkout_over_quota_hands_out_nothing(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    make_ready(store, "debian", 3)
    got = store.pools.checkout(
        {"debian": 2}, owner="alice", owner_hash="", lifetime_s=60, actor=ACTOR, quota=TWO
    )
    assert got.ok and len(got.vms) == 2
    before = snapshot(redis_client)
    over = store.pools.checkout(
        {"debian": 1}, owner="alice", owner_hash="", lifetime_s=60, actor=ACTOR, quota=TWO
    )
    assert (over.ok, over.code, over.held) == (False, "quota_max_vms", 2)
    assert snapshot(redis_client) == before
    assert store.pools.give_back(got.vms[0][0], actor=ACTOR, user="alice").ok
    again = store.pools.checkout(
        {"debian": 1}, owner="alice", owner_hash="", lifetime_s=60, actor=ACTOR, quota=TWO
    )
    assert again.ok
    assert _held(store) == (2, 2)


def test_a_claim_of_warm_vms_counts_and_respects_the_quota(redis_client: redis.Redis) -> None:
    store = _store(redis_client)
    make_ready(store, "debian", 3)
    _request(store, "r1", n=2)
    _request(store, "r2")
    assert (
        store.pools.claim_for_request("r1", ["debian"], actor=ACTOR, quota=TWO).code == "fulfilled"
    )
    assert _held(store) == (2, 2)
    before = snapshot(redis_client)
    claim = store.pools.claim_for_request("r2", ["debian"], actor=ACTOR, quota=TWO)
    assert (claim.ok, claim.code) == (False, "quota_max_vms")
    assert snapshot(redis_client) == before


def _race(n: int, attempt: Callable[[int], bool]) -> int:
    """``n`` threads released at once by a barrier; how many attempts succeeded."""
    barrier = threading.Barrier(n)
    wins: list[bool] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        ok = attempt(i)
        with lock:
            wins.append(ok)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return sum(wins)


def test_twenty_racing_reservations_of_one_user_with_max_vms_5_reserve_exactly_5(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Against the store: exactly 5, whatever the interleaving. Against a caller's own
    read-then-reserve check (what a quota counted outside the unit amounts to), the same
    race lets more through: each reads the count before any reservation lands."""
    store = _store(redis_client)
    for i in range(40):
        _request(store, f"q{i}")
    clients = [redis.Redis.from_url(redis_url, decode_responses=True) for _ in range(20)]
    five = QuotaLimits(max_vms=5)

    def exact(i: int) -> bool:
        return _reserve(_store(clients[i]), f"q{i}", f"vm-q{i}", quota=five).ok

    assert _race(20, exact) == 5
    assert _held(store) == (5, 5)
    redis_client.delete(store.keys.quota_vms, store.keys.quota_peak, store.keys.quota_cores)
    barrier = threading.Barrier(20)

    def naive(i: int) -> bool:
        mine = _store(clients[i])
        held = int(clients[i].hget(mine.keys.quota_vms, "bob") or 0)  # read...
        barrier.wait()  # ...every reader reads before any reservation lands
        if held >= 5:
            return False
        rid = f"q{20 + i}"
        clients[i].hset(mine.keys.request(rid), "token_user", "bob")
        return _reserve(mine, rid, f"vm-n{i}", quota=QuotaLimits()).ok  # ...then reserve

    assert _race(20, naive) > 5
    for client in clients:
        client.close()


def test_a_park_finds_room_freed_since_the_refusal_and_a_later_free_unparks(
    redis_client: redis.Redis,
) -> None:
    store = _store(redis_client)
    for rid in ("r1", "r2", "r3", "r4"):
        _request(store, rid)
    assert _reserve(store, "r1", "vm-1").ok
    assert _reserve(store, "r2", "vm-2").ok
    assert refused(_reserve(store, "r3", "vm-3"), "quota_max_vms")
    assert store.quotas.park("r3", TWO, actor=ACTOR).code == "parked"
    assert store.quotas.park("r4", TWO, actor=ACTOR).code == "parked"
    assert store.quotas.parked() == {"r3": "alice", "r4": "alice"}
    assert store.quotas.waits() == {"alice": 2}
    assert "quota (max_vms 2)" in str(redis_client.hget(store.keys.request("r3"), "last_error"))
    # a VM of alice freed: every parked request of hers is unparked, in the same unit
    assert store.delete_request("r1", actor=ACTOR).ok
    assert store.quotas.parked() == {}
    # freed between a refusal and its park: the park says so and parks nothing
    assert store.quotas.park("r3", TWO, actor=ACTOR).code == "quota_free"
    assert store.quotas.parked() == {}
    assert _reserve(store, "r3", "vm-3").ok
    assert store.quotas.park("r4", TWO, actor=ACTOR).code == "parked"
    assert store.quotas.waits() == {"alice": 2}  # r4 waited before: counted once
    # a request that leaves pending is parked no more
    assert store.delete_request("r4", actor=ACTOR).ok
    assert store.quotas.parked() == {}


def test_a_request_waiting_for_its_users_quota_still_fails_at_its_ttl(
    redis_client: redis.Redis,
) -> None:
    """Parked is pending, not exempt: the expiry fails it at its TTL, its record says
    what it waited for, and it is parked no more (nothing left waiting in the line)."""
    store = _store(redis_client)
    _request(store, "r1")
    _request(store, "r2")
    out = store.create_request("short", [Slot("debian", "debian", 1)], settings(ttl_s=0.6),
                               actor=ACTOR, token_user="alice")  # fmt: skip
    assert out.ok, out
    assert _reserve(store, "r1", "vm-1").ok
    assert _reserve(store, "r2", "vm-2").ok
    assert refused(_reserve(store, "short", "vm-3"), "quota_max_vms")
    assert store.quotas.park("short", TWO, actor=ACTOR).code == "parked"
    assert refused(store.expire_request("short", actor=ACTOR), "not_expired")
    fail_at = float(redis_client.hget(store.keys.request("short"), "fail_at") or 0)
    wait_until(lambda: store.server_time() >= fail_at, timeout=5)
    assert store.expire_request("short", actor=ACTOR).code == "failed"
    failed = store.get_request("short")
    assert failed is not None and failed.status == "failed"
    assert "quota (max_vms 2)" in str(redis_client.hget(store.keys.request("short"), "last_error"))
    assert store.quotas.parked() == {}
    assert _held(store) == (2, 2)  # what alice holds is untouched

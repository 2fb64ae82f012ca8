"""The warm-pool transitions of the store (vmpool/state/pool_store.py): ready in a pool,
checkout all or nothing, claim for a request, give back, lifetime extension, tags. Each
test drives the real scripts on a real Redis and runs the audit over what they left."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from vmpool.state.audit import audit_state, check_vm_trail
from vmpool.state.keys import Keys
from vmpool.state.pool_store import PoolStore
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store

from naive_store import naive_checkout
from storehelp import ACTOR, make_request, refused

POOL = "debian"


def warm(store: Store, n: int, *, pool: str = POOL, size: int | None = None) -> list[str]:
    """n VMs made ready in ``pool`` through the real transitions."""
    names = []
    base = len(store.pool_vms(pool, "ready")) + len(store.pool_vms(pool, "completed"))
    for i in range(n):
        name = f"{pool}-w{base + i}"
        out = store.pools.reserve_pool_vm(
            name,
            pool=pool,
            template="t",
            provider="sim",
            domain="example.com",
            size=size if size is not None else base + n,
            data_ttl_s=3600,
            actor=ACTOR,
        )
        assert out.ok, out
        assert store.vm_created(name, actor=ACTOR).code == "pending"
        assert store.vm_ready(name, actor=ACTOR).code == "ready"
        names.append(name)
    return names


def clean(store: Store) -> None:
    problems = audit_state(store, {}, sweep_interval_s=3600, reap_interval_s=3600)
    assert not problems, [p.line() for p in problems]


def test_pool_vm_lifecycle_is_audited(redis_client: redis.Redis) -> None:
    """Proves: a warm VM goes reserved -> pending -> ready -> completed -> destroyed
    through the store's ordinary VM transitions, with contiguous versions in its own
    trail, and the pool's size bounds reservations inside the unit."""
    store = Store(redis_client, Keys())
    [name] = warm(store, 1, size=1)
    assert refused(
        store.pools.reserve_pool_vm(
            "debian-extra",
            pool=POOL,
            template="t",
            provider="sim",
            domain=None,
            size=1,
            data_ttl_s=60,
            actor=ACTOR,
        ),
        "pool_full",
    )
    assert (
        store.pools.recycle_vm(name, "ready_ttl", actor=ACTOR, min_ready_s=3600).code == "not_due"
    )
    assert store.pools.recycle_vm(name, "ready_ttl", actor=ACTOR).code == "completed"
    assert store.vm_destroyed(name, actor=ACTOR).code == "destroyed"
    trail = store.pools.vm_history(name)
    assert [(e.src, e.dst) for e in trail] == [
        ("none", "reserved"),
        ("reserved", "pending"),
        ("pending", "ready"),
        ("ready", "completed"),
        ("completed", "destroyed"),
    ]
    assert [e.version for e in trail] == [1, 2, 3, 4, 5]
    assert check_vm_trail(name, trail) == []
    clean(store)


def test_checkout_all_or_nothing(redis_client: redis.Redis) -> None:
    """Proves: a checkout short in one pool hands out nothing (the other pool's ready VMs
    stay ready); a full one takes every VM it asked for, owned, with a lifetime."""
    store = Store(redis_client, Keys())
    warm(store, 2)
    warm(store, 1, pool="centos")
    short = store.pools.checkout(
        {POOL: 2, "centos": 2}, owner="jdoe", owner_hash="h", lifetime_s=3600, actor=ACTOR
    )
    assert not short.ok and short.code == "short" and short.short == "centos"
    assert len(store.pool_vms(POOL, "ready")) == 2
    got = store.pools.checkout(
        {POOL: 2, "centos": 1}, owner="jdoe", owner_hash="h", lifetime_s=3600, actor=ACTOR
    )
    assert got.ok and len(got.vms) == 3
    for name, _pool in got.vms:
        vm = store.get_vm(name)
        assert vm is not None and vm.state == "running" and vm.owner == "jdoe"
        assert vm.held_by_checkout and vm.lifetime_end is not None
    assert store.pool_vms(POOL, "ready") == []
    clean(store)


def test_checkout_race_hands_each_vm_out_once(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: 30 checkouts at once (threads, own connections, released by a barrier)
    against 10 ready VMs: exactly 10 succeed and no VM is handed out twice."""
    store = Store(redis_client, Keys())
    warm(store, 10)
    barrier = threading.Barrier(30)
    results: list[tuple[str, ...]] = []
    lock = threading.Lock()

    def one() -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        mine = PoolStore(client, Keys())  # the warm-pool part on its own
        barrier.wait(timeout=10)
        out = mine.checkout({POOL: 1}, owner="u", owner_hash="", lifetime_s=60, actor=ACTOR)
        with lock:
            results.append(tuple(n for n, _ in out.vms))
        client.close()

    threads = [threading.Thread(target=one) for _ in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    handed = [n for r in results for n in r]
    assert len(results) == 30
    assert len(handed) == 10 and len(set(handed)) == 10
    clean(store)


def test_request_claims_ready_vms_first(redis_client: redis.Redis) -> None:
    """Proves: a request for 3 with 2 ready takes the 2 in one unit (its trail shows
    'claimed from the pool' for them) and leaves 1 slot to clone; with the rest
    reserved and booted it turns ready, and the audit is clean."""
    store = Store(redis_client, Keys())
    ready = warm(store, 2)
    assert store.create_request(
        "r1", [Slot("deb", POOL, 3)], RequestSettings(ttl_s=300), actor=ACTOR
    ).ok
    claim = store.pools.claim_for_request("r1", [POOL], actor=ACTOR)
    assert claim.ok and claim.code == "claimed" and sorted(claim.names) == sorted(ready)
    req = store.get_request("r1")
    assert req is not None and req.unreserved == 1 and req.have == 2
    claimed = [e for e in store.history("r1") if e.reason == "claimed from the pool"]
    assert sorted(e.entity for e in claimed) == sorted(f"vm:{n}" for n in ready)
    assert store.pools.vm_history(ready[0])[-1].reason == "claimed by request r1"
    assert refused(store.pools.claim_for_request("r1", [POOL], actor=ACTOR), "none_ready")
    out = store.reserve_vm(
        "r1",
        name="r1-c",
        alias="deb",
        pool=POOL,
        template="t",
        provider="sim",
        domain=None,
        actor=ACTOR,
    )
    assert out.ok
    store.vm_created("r1-c", actor=ACTOR)
    assert store.vm_ready("r1-c", actor=ACTOR).code == "fulfilled"
    clean(store)


def test_give_back_never_fails_or_resurrects_the_request(redis_client: redis.Redis) -> None:
    """Proves: DELETE /vm/<host> of a ready request's VM destroys that VM only: the
    request stays ready and keeps listing it; another user may not; a deleted request's
    VM cannot be given back (it is already released)."""
    store = Store(redis_client, Keys())
    assert store.create_request(
        "r2",
        [Slot("deb", POOL, 2)],
        RequestSettings(ttl_s=300),
        actor=ACTOR,
        token_user="jdoe",
    ).ok
    names = []
    for i in range(2):
        name = f"r2-vm{i}"
        store.reserve_vm(
            "r2",
            name=name,
            alias="deb",
            pool=POOL,
            template="t",
            provider="sim",
            domain=None,
            actor=ACTOR,
        )
        store.vm_created(name, actor=ACTOR)
        store.vm_ready(name, actor=ACTOR)
        names.append(name)
    assert refused(store.pools.give_back(names[0], actor=ACTOR, user="mallory"), "forbidden")
    assert store.pools.give_back(names[0], actor=ACTOR, user="jdoe").code == "completed"
    req = store.get_request("r2")
    assert req is not None and req.status == "ready"
    assert store.hostnames("r2") == {"deb": sorted(names)}
    assert refused(store.pools.give_back(names[0], actor=ACTOR), "vm_completed")
    assert store.delete_request("r2", actor=ACTOR).ok
    assert refused(store.pools.give_back(names[1], actor=ACTOR), "vm_completed")
    clean(store)


def test_extend_and_tag_a_checked_out_vm(redis_client: redis.Redis) -> None:
    """Proves: the holder extends the lifetime (running score moves with it) and tags
    the VM, each a versioned running -> running entry; another user is refused."""
    store = Store(redis_client, Keys())
    warm(store, 1)
    [(name, _)] = store.pools.checkout(
        {POOL: 1}, owner="jdoe", owner_hash="", lifetime_s=3600, actor=ACTOR
    ).vms
    assert refused(store.pools.extend_vm(name, 5, actor=ACTOR, user="other"), "forbidden")
    assert store.pools.extend_vm(name, 5, actor=ACTOR, user="jdoe").code == "extended"
    vm = store.get_vm(name)
    assert vm is not None and vm.checkout_at is not None and vm.lifetime_end is not None
    assert abs(vm.lifetime_end - vm.checkout_at - 5 * 3600) < 1
    score = redis_client.zscore(Keys().pool_state(POOL, "running"), name)
    assert score is not None and abs(score - vm.lifetime_end) < 1
    assert store.pools.tag_vm(name, {"project": "x"}, actor=ACTOR, user="jdoe").code == "tagged"
    vm = store.get_vm(name)
    assert vm is not None and vm.tags == {"project": "x"}
    assert store.end_vm_lifetime(name, actor=ACTOR).code == "not_expired"
    assert store.end_vm_lifetime(name, actor=ACTOR, force=True).code == "completed"
    assert check_vm_trail(name, store.pools.vm_history(name)) == []
    clean(store)


def test_request_vm_extension_keeps_the_request_trail(redis_client: redis.Redis) -> None:
    """Proves: extending a request's VM is one entry in the request's trail, allowed on a
    ready request (not taken for an attach to a finished request)."""
    store = Store(redis_client, Keys())
    names = make_request(store, "r3", 1)
    assert store.vm_ready(names[0], actor=ACTOR).code == "fulfilled"
    assert store.pools.extend_vm(names[0], 2, actor=ACTOR).code == "extended"
    assert store.history("r3")[-1].dst == "running"
    clean(store)


def _two_crossed_clients(checkout: Any) -> list[bool]:
    """Two clients each asking for one VM of pool a and one of pool b, one in the order
    (a, b) and one (b, a), with one ready VM in each pool, released together and made to
    take their first VM before either takes its second, and to try their second before
    either puts anything back (barriers in the gaps; vmpool's script has no gap)."""
    barrier = threading.Barrier(2)
    results: list[bool] = []

    def gap_after_first() -> Callable[[], None]:
        calls = [0]

        def gap() -> None:
            calls[0] += 1
            if calls[0] in (2, 3):  # before the second move, and before any put-back
                barrier.wait(timeout=5)

        return gap

    def client(order: dict[str, int]) -> None:
        results.append(checkout(order, gap_after_first()))

    threads = [
        threading.Thread(target=client, args=({"pa": 1, "pb": 1},)),
        threading.Thread(target=client, args=({"pb": 1, "pa": 1},)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return results


def test_naive_checkout_loses_a_satisfiable_claim(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves the race the one-script checkout closes: with vmpooler's shape (one atomic
    move per VM, the taken ones put back on a short pool), two clients that each take
    their first VM before their second both find the other pool empty and both get 503,
    although the two ready VMs could serve one of them whole."""
    keys = Keys()
    store = Store(redis_client, keys)
    warm(store, 1, pool="pa")
    warm(store, 1, pool="pb")

    def naive(order: dict[str, int], gap: Callable[[], None]) -> bool:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return bool(naive_checkout(client, keys, order, gap))
        finally:
            client.close()

    assert _two_crossed_clients(naive) == [False, False]


def test_checkout_serves_one_of_two_crossed_clients(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the same two crossed clients against vmpool's checkout (one script, every
    VM chosen before any moves): exactly one gets both VMs, the other 503, nothing lost."""
    keys = Keys()
    store = Store(redis_client, keys)
    warm(store, 1, pool="pa")
    warm(store, 1, pool="pb")
    barrier = threading.Barrier(2)

    def real(order: dict[str, int], gap: Callable[[], None]) -> bool:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        try:
            barrier.wait(timeout=5)  # both start together; the script has no gap
            out = PoolStore(client, keys).checkout(
                order, owner="u", owner_hash="", lifetime_s=60, actor=ACTOR
            )
            return out.ok
        finally:
            client.close()

    assert sorted(_two_crossed_clients(real)) == [False, True]
    clean(store)


def test_store_parts_share_one_registry(redis_client: redis.Redis) -> None:
    """The store's parts run through its one registry; a part built alone has its own."""
    store = Store(redis_client, Keys())
    assert store.pools.scripts is store.scripts and store.tasks.scripts is store.scripts
    assert (store.pools.redis, store.pools.keys) == (store.redis, store.keys)
    alone = PoolStore(redis_client, Keys())
    assert alone.scripts is not store.scripts and alone.warm_counts([POOL]) == {
        POOL: {"ready": 0, "warming": 0}
    }

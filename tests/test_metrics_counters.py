"""The counters and the histogram the store's scripts keep: each transition counts once,
in its own atomic unit; a refused transition counts nothing (and writes nothing)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from functools import partial

import pytest
import redis
from prometheus_client import CollectorRegistry, Histogram

from vmpool.state.counters import (
    READY_BUCKETS,
    READY_OVERFLOW,
    READY_SUM,
    bucket_field,
    cumulative_buckets,
    lua_metrics,
)
from vmpool.state.keys import Keys
from vmpool.state.records import Outcome
from vmpool.state.store import Store
from vmpool.state.store_scripts import prelude

from storehelp import ACTOR, make_request, refused, snapshot, wait_until


@pytest.fixture
def store(redis_client: redis.Redis, keys: Keys) -> Store:
    return Store(redis_client, keys)


def finished(store: Store) -> dict[str, int]:
    raw = store.redis.hgetall(store.keys.requests_finished)
    return {str(k): int(v) for k, v in raw.items()}


def past_deadline(store: Store, rid: str) -> None:
    rec = store.get_request(rid)
    assert rec is not None
    wait_until(lambda: store.server_time() > rec.fail_at)


def assert_refusal_writes_nothing(store: Store, call: Callable[[], Outcome], code: str) -> None:
    before = snapshot(store.redis)
    assert refused(call(), code)
    assert snapshot(store.redis) == before


# -- vmpool_requests_finished_total{outcome} ------------------------------------------------


def test_last_vm_ready_counts_ready_once(store: Store) -> None:
    a, b = make_request(store, "r1", 2)
    assert store.vm_ready(a, actor=ACTOR).code == "running"
    assert finished(store) == {}
    assert store.vm_ready(b, actor=ACTOR).code == "fulfilled"
    assert finished(store) == {"ready": 1}
    assert_refusal_writes_nothing(store, partial(store.vm_ready, b, actor=ACTOR), "vm_running")
    assert finished(store) == {"ready": 1}


def test_expire_that_fulfils_late_counts_ready(store: Store, keys: Keys) -> None:
    """Built as tests/test_store.py builds a complete-but-pending request."""
    a, b = make_request(store, "r1", 2, ttl_s=0.6)
    store.vm_ready(a, actor=ACTOR)
    store.redis.hincrby(keys.request("r1"), "need", 1)  # test-only: hold off fulfilment
    assert store.vm_ready(b, actor=ACTOR).code == "running"
    store.redis.hincrby(keys.request("r1"), "need", -1)
    past_deadline(store, "r1")
    assert finished(store) == {}
    assert store.expire_request("r1", actor=ACTOR).code == "fulfilled"
    assert finished(store) == {"ready": 1}
    expire = partial(store.expire_request, "r1", actor=ACTOR)
    assert_refusal_writes_nothing(store, expire, "request_ready")


def test_expire_that_fails_counts_failed_once(store: Store) -> None:
    # a TTL the refusal before it is sure to meet on a loaded machine (parallel workers)
    make_request(store, "r1", 1, ttl_s=0.6)
    expire = partial(store.expire_request, "r1", actor=ACTOR)
    assert_refusal_writes_nothing(store, expire, "not_expired")
    past_deadline(store, "r1")
    assert store.expire_request("r1", actor=ACTOR).code == "failed"
    assert finished(store) == {"failed": 1}
    assert_refusal_writes_nothing(store, expire, "request_failed")
    assert finished(store) == {"failed": 1}


def test_vm_ready_past_the_deadline_counts_failed(store: Store) -> None:
    a, b = make_request(store, "r1", 2, ttl_s=0.6)
    store.vm_ready(a, actor=ACTOR)
    past_deadline(store, "r1")
    assert store.vm_ready(b, actor=ACTOR).code == "completed"
    assert finished(store) == {"failed": 1}


def test_vm_failed_counts_failed_only_when_the_request_fails(store: Store) -> None:
    a, b = make_request(store, "r1", 2, max_vm_retries=1)
    assert store.vm_failed(a, "boom", actor=ACTOR).code == "retry"
    assert finished(store) == {}
    fail_again = partial(store.vm_failed, a, "boom", actor=ACTOR)
    assert_refusal_writes_nothing(store, fail_again, "vm_completed")
    assert store.vm_failed(b, "boom", actor=ACTOR).code == "request_failed"
    assert finished(store) == {"failed": 1}


def test_permanent_vm_failure_counts_failed(store: Store) -> None:
    (a,) = make_request(store, "r1", 1)
    assert store.vm_failed(a, "no such template", permanent=True, actor=ACTOR).code == (
        "request_failed"
    )
    assert finished(store) == {"failed": 1}


def test_delete_of_a_pending_request_counts_deleted_once(store: Store) -> None:
    make_request(store, "r1", 1)
    assert store.delete_request("r1", actor=ACTOR).code == "deleted"
    assert finished(store) == {"deleted": 1}
    delete = partial(store.delete_request, "r1", actor=ACTOR)
    assert_refusal_writes_nothing(store, delete, "already_deleted")
    assert finished(store) == {"deleted": 1}


def test_delete_of_a_ready_request_is_not_counted_again(store: Store) -> None:
    """A request finishes once: a ready one given back later stays counted as ready, so
    the outcomes add up to the requests finished."""
    (a,) = make_request(store, "r1", 1)
    assert store.vm_ready(a, actor=ACTOR).code == "fulfilled"
    assert store.delete_request("r1", actor=ACTOR).code == "deleted"
    assert finished(store) == {"ready": 1}


def test_refused_deletes_count_nothing(store: Store) -> None:
    make_request(store, "r1", 1, ttl_s=0.1)
    past_deadline(store, "r1")
    assert store.expire_request("r1", actor=ACTOR).code == "failed"
    delete = partial(store.delete_request, "r1", actor=ACTOR)
    assert_refusal_writes_nothing(store, delete, "request_failed")
    assert_refusal_writes_nothing(
        store, partial(store.delete_request, "nope", actor=ACTOR), "no_request"
    )
    assert finished(store) == {"failed": 1}


def test_a_race_counts_each_request_exactly_once(store: Store) -> None:
    """Readies, expiries and deletes from several threads at once: each request is
    counted once, as the outcome its trail shows it left pending with."""
    n = 24
    # half of them past their deadline (expiry and a late VM fail them), half in time
    vms = {
        f"r{i}": make_request(store, f"r{i}", 1, ttl_s=0.3 if i % 2 else 300)[0] for i in range(n)
    }
    past_deadline(store, "r1")

    def run(i: int) -> None:
        for rid, vm in vms.items():
            choice = (i + int(rid[1:])) % 3
            if choice == 0:
                store.vm_ready(vm, actor=ACTOR)
            elif choice == 1:
                store.expire_request(rid, actor=ACTOR)
            else:
                store.delete_request(rid, actor=ACTOR)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left: Counter[str] = Counter()
    for rid in vms:
        out = [e.dst for e in store.history(rid) if e.entity == "request" and e.src == "pending"]
        assert len(out) == 1, (rid, out)
        left[out[0]] += 1
    assert finished(store) == dict(left)
    assert sum(left.values()) == n
    assert set(left) == {"ready", "failed", "deleted"}


# -- vmpool_time_to_ready_seconds{pool} ---------------------------------------------------


def histogram(store: Store, pool: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in store.redis.hgetall(store.keys.time_to_ready(pool)).items()}


def test_vm_ready_observes_the_time_since_reservation(store: Store, keys: Keys) -> None:
    a, b = make_request(store, "r1", 2)
    now = store.server_time()
    # test-only: a reservation 45 s ago (not a status: the scripts read it, never check it)
    store.redis.hset(keys.vm(a), "reserved_at", f"{now - 45:.6f}")
    assert store.vm_ready(a, actor=ACTOR).code == "running"
    assert store.vm_ready(b, actor=ACTOR).code == "fulfilled"
    h = histogram(store, "debian")
    assert h[bucket_field(60.0)] == "1"  # 45 s
    assert h[bucket_field(1.0)] == "1"  # b: reserved and readied just now
    assert 45.0 <= float(h[READY_SUM]) < 50.0
    buckets, total = cumulative_buckets({k: float(v) for k, v in h.items()})
    assert dict(buckets)[READY_OVERFLOW] == 2 and dict(buckets)["30.0"] == 1
    assert total == float(h[READY_SUM])


def test_a_vm_not_attached_is_not_observed(store: Store) -> None:
    (a,) = make_request(store, "r1", 1)
    assert store.delete_request("r1", actor=ACTOR).ok
    assert refused(store.vm_ready(a, actor=ACTOR), "vm_completed")
    assert histogram(store, "debian") == {}


def observe_script(store: Store) -> redis.commands.core.Script:
    """A test-only script: the store's own prelude, then one observation."""
    return store.redis.register_script(
        prelude(store.keys) + "observe_ready_time(ARGV[5], tonumber(ARGV[6]))\nreturn 1\n"
    )


def test_buckets_match_prometheus_histogram_semantics(store: Store) -> None:
    """Each value lands where prometheus_client's own Histogram (same bounds) puts it:
    ``le`` is inclusive, above the last bound is +Inf."""
    values = [0.0, 0.4, 1.0, 1.0001, 2.5, 29.9, 30.0, 299.0, 1600.0, 1600.5, 86400.0]
    observe = observe_script(store)
    args = [store.keys.pool_state_prefix(), store.keys.vm_prefix(), ACTOR, "none"]
    for value in values:
        observe(keys=[], args=[*args, "debian", repr(value)])
    ours, total = cumulative_buckets({k: float(v) for k, v in histogram(store, "debian").items()})
    reference = Histogram("h", "reference", buckets=READY_BUCKETS, registry=CollectorRegistry())
    for value in values:
        reference.observe(value)
    expected = {
        s.labels["le"]: s.value
        for s in next(iter(reference.collect())).samples
        if s.name == "h_bucket"
    }
    assert dict(ours) == expected
    assert total == pytest.approx(sum(values))


def test_the_bounds_are_rendered_once_from_python(keys: Keys) -> None:
    lua = lua_metrics(keys)
    assert "local READY_BOUNDS = {" + ", ".join(repr(b) for b in READY_BUCKETS) + "}" in lua
    assert repr(keys.requests_finished) in lua
    assert repr(keys.time_to_ready_prefix()) in lua
    assert keys.time_to_ready("debian") == keys.time_to_ready_prefix() + "debian"

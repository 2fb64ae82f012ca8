"""A served request (all its VMs reserved) is out of the provision queue and the slot
line for good, so its fulfil need not write them; what the request's one HSET carries
(counts, version, status, `started`) and the line's pace read the same as before."""

from __future__ import annotations

import pytest
import redis

from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.quotas import NO_LIMITS, QuotaLimits
from vmpool.state.records import Slot
from vmpool.state.semaphore import CloneSemaphore, SlotTerms
from vmpool.state.store import Store

from storehelp import ACTOR, make_request, settings


@pytest.fixture
def store(redis_client: redis.Redis, keys: Keys) -> Store:
    return Store(redis_client, keys)


def reserve(
    store: Store,
    rid: str,
    name: str,
    slot: SlotTerms | None = None,
    quota: QuotaLimits = NO_LIMITS,
) -> str:
    out = store.reserve_vm(
        rid, name=name, alias="deb", pool="debian", template="t", provider="sim",
        domain="example.com", actor=ACTOR, slot=slot, quota=quota,
    )  # fmt: skip
    return out.code


def place_of(store: Store, rid: str) -> float:
    rec = store.get_request(rid)
    assert rec is not None
    return rec.place


def test_a_fully_reserved_request_does_not_join_the_slot_line(
    store: Store, redis_client: redis.Redis, keys: Keys
) -> None:
    """A provision batch may tell a request to wait in the slot line after another
    worker reserved its last VM (its lock lost meanwhile): the join, in its own unit,
    finds nothing left to reserve and writes nothing. Red before: the join checked the
    status only, and the request stayed in the line after its fulfil, ahead of every
    later request, since fulfil relies on its last reservation having taken it out."""
    make_request(store, "R1", n=1)
    slots = CloneSemaphore(redis_client, keys, limit=1, lease_s=60)
    assert slots.join_line("R1", place_of(store, "R1")) is False
    assert redis_client.zscore(keys.clone_slot_line, "R1") is None
    assert store.create_request("R2", [Slot("deb", "debian", 1)], settings(), actor=ACTOR).ok
    assert slots.join_line("R2", place_of(store, "R2")) is True
    assert redis_client.zscore(keys.clone_slot_line, "R2") is not None


def test_fulfil_leaves_the_request_in_no_line_and_its_trail_contiguous(
    store: Store, redis_client: redis.Redis, keys: Keys
) -> None:
    """Limit 1: the second VM is refused a slot (the request waits in the slot line),
    gets it once the first is created, and the request leaves both lines with that
    reservation; its fulfil then leaves it in neither, with one version per entry."""
    assert store.create_request("R1", [Slot("deb", "debian", 2)], settings(), actor=ACTOR).ok
    terms = SlotTerms(limit=1, lease_s=60, place=place_of(store, "R1"))
    assert reserve(store, "R1", "r1-a", terms) == "reserved"
    assert reserve(store, "R1", "r1-b", terms) == "clone_limit"
    assert redis_client.zscore(keys.clone_slot_line, "R1") is not None
    created = store.vm_created("r1-a", actor=ACTOR, slot_limit=1)
    assert created.code == "pending" and list(created.turns) == ["R1"]
    assert reserve(store, "R1", "r1-b", terms) == "reserved"
    assert redis_client.zscore(keys.provision_queue, "R1") is None
    assert redis_client.zscore(keys.clone_slot_line, "R1") is None
    assert store.vm_created("r1-b", actor=ACTOR, slot_limit=1).code == "pending"
    running = store.vm_ready("r1-a", actor=ACTOR)
    assert running.code == "running"
    assert int(redis_client.hget(keys.request("R1"), "version") or 0) == running.version
    fulfilled = store.vm_ready("r1-b", actor=ACTOR)
    assert fulfilled.code == "fulfilled"
    req = redis_client.hgetall(keys.request("R1"))
    assert int(req["version"]) == fulfilled.version
    assert (req["status"], req["have"], req["have:deb:debian"]) == ("ready", "2", "2")
    for key in (keys.provision_queue, keys.clone_slot_line, keys.open_requests):
        assert redis_client.zscore(key, "R1") is None
    history = store.history("R1")
    assert check_trail("R1", history) == []
    assert [e.version for e in history] == list(range(1, fulfilled.version + 1))


def test_started_is_the_first_reservation_and_feeds_the_line_interval(
    store: Store, redis_client: redis.Redis, keys: Keys
) -> None:
    """A request's `started` is its first reservation's time, kept by later ones; a
    start while others waited samples the line's interval (LINE_STATS), written with
    `last_start` and `last_backlog`."""
    for rid in ("R1", "R2", "R3"):
        assert store.create_request(rid, [Slot("deb", "debian", 2)], settings(), actor=ACTOR).ok
    assert reserve(store, "R1", "r1-a") == "reserved"
    started = redis_client.hget(keys.request("R1"), "started")
    stats = redis_client.hgetall(keys.line_stats)
    assert stats["last_start"] == started and stats["last_backlog"] == "3"
    assert "interval" not in stats
    assert reserve(store, "R1", "r1-b") == "reserved"
    assert redis_client.hget(keys.request("R1"), "started") == started
    assert redis_client.hget(keys.line_stats, "last_start") == started
    assert reserve(store, "R2", "r2-a") == "reserved"
    second = redis_client.hget(keys.request("R2"), "started")
    stats = redis_client.hgetall(keys.line_stats)
    assert stats["last_start"] == second and stats["last_backlog"] == "2"
    assert float(stats["interval"]) == pytest.approx(
        float(second or 0) - float(started or 0), abs=2e-6
    )


def test_a_request_parked_then_served_is_parked_no_more_once_ready(
    store: Store, redis_client: redis.Redis
) -> None:
    """A parked request whose user's limit was raised is reserved while still parked;
    its fulfil unparks it (it was stamped `quota_waited` when parked), while one never
    parked is not looked up there and leaves nothing behind either."""
    one, five = QuotaLimits(max_vms=1), QuotaLimits(max_vms=5)
    for rid in ("R1", "R2"):
        out = store.create_request(
            rid, [Slot("deb", "debian", 1)], settings(), actor=ACTOR, token_user="alice"
        )
        assert out.ok
    assert reserve(store, "R1", "r1-a", quota=one) == "reserved"
    assert reserve(store, "R2", "r2-a", quota=one) == "quota_max_vms"
    assert store.quotas.park("R2", one, actor=ACTOR).code == "parked"
    assert store.quotas.parked() == {"R2": "alice"}
    assert reserve(store, "R2", "r2-a", quota=five) == "reserved"  # the limit raised
    for name in ("r1-a", "r2-a"):
        assert store.vm_created(name, actor=ACTOR).code == "pending"
        assert store.vm_ready(name, actor=ACTOR).code == "fulfilled"
    assert store.quotas.parked() == {}
    assert redis_client.zcard(store.keys.quota_parked_line) == 0

"""Ids are never reused, and a VM whose lifetime ends while its request is
pending never lets the request turn ready short of VMs.

Each test drives the real scripts in a deterministic sequence of store calls; where
Redis would expire a key after hours (data_ttl), the test deletes or expires that key
itself, which is the state Redis leaves behind."""

from __future__ import annotations

import pytest
import redis

from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.records import Slot
from vmpool.state.store import Store

from storehelp import ACTOR, make_request, refused, settings, wait_until

VM = dict(alias="deb", pool="debian", template="t", provider="sim", domain=None, actor=ACTOR)


@pytest.fixture
def store(redis_client: redis.Redis, keys: Keys) -> Store:
    return Store(redis_client, keys)


def create(store: Store, rid: str, n: int = 1, **kw: float) -> bool:
    return store.create_request(rid, [Slot("deb", "debian", n)], settings(**kw), actor=ACTOR).ok


# -- request ids ---------------------------------------------------------------------------
def test_request_id_with_only_its_trail_left_cannot_be_created_again(
    store: Store, keys: Keys
) -> None:
    """The hash and the trail expire independently (PEXPIRE per key, and a trail may be
    kept longer); while the trail exists the id is taken. Red before: the create only
    checked the hash, and a second request started a trail at version 1 in the middle
    of the old one (check_trail then reports non-contiguous versions)."""
    assert create(store, "r1")
    assert store.delete_request("r1", actor=ACTOR).ok
    store.redis.delete(keys.request("r1"))  # the hash expired first
    out = store.create_request("r1", [Slot("deb", "debian", 1)], settings(), actor=ACTOR)
    assert refused(out, "exists")
    assert not store.redis.exists(keys.request("r1"))
    assert check_trail("r1", store.history("r1")) == []


def test_request_id_with_a_tombstone_cannot_be_created_again(store: Store) -> None:
    assert create(store, "r1")
    assert store.delete_request("r1", actor=ACTOR).ok
    assert not create(store, "r1")


# -- VM names ------------------------------------------------------------------------------
def test_vm_name_tombstone_outlives_every_trail_that_mentions_it(store: Store, keys: Keys) -> None:
    """A VM that failed early is destroyed (tombstone: data_ttl) while its request goes
    on; the request's trail, which names the VM, lives data_ttl from the request's end.
    reserve_vm refuses a name whose record exists, so that check is only correct if the
    record lives at least as long as any trail naming it. Red before: the tombstone's
    TTL was data_ttl from the destroy, shorter than the trail's."""
    assert create(store, "r1", 1, data_ttl_s=60)
    assert store.reserve_vm("r1", name="vm-a", **VM).ok  # type: ignore[arg-type]
    assert store.vm_failed("vm-a", "boot", actor=ACTOR).code == "retry"
    assert store.vm_destroyed("vm-a", actor=ACTOR).ok
    # time passes while the request lives on: the tombstone has less left than data_ttl
    store.redis.pexpire(keys.vm("vm-a"), 1000)
    store.redis.pexpire(keys.vm_fence("vm-a"), 1000)
    assert store.delete_request("r1", actor=ACTOR).ok
    trail_ms = store.redis.pttl(keys.request_audit("r1"))
    assert trail_ms > 50_000
    assert store.redis.pttl(keys.vm("vm-a")) >= trail_ms - 1000


def test_vm_destroyed_after_its_request_closed_keeps_its_tombstone_past_the_trail(
    store: Store, keys: Keys
) -> None:
    """A ready request's trail lives data_ttl + lifetime; an operator ends a VM early
    and it is destroyed at once: its tombstone must still outlive the trail."""
    (a,) = make_request(store, "r1", 1, data_ttl_s=60, vm_lifetime_s=3600)
    assert store.vm_ready(a, actor=ACTOR).code == "fulfilled"
    assert store.end_vm_lifetime(a, actor=ACTOR, force=True).ok
    assert store.vm_destroyed(a, actor=ACTOR).ok
    trail_ms = store.redis.pttl(keys.request_audit("r1"))
    assert store.redis.pttl(keys.vm(a)) >= trail_ms - 1000


def test_vm_name_with_a_tombstone_cannot_be_reserved_again(store: Store) -> None:
    (a,) = make_request(store, "r1", 1)
    assert store.vm_failed(a, "boot", actor=ACTOR).code == "retry"
    assert store.vm_destroyed(a, actor=ACTOR).ok
    assert refused(store.reserve_vm("r1", name=a, **VM), "name_taken")  # type: ignore[arg-type]


# -- a VM outliving its request ---------------------------------------------------------------
def test_vm_outliving_its_request_never_writes_into_a_new_request_of_the_same_id(
    store: Store, keys: Keys
) -> None:
    """The old request's keys all expired (data_ttl) while one of its VMs was still
    booting (a provider that hangs for hours); the id is then free and a new request
    takes it. The old VM must not attach to the new request, count towards it, or write
    into its trail. Red before: the VM attached to the new request and fulfilled it."""
    (old,) = make_request(store, "r1", 1)
    for key in (
        keys.request("r1"),
        keys.request_vms("r1"),
        keys.request_audit("r1"),
        keys.request_fence("r1"),
    ):
        store.redis.delete(key)  # everything of the old request expired
    assert create(store, "r1", 1)
    before = store.history("r1")
    assert store.vm_ready(old, actor=ACTOR).code == "completed"
    assert store.vm_destroyed(old, actor=ACTOR).ok
    rec = store.get_request("r1")
    assert rec is not None and rec.status == "pending" and rec.have == 0
    assert store.history("r1") == before
    assert store.get_vm(old).state == "destroyed"  # type: ignore[union-attr]


def test_old_vm_failing_does_not_touch_the_new_request(store: Store, keys: Keys) -> None:
    (old,) = make_request(store, "r1", 1, created=False)
    for key in (
        keys.request("r1"),
        keys.request_vms("r1"),
        keys.request_audit("r1"),
        keys.request_fence("r1"),
    ):
        store.redis.delete(key)
    assert create(store, "r1", 1)
    before = store.history("r1")
    assert store.vm_created(old, actor=ACTOR).code == "completed"
    assert store.history("r1") == before
    assert store.get_request("r1").retries == 0  # type: ignore[union-attr]


# -- a VM's lifetime ends while its request is pending --------------------------------------
def test_lifetime_ending_while_pending_never_lets_the_request_turn_ready_short(
    store: Store, keys: Keys
) -> None:
    """Two VMs asked; the first attaches and its (short) lifetime ends before the second
    boots. Red before: the second VM's vm_ready counted have=2 >= need=2 and fulfilled
    the request with one live VM."""
    a, b = make_request(store, "r1", 2, vm_lifetime_s=0.05)
    assert store.vm_ready(a, actor=ACTOR).code == "running"
    vm = store.get_vm(a)
    assert vm is not None and vm.lifetime_end is not None
    end = vm.lifetime_end
    wait_until(lambda: store.server_time() > end)
    assert store.end_vm_lifetime(a, actor=ACTOR).ok
    out = store.vm_ready(b, actor=ACTOR)
    assert out.code == "running", out
    rec = store.get_request("r1")
    assert rec is not None and rec.status == "pending"
    # the slot is free again: a replacement can be reserved and completes the request
    assert rec.unreserved == 1
    assert store.reserve_vm("r1", name="r1-vm2", **VM).ok  # type: ignore[arg-type]
    assert store.vm_created("r1-vm2", actor=ACTOR).ok
    assert store.end_vm_lifetime(b, actor=ACTOR, force=True).ok
    assert store.vm_ready("r1-vm2", actor=ACTOR).code == "running"
    assert store.get_request("r1").status == "pending"  # type: ignore[union-attr]
    assert check_trail("r1", store.history("r1")) == []


def test_expiry_does_not_fulfil_a_request_whose_attached_vm_ended(store: Store) -> None:
    (a,) = make_request(store, "r1", 1, ttl_s=0.6, vm_lifetime_s=0.05)
    assert store.vm_ready(a, actor=ACTOR).code == "fulfilled"
    # a fulfilled request is not touched by its VM's end
    (b, c) = make_request(store, "r2", 2, ttl_s=0.6, vm_lifetime_s=0.05)
    assert store.vm_ready(b, actor=ACTOR).code == "running"
    assert store.end_vm_lifetime(b, actor=ACTOR, force=True).ok
    rec = store.get_request("r2")
    assert rec is not None
    wait_until(lambda: store.server_time() > rec.fail_at)
    assert store.vm_ready(c, actor=ACTOR).code == "completed"
    assert store.get_request("r2").status == "failed"  # type: ignore[union-attr]

"""The batched ready transition (Store.vms_ready, vm_ready_batch.lua) against a real Redis.

Proves: a batch of booted VMs gets, VM by VM, the very replies, records, indexes and
trails (times aside) that one vm_ready call each gives on a twin fleet, refusals among
them (a stale fence, a VM already running, a deleted request's VM) changing nothing of
their VM and stopping none of the others; it costs one EVALSHA and one TIME for the
whole batch where the one-by-one path pays one of each per VM; a repeat of the call
(its reply lost, redis-py's retry) changes nothing; a warm-pool VM is refused up front.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.ops import new_op
from vmpool.state.records import Booted, Outcome
from vmpool.state.store import Store

from storehelp import ACTOR, make_request, snapshot


def _fleet(client: redis.Redis, prefix: str) -> tuple[Store, list[Booted]]:
    """A fleet with the same mix of booted VMs under ``prefix``, and the batch of them."""
    store = Store(client, Keys(prefix))
    a1, a2 = make_request(store, "ra", 2)  # both ready: running, then fulfilled
    (b1,) = make_request(store, "rb", 1)  # its lock taken again since: a stale fence
    (c1,) = make_request(store, "rc", 1)  # already running: refused
    d1, _ = make_request(store, "rd", 2)  # its request deleted: the VM is completed
    assert store.vm_ready(c1, actor=ACTOR).code == "fulfilled"
    assert store.delete_request("rd", actor=ACTOR).ok
    fence = store.keys.vm_fence(b1)
    old, new = int(client.incr(fence)), int(client.incr(fence))
    assert new > old
    return store, [
        Booted(a1, "ra", None, "10.0.0.1", "10.0.0.1"),
        Booted(b1, "rb", old),
        Booted(c1, "rc", None),
        Booted(d1, "rd", None),
        Booted(a2, "ra", None, "", "10.0.0.2"),
    ]


def _state(store: Store, booted: list[Booted]) -> list[Any]:
    """What the transitions leave: records (times aside), index members, trails."""
    out: list[Any] = []
    for rid in sorted({b.request_id for b in booted}):
        rec = store.get_request(rid)
        assert rec is not None
        out.append((rid, rec.status, rec.version, rec.have))
        out.append([(e.entity, e.src, e.dst, e.version, e.reason) for e in store.history(rid)])
        assert check_trail(rid, store.history(rid)) == []
    for b in booted:
        vm = store.get_vm(b.name)
        assert vm is not None
        out.append((vm.name, vm.state, vm.hostname, vm.reason))
        out.append(store.vm_at_address(b.address) if b.address else None)
    for state in ("pending", "running", "completed"):
        out.append(sorted(store.pool_vms("debian", state)))
    return out


def _metrics(store: Store) -> dict[str, Any]:
    """The fleet's metric hashes as the transitions leave them, their times aside: each
    hash's fields, with the integer ones' values (bucket counts, finished requests)."""
    client = store.redis
    prefix = store.keys.prefix
    names = [*client.scan_iter(match=f"{prefix}:metrics:*"), store.keys.line_stats]
    names += list(client.scan_iter(match=f"{prefix}:summary:*"))
    out: dict[str, Any] = {}
    for name in sorted(names):
        fields = client.hgetall(name)
        ints = {f: v for f, v in fields.items() if v.lstrip("-").isdigit()}
        out[name.removeprefix(prefix)] = (sorted(fields), ints)
    return out


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_batch_does_what_one_call_per_vm_does_in_one_script_and_one_time(
    redis_client: redis.Redis,
) -> None:
    one, booted_one = _fleet(redis_client, "one")
    batch, booted = _fleet(redis_client, "batch")
    assert [b.name for b in booted] == [b.name for b in booted_one]

    replies_one = [
        one.vm_ready(
            b.name,
            actor=ACTOR,
            fence=b.fence,
            hostname=b.hostname,
            request_id=b.request_id,
            address=b.address,
        )
        for b in booted_one
    ]
    first = batch.vms_ready(booted[:1], actor=ACTOR)  # the script loaded: counted below alone
    batch_first = batch.get_request("ra")
    assert batch_first is not None and batch_first.have == 1
    evalsha, time_calls = _calls(redis_client, "evalsha"), _calls(redis_client, "time")
    replies = batch.vms_ready(booted[1:], actor=ACTOR)
    assert _calls(redis_client, "evalsha") - evalsha == 1
    assert _calls(redis_client, "time") - time_calls == 1

    assert [*first, *replies] == replies_one
    assert [(o.ok, o.code) for o in replies_one] == [
        (True, "running"),
        (False, "stale_fence"),
        (False, "vm_running"),
        (False, "vm_completed"),
        (True, "fulfilled"),
    ]
    assert _state(batch, booted) == _state(one, booted_one)
    assert _metrics(batch) == _metrics(one)


def test_a_batch_makes_its_metric_writes_once_with_what_each_vm_counted(
    redis_client: redis.Redis,
) -> None:
    """The gathered metric writes come to what one write per VM makes: the ready-time
    histogram's sum of every VM's sample, and the pool's running average taking the
    samples one after the other (each reads the one before it, not the stored value)."""
    store = Store(redis_client, Keys("avg"))
    names = make_request(store, "rv", 3)
    ago = {name: 100.0 * (i + 1) for i, name in enumerate(names)}  # reserved that long ago
    now = store.server_time()
    for name in names:
        redis_client.hset(store.keys.vm(name), "reserved_at", f"{now - ago[name]:.6f}")
    redis_client.hset(store.keys.line_stats, "ready:debian", "10.000000")
    replies = store.vms_ready([Booted(n, "rv", None) for n in names], actor=ACTOR)
    assert [o.code for o in replies] == ["running", "running", "fulfilled"]
    hist = redis_client.hgetall(store.keys.time_to_ready_prefix() + "debian")
    late = (float(hist["sum"]) - sum(ago.values())) / 3  # the unit's now - our now
    assert 0 <= late < 5
    average = 10.0
    for name in names:  # as line_average takes them, each written rounded
        average = float(f"{average + 0.2 * (late + ago[name] - average):.6f}")
    stored = float(redis_client.hget(store.keys.line_stats, "ready:debian") or 0)
    assert stored == pytest.approx(average, abs=1e-4)
    assert sum(int(v) for f, v in hist.items() if f != "sum") == 3


def test_a_repeat_of_the_batch_changes_nothing(redis_client: redis.Redis) -> None:
    store, booted = _fleet(redis_client, "rep")
    keys = store.keys
    args: list[str] = []
    script_keys: list[str] = []
    for b in booted:
        script_keys += keys.vm_script_keys(b.name, b.request_id)
        index = keys.addresses if b.address else ""
        args += [b.request_id, b.name, "" if b.fence is None else str(b.fence)]
        args += [b.hostname, b.address, index]
    op = new_op(60)
    first = store.scripts.run("vm_ready_batch", script_keys, ACTOR, "", args, op)
    assert first[0] == 2  # two of the five changed something
    before = snapshot(redis_client)
    again = store.scripts.run("vm_ready_batch", script_keys, ACTOR, "", args, op)
    assert again == first
    assert snapshot(redis_client) == before
    codes = [Outcome.from_reply(r).code for r in again[1:]]
    assert codes == ["running", "stale_fence", "vm_running", "vm_completed", "fulfilled"]


def test_a_warm_pool_vm_is_refused_before_anything_runs(redis_client: redis.Redis) -> None:
    store = Store(redis_client, Keys("warm"))
    with pytest.raises(ValueError, match="warm-pool"):
        store.vms_ready([Booted("w1", "", None)], actor=ACTOR)
    assert store.vms_ready([], actor=ACTOR) == []

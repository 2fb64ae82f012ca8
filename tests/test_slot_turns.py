"""Whose turn it is for a clone slot (_slots.lua slot_turns), against a real Redis.

Proves: the turns are the first requests of the slot line, as many as slots are free,
for lines shorter and longer than the peek the function reads first and for any number
of free slots (a naive reading of the line beside it); expired leases are dropped before
the free slots are counted; and a VM created while nobody waits in line (a fleet within
its clone limit) pays one read for the turns, not the drop of expired leases, a count
of the leases and a read of the line (three).
"""

from __future__ import annotations

import pytest
import redis

from vmpool.state.keys import Keys
from vmpool.state.semaphore import CloneSemaphore
from vmpool.state.store import Store

from storehelp import ACTOR, make_request


@pytest.mark.parametrize("waiting", [1, 3, 16, 17, 40])
@pytest.mark.parametrize("held", [0, 5, 20, 29, 30])
def test_the_turns_are_the_first_in_line_as_many_as_slots_are_free(
    redis_client: redis.Redis, waiting: int, held: int
) -> None:
    keys = Keys(f"turns{waiting}x{held}")
    sem = CloneSemaphore(redis_client, keys, limit=30, lease_s=60)
    line = [f"r{i:03d}" for i in range(waiting)]
    redis_client.zadd(keys.clone_slot_line, {rid: i for i, rid in enumerate(line)})
    far, gone = redis_client.time()[0] + 3600, 1.0  # leases live, and lapsed long ago
    if held:
        redis_client.zadd(keys.clone_slots, {f"vm-{i}": far for i in range(held)})
    redis_client.zadd(keys.clone_slots, {f"old-{i}": gone for i in range(3)})
    assert sem.turns() == line[: 30 - held]
    assert redis_client.zcard(keys.clone_slots) == held  # the lapsed ones dropped


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: int(v["calls"]) for name, v in stats.items()}


def test_a_create_with_nobody_in_line_reads_the_line_once(redis_client: redis.Redis) -> None:
    store = Store(redis_client, Keys("noline"))
    names = make_request(store, "r1", 2, created=False)
    sem = CloneSemaphore(redis_client, store.keys, limit=10, lease_s=60)
    assert all(sem.acquire(name, 0) is not None for name in names)  # each holds its slot
    assert store.vm_created(names[0], actor=ACTOR, slot_limit=10).code == "pending"  # loaded
    before = _calls(redis_client)
    out = store.vm_created(names[1], actor=ACTOR, slot_limit=10)
    after = _calls(redis_client)
    assert out.code == "pending" and out.turns == ()
    assert sem.count() == 0  # its slot given back
    grew = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert grew.get("cmdstat_zrange") == 1
    assert "cmdstat_zrangebyscore" not in grew and "cmdstat_zcard" not in grew, grew

"""The listing pending sweep's read and choice, against a real Redis.

The sweep reads each pool's pending index as names, oldest first, with how many of them
are past the provider's list lag and past the pool's timeout (``Store.pools_vms_aged``):
no score and no object per VM. Past an age is then a prefix of the names. These tests
prove that the VMs it picks for a lock from a list call's answers (``_due``) are exactly
those the rule VM by VM picks from each VM's own score (:func:`per_vm_due`), for every
order of the two ages, at their boundaries, on ties, and with entries that are no VM
name in the index (left for the dispatcher, which skips them).
"""

from __future__ import annotations

import itertools

import pytest
import redis

from vmpool.lifecycle.pending import Answers, Booting, _due, _named
from vmpool.providers import ProviderVM, ProviderVMState
from vmpool.state.keys import Keys
from vmpool.state.store import Store

NOW = 1_000_000.0
AGES = (0.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0)  # the (lag, timeout) pairs' boundaries too
KINDS = ("missing", *ProviderVMState)


def answer(name: str, kind: str) -> ProviderVM | None:
    if kind == "missing":
        return None
    return ProviderVM(name, "p", "t", ProviderVMState(kind), NOW, name)


def per_vm_due(
    scores: dict[str, float], seen: Answers, lag: float, timeout: float
) -> list[tuple[str, ProviderVM | None]]:
    """The rule VM by VM, from its index score: what ``_due`` must equal."""
    out = []
    for name, since in scores.items():
        held, age = seen.get(name), NOW - since
        acted = held is not None and held.state in (ProviderVMState.RUNNING, ProviderVMState.FAILED)
        if (age >= lag) if held is None else (acted or age >= timeout):
            out.append((name, held))
    return sorted(out, key=lambda item: item[0])


def fill(client: redis.Redis, store: Store, names: dict[str, float]) -> None:
    """The pending index of pool ``p``: each name at the score (entry time) given."""
    client.zadd(store.keys.pool_state("p", "pending"), names)


def booting(store: Store, lag: float, timeout: float) -> Booting:
    read = store.pools_vms_aged("pending", {"p": [lag, timeout]}, NOW)
    names, (lagged, timed_out) = read["p"]
    return Booting("p", names, lagged, timed_out)


@pytest.mark.parametrize(
    ("lag", "timeout"), [(0.0, 30.0), (30.0, 10.0), (20.0, 20.0), (10.0, 45.0), (0.0, 0.0)]
)
def test_the_vms_picked_from_the_prefixes_are_those_picked_vm_by_vm(
    redis_client: redis.Redis, lag: float, timeout: float
) -> None:
    """Every age (boundaries included, two VMs per score: a tie) times every answer."""
    store = Store(redis_client, Keys("vmpool"))
    scores = {
        f"vm-{int(age):02d}-{kind}-{copy}": NOW - age
        for age, kind, copy in itertools.product(AGES, KINDS, "ab")
    }
    fill(redis_client, store, scores)
    seen = {name: answer(name, name.split("-")[2]) for name in scores}
    group = booting(store, lag, timeout)
    assert group.names == redis_client.zrange(store.keys.pool_state("p", "pending"), 0, -1)
    got = sorted(_due(group, seen), key=lambda item: item[0])
    assert got == per_vm_due(scores, seen, lag, timeout)
    assert got  # the table has VMs on both sides of the line (all due at no age at all)
    assert len(got) < len(scores) or lag == timeout == 0


def test_entries_that_are_no_vm_name_are_left_out_and_the_counts_follow(
    redis_client: redis.Redis,
) -> None:
    """Hostile index entries between the VMs go to the per-VM rest (the dispatcher skips
    them), and the prefixes still count the right VMs."""
    store = Store(redis_client, Keys("vmpool"))
    scores = {f"vm-{int(age):02d}-{kind}": NOW - age for age in AGES for kind in KINDS}
    # 4 past the lag (15) and 2 past the timeout (40): counts not corrected for them
    # would take in the younger VMs next in line (of age 10, and of age 30)
    hostile = {
        "Bad Name": NOW - 50, "UPPER": NOW - 25, "under_score": NOW - 70, "dot.name": NOW - 16,
        "x" * 70: NOW - 1, "-dash": NOW,
    }  # fmt: skip
    fill(redis_client, store, {**scores, **hostile})
    seen = {name: answer(name, name.split("-")[2]) for name in scores}
    rest: list[str] = []
    group = _named(booting(store, 15.0, 40.0), rest)
    assert sorted(rest) == sorted(hostile)
    assert sorted(group.names) == sorted(scores)
    got = sorted(_due(group, seen), key=lambda item: item[0])
    assert got == per_vm_due(scores, seen, 15.0, 40.0)
    rest = []
    clean = _named(Booting("p", sorted(scores), 1, 2), rest)
    assert rest == [] and clean.names == sorted(scores)  # nothing to drop: as it was


def test_pools_vms_aged_reads_names_oldest_first_and_counts_per_age(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Names in score order and, per age asked, how many have a score at or before
    ``now - age``; a pool asked no age is read for its names alone; a missing index is
    empty."""
    store = Store(redis_client, Keys("vmpool"))
    redis_client.zadd(
        store.keys.pool_state("a", "pending"), {"a-2": 30.0, "a-0": 10.0, "a-1": 20.0}
    )
    redis_client.zadd(store.keys.pool_state("b", "pending"), {"b-0": 5.0})
    got = store.pools_vms_aged(
        "pending", {"a": [0.0, 15.0, 25.0, 100.0], "b": [], "c": [1.0]}, 35.0
    )
    assert got == {
        "a": (["a-0", "a-1", "a-2"], [3, 2, 1, 0]),  # at or before 35, 20, 10, -65
        "b": (["b-0"], []),
        "c": ([], [0]),
    }
    assert store.pools_vms_aged("pending", {"b": []}, 35.0) == {"b": (["b-0"], [])}
    assert store.pools_vms_aged("pending", {}, 35.0) == {}
    with redis.Redis.from_url(redis_url) as raw:  # a client that does not decode
        read = Store(raw, store.keys).pools_vms_aged("pending", {"b": []}, 35.0)
    assert read == {"b": (["b-0"], [])}

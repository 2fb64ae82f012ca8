"""Several OS processes drive ready / expire / delete / fail on the same requests.

What it proves: with vmpool's store, whatever the interleaving, every audit trail has
contiguous versions and only allowed transitions, no terminal request leaves its state,
no ready request becomes failed, no VM is attached to two requests, and the record's
final status is the one its trail ends with. The same driver pointed at
``tests/naive_store.py`` (vmpooler's read-then-write shape) breaks those invariants, so
the checks can fail.

Determinism: every round, all processes meet at a barrier and then act on the same
request, each with an operation drawn from its own seeded RNG. For the naive store the
processes also meet at a second barrier between their reads and their writes (its
``gap()``), which forces the interleaving the seed describes; vmpool's scripts have no
such gap: each operation is one atomic unit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
from collections import Counter
from typing import Any

import pytest
import redis

from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from naive_store import NaiveStore
from storehelp import ACTOR, make_request, wait_until

SEED = int(os.environ.get("VMPOOL_RACE_SEED", "20261202"))
PROCS = 4
ROUNDS = int(os.environ.get("VMPOOL_RACE_ROUNDS", "500"))
OPS = ("ready", "ready", "expire", "delete", "fail")


def _drive(
    kind: str,
    url: str,
    index: int,
    plan: list[tuple[str, list[str]]],
    round_barrier: Any,
    gap_barrier: Any,
    results: Any,
) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys()
    store: Any
    if kind == "naive":
        store = NaiveStore(client, keys, gap=lambda: gap_barrier.wait(timeout=20))
    else:
        store = Store(client, keys)
    rng = random.Random(f"{SEED}:{index}")
    counts: Counter[str] = Counter()
    for rid, vms in plan:
        op = rng.choice(OPS)
        round_barrier.wait(timeout=20)
        if op == "ready":
            out = store.vm_ready(rng.choice(vms), actor=ACTOR)
        elif op == "expire":
            out = store.expire_request(rid, actor=ACTOR)
        elif op == "delete":
            out = store.delete_request(rid, actor=ACTOR)
        else:
            out = store.vm_failed(rng.choice(vms), "boot timeout", actor=ACTOR)
        counts[f"{op}:{out.code}"] += 1
    results.put(dict(counts))


def run_race(kind: str, url: str, client: redis.Redis) -> tuple[list[str], Counter[str]]:
    keys = Keys()
    store = Store(client, keys)
    rng = random.Random(SEED)
    plan: list[tuple[str, list[str]]] = []
    short: list[str] = []
    for i in range(ROUNDS):
        rid = f"race-{i}"
        expiring = rng.random() < 0.5
        vms = make_request(store, rid, 2, ttl_s=2.0 if expiring else 600, max_vm_retries=1)
        if rng.random() < 0.5:
            store.vm_ready(vms[0], actor=ACTOR)  # one VM in: the next ready fulfils
            vms = vms[1:]
        if expiring:
            short.append(rid)
        plan.append((rid, vms))
    fail_ats = [r.fail_at for r in (store.get_request(rid) for rid in short) if r]
    if fail_ats:
        wait_until(lambda: store.server_time() > max(fail_ats), timeout=30)

    ctx = mp.get_context("fork")
    round_barrier = ctx.Barrier(PROCS)
    gap_barrier = ctx.Barrier(PROCS)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_drive,
            args=(kind, url, i, plan, round_barrier, gap_barrier, results),
        )
        for i in range(PROCS)
    ]
    for p in procs:
        p.start()
    totals: Counter[str] = Counter()
    try:
        for _ in procs:
            totals.update(results.get(timeout=240))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    problems: list[str] = []
    attached_to: dict[str, set[str]] = {}
    for rid, _ in plan:
        trail = store.history(rid)
        problems += [v.line() for v in check_trail(rid, trail)]
        rec = store.get_request(rid)
        assert rec is not None
        statuses = [e.dst for e in trail if e.entity == "request"]
        if statuses and statuses[-1] != rec.status:
            problems.append(f"request {rid}: record says {rec.status}, trail ends {statuses[-1]}")
        for e in trail:
            if e.entity.startswith("vm:") and e.dst == "running":
                attached_to.setdefault(e.entity[3:], set()).add(rid)
        if rec.status in ("failed", "deleted"):
            for vm in store.request_vms(rid):
                if vm.state == "running":
                    problems.append(f"request {rid}: {rec.status} but VM {vm.name} running")
    problems += [f"vm {n}: attached to {sorted(r)}" for n, r in attached_to.items() if len(r) > 1]
    return problems, totals


@pytest.mark.slow
def test_race_against_vmpool_store_is_clean(redis_url: str, redis_client: redis.Redis) -> None:
    problems, totals = run_race("store", redis_url, redis_client)
    print(f"\nvmpool store, seed {SEED}, {sum(totals.values())} ops: {dict(totals)}")
    print(f"violations: {len(problems)}")
    assert problems == []
    assert sum(totals.values()) == PROCS * ROUNDS
    # the interesting outcomes really happened, on both sides of each race
    assert totals["ready:fulfilled"] and totals["expire:failed"] and totals["delete:deleted"]
    assert totals["ready:vm_completed"] or totals["ready:completed"]


@pytest.mark.slow
def test_race_against_naive_store_finds_the_seed_bug(
    redis_url: str, redis_client: redis.Redis
) -> None:
    problems, totals = run_race("naive", redis_url, redis_client)
    kinds = Counter(p.split(":")[0] if p.startswith("invariant") else "state" for p in problems)
    print(f"\nnaive store, seed {SEED}, {sum(totals.values())} ops: {len(problems)} violations")
    print(f"by kind: {dict(kinds)}")
    for line in problems[:5]:
        print("  " + line)
    assert problems, "the naive store should break the invariants under this interleaving"
    assert any("invariant 1" in p for p in problems)  # a terminal request resurrected
    assert any("invariant 2" in p or "invariant 5" in p for p in problems)

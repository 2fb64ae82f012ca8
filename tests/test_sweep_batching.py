"""The sweeps' Redis round trips do not grow with the work they find ("never one round
trip per open request per tick"), against a real Redis.

A round trip is counted on the client: every ``send_packed_command`` of a redis-py
connection is one write the client then waits on (a command, or a whole pipeline), so
the count is exactly the number of request/reply exchanges. Both clients of the Fleet
(the decoding store client and RQ's bytes client) are counted; the server is real and
unmocked. The same measurement of the old per-VM dispatch (one ``enqueue`` per subject,
kept here as :class:`PerSubjectDispatcher`) grows by more than one round trip per VM,
so the bound below would fail for it; the tests assert that too, so the metric is shown
to tell the two apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from rq import Queue

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers import queues as q
from workers.table import QUEUE_REQUESTS, QUEUE_VMS, job_id

from redishelp import RoundTrips

SIM = "sim"
POOLS = ("debian", "centos")


class PerSubjectDispatcher(q.RQDispatcher):
    """The dispatch before batching: one enqueue (several round trips) per subject."""

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        for subject in subjects:
            q.enqueue(self.conn, self.keys, job, subject)


def make_config() -> Config:
    data = {
        # checked VM by VM: this measures the sweep's dispatch (the listing sweep's own
        # cost is in test_lifecycle and bench/targets.py)
        ":providers": {
            SIM: {
                "provider_class": "simulated",
                "boot_seconds": 0,
                "seed": 1,
                "batch_status": False,
            }
        },
        ":config": {"ondemand_request_ttl": 60, "ondemand_clone_limit": 100000},
        ":pools": [{"name": p, "template": f"{p}-t", "size": 0, "provider": SIM} for p in POOLS],
    }
    return parse_config(data, source="test", env={})


@dataclasses.dataclass
class Rig:
    counter: RoundTrips
    fleet: Fleet
    setup: Store  # an uncounted store client, for arranging state
    conn: redis.Redis  # an uncounted bytes client


@pytest.fixture(params=["batched", "per_subject"])
def rig(request: Any, redis_url: str, redis_client: redis.Redis) -> Iterator[Rig]:
    counter = RoundTrips()
    store_client = counter.client(redis_url, decode=True)
    rq_client = counter.client(redis_url, decode=False)
    dispatcher_class = q.RQDispatcher if request.param == "batched" else PerSubjectDispatcher
    config = make_config()
    fleet = Fleet.build(
        store_client, config, dispatcher_class(rq_client, Keys(config.key_prefix)), "worker:t:1"
    )
    conn = redis.Redis.from_url(redis_url)
    try:
        yield Rig(counter, fleet, Store(redis_client, fleet.keys), conn)
    finally:
        for client in (store_client, rq_client, conn):
            client.close()


def make_vms(rig: Rig, n: int, state: str, tag: str) -> list[str]:
    """``n`` VMs in ``state`` (pending or completed), spread over both pools, made
    through the store's own transitions."""
    settings = RequestSettings.from_config(rig.fleet.config)
    names: list[str] = []
    for p, pool in enumerate(POOLS):
        want = n // len(POOLS) + (1 if p < n % len(POOLS) else 0)
        if not want:
            continue
        rid = f"{tag}-{pool}"
        assert rig.setup.create_request(rid, [Slot(pool, pool, want)], settings, actor="t").ok
        for i in range(want):
            name = f"{tag}-{pool}-{i:05d}"
            out = rig.setup.reserve_vm(
                rid, name=name, alias=pool, pool=pool, template=f"{pool}-t",
                provider=SIM, domain=None, actor="t",
            )  # fmt: skip
            assert out.ok, out
            assert rig.setup.vm_created(name, actor="t").ok
            if state == "completed":
                assert rig.setup.vm_ready(name, actor="t").ok
                assert rig.setup.end_vm_lifetime(name, actor="t", force=True).ok
            names.append(name)
    return names


def round_trips(rig: Rig, sweep: Any) -> int:
    before = rig.counter.count
    sweep(rig.fleet)
    return rig.counter.count - before


def measure(rig: Rig, sweep: Any, state: str, n: int) -> tuple[int, int]:
    """(round trips of the first sweep over n VMs: all new jobs; of a second one: all
    duplicates of queued jobs, so the reclaim check runs for each)."""
    rig.conn.flushdb()
    names = make_vms(rig, n, state, tag=f"n{n}")
    cold = round_trips(rig, sweep)
    warm = round_trips(rig, sweep)
    queue_key = rig.fleet.keys.rq_queue(QUEUE_VMS)
    queued = {i.decode() for i in rig.conn.lrange(queue_key, 0, -1)}
    job = "check_pending_vm" if sweep is lifecycle.check_pending_sweep else "destroy_vm"
    # each queued exactly once
    assert queued == {job_id(rig.fleet.keys, job, name) for name in names}
    assert len(Queue(rig.fleet.keys.queue(QUEUE_VMS), connection=rig.conn)) == n
    return cold, warm


SWEEPS = [(lifecycle.check_pending_sweep, "pending"), (lifecycle.destroy_sweep, "completed")]


@pytest.mark.slow
@pytest.mark.parametrize(("sweep", "state"), SWEEPS, ids=["check_pending", "destroy"])
def test_sweep_round_trips_do_not_grow_with_the_vms(rig: Rig, sweep: Any, state: str) -> None:
    """Proves: one check-pending sweep (and one destroy sweep) over 300 VMs costs no
    more round trips than over 3 (plus 2 of slack), both when every job is new and when
    every job is already queued (each one a duplicate whose reclaim is checked). With
    the old per-VM dispatch (``per_subject``) the same sweep over 300 VMs costs at least
    300 more round trips than over 3: the bound fails, as asserted on that branch."""
    measure(rig, sweep, state, 2)  # warm up: connections, script loads, RQ's version probe
    small = measure(rig, sweep, state, 3)
    large = measure(rig, sweep, state, 300)
    batched = isinstance(rig.fleet.dispatch, q.RQDispatcher) and not isinstance(
        rig.fleet.dispatch, PerSubjectDispatcher
    )
    for s, big in zip(small, large, strict=True):
        if batched:
            assert big <= s + 2, (small, large)
            # 4 reads (server time, pending, stale reservations, the clone slots' turns)
            # + 2 pipelines (reclaim checks, pushes: each a SCRIPT EXISTS and itself);
            # warm: no push pipeline
            assert big <= 9, (small, large)
        else:
            assert big >= s + 297, (small, large)  # >= 1 extra round trip per extra VM


def test_provision_sweep_round_trips_do_not_grow(rig: Rig) -> None:
    """The same bound for provision_sweep over pending requests with unreserved slots."""
    settings = RequestSettings.from_config(rig.fleet.config)

    def requests(n: int) -> int:
        rig.conn.flushdb()
        for i in range(n):
            slots = [Slot("debian", "debian", 1)]
            assert rig.setup.create_request(f"r{n}-{i}", slots, settings, actor="t").ok
        cold = round_trips(rig, lifecycle.provision_sweep)
        assert len(Queue(rig.fleet.keys.queue(QUEUE_REQUESTS), connection=rig.conn)) == n
        return cold

    requests(2)  # warm up
    small, large = requests(3), requests(300)
    if isinstance(rig.fleet.dispatch, PerSubjectDispatcher):
        assert large >= small + 297
    else:
        assert large <= small + 2, (small, large)


def test_chunks_cost_a_constant_each(redis_url: str, redis_client: redis.Redis) -> None:
    """enqueue_many's round trips grow with the number of chunks, not of subjects."""
    counter = RoundTrips()
    conn = counter.client(redis_url, decode=False)
    try:
        q.enqueue_many(conn, Keys(), "destroy_vm", ["warm-up"])
        costs = []
        for n in (10, 40):  # 2 and 8 chunks of 5
            redis_client.flushdb()
            before = counter.count
            names = [f"vm-{i}" for i in range(n)]
            assert q.enqueue_many(conn, Keys(), "destroy_vm", names, chunk=5) == n
            costs.append(counter.count - before)
        assert costs[1] <= 4 * costs[0] + 2, costs
        # two pipelines per chunk (reclaim checks, pushes), each SCRIPT EXISTS + itself
        assert costs[1] <= 8 * 4 + 2, costs
    finally:
        conn.close()


def test_pools_vms_matches_pool_vms(redis_client: redis.Redis) -> None:
    """Store.pools_vms is Store.pool_vms for each pool, read in one pipeline."""
    store = Store(redis_client, Keys("vmpool"))
    for pool, n in (("a", 4), ("b", 0), ("c", 3)):
        for i in range(n):
            redis_client.zadd(store.keys.pool_state(pool, "pending"), {f"{pool}-{i}": i})
    pools = ["a", "b", "c", "nope"]
    for kwargs in ({}, {"max_score": 1.5}, {"limit": 2}, {"max_score": 2, "limit": 1}):
        got = store.pools_vms(pools, "pending", **kwargs)
        assert got == {p: store.pool_vms(p, "pending", **kwargs) for p in pools}
    assert store.pools_vms([], "pending") == {}
    assert store.pools_vms(["a"], "pending", max_score=1) == {"a": ["a-0", "a-1"]}


def test_the_listing_sweep_costs_the_same_for_300_booting_vms_as_for_3(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: with a provider that lists (the default simulated one, as the clouds), a
    check-pending sweep over 300 booting VMs costs the same round trips as over 3: one
    index read for all pools, one list call (a page holds LIST_PAGE VMs), no lock and no
    job for a VM still booting.
    Then it records the booted ones itself, one checked transition each. (Checked VM by
    VM, as in the test above, each booting VM costs a dispatch instead.)"""
    from vmpool.lifecycle.pending import check_batched
    from vmpool.providers.simulated import ListingSimulatedProvider

    counter = RoundTrips()
    client = counter.client(redis_url, decode=True)
    data = make_config()
    listing = {**data.providers[SIM].options, "batch_status": True, "boot_seconds": 3600}
    config = dataclasses.replace(
        data, providers={SIM: dataclasses.replace(data.providers[SIM], options=listing)}
    )
    fleet = Fleet.build(client, config, q.RQDispatcher(client, Keys()), "worker:t:1")
    sim = fleet.providers[SIM]
    assert isinstance(sim, ListingSimulatedProvider)
    sim.statuses(["warm-up"])  # redis-py loads the list's script on first use, once
    setup = Store(redis_client, fleet.keys)
    costs = []
    for n in (3, 300):
        redis_client.flushdb()
        rig = Rig(counter, fleet, setup, redis_client)
        names = make_vms(rig, n, "pending", tag=f"n{n}")
        for name in names:
            sim.create_vm(name.split("-")[1], "t", name)
        before = counter.count
        assert check_batched(fleet, list(POOLS)) == []
        costs.append(counter.count - before)
        assert not list(redis_client.scan_iter(match="*lock*"))  # no VM was locked
    assert costs[1] == costs[0] <= 3, costs  # server time, index, one list call


def test_the_listing_sweep_grants_and_releases_the_locks_of_a_claim_at_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the listing sweep records 40 booted VMs ready with their locks granted in
    one script per 20 VMs, their checked transitions in one script per 20
    (``vm_ready_batch``) and the locks released in one: 15 round trips (53 with one
    ``vm_ready`` call per VM; 129 with each VM's lock also taken and released on its
    own)."""
    from vmpool.lifecycle.pending import LOCKS_AT_ONCE, check_batched
    from vmpool.providers.simulated import ListingSimulatedProvider

    counter = RoundTrips()
    client = counter.client(redis_url, decode=True)
    data = make_config()
    listing = {**data.providers[SIM].options, "batch_status": True, "boot_seconds": 0}
    config = dataclasses.replace(
        data, providers={SIM: dataclasses.replace(data.providers[SIM], options=listing)}
    )
    fleet = Fleet.build(client, config, lifecycle.RecordingDispatcher(), "worker:t:1")
    sim = fleet.providers[SIM]
    assert isinstance(sim, ListingSimulatedProvider)
    rig = Rig(counter, fleet, Store(redis_client, fleet.keys), redis_client)
    names = make_vms(rig, 40, "pending", tag="up")
    for name in names:
        sim.create_vm(name.split("-")[1], "t", name)
    before = counter.count
    assert check_batched(fleet, list(POOLS)) == []
    cost = counter.count - before
    states = {vm.state for n in names if (vm := rig.setup.get_vm(n)) is not None}
    assert states == {"running"}, states  # ready, and handed to its request
    claims = -(-len(names) // LOCKS_AT_ONCE)
    # per claim its grant, its transitions and its release; a constant (the listing's reads)
    assert cost <= 3 * claims + 12, cost
    assert not list(redis_client.scan_iter(match="*:lock:*"))  # every lock released

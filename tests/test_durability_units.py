"""One confirmation per unit of work (vmpool.state.durability), against a real primary
and replica.

What this proves:
- an acknowledged unit's writes are on the replica when the unit is acknowledged: with
  the replica stopped, the unit's script calls return (they do not wait) but its end
  does not, until the replica is back; then every key is on the replica;
- a unit that wrote nothing, a unit left by an exception and an ``unconfirmed`` block
  send no WAIT; a write outside any unit waits as it does alone;
- a job whose writes are not confirmed is failed by RQ, not finished;
- an API call pays one WAIT, whatever it writes (vmpool.api.confirming);
- a create claim waits once before its provider calls, not once per create (the
  records of its earlier creates decide nothing of the later ones), and its end
  confirms them; a pipeline ``settled`` in a unit carries that wait itself;
- the fleet pays about one WAIT per VM: requests posted through the API and run to
  ready by a vmpool worker (each job one unit) cost at most 3 WAITs per VM end to end
  (one per script call, about 12 per VM, without units), and a POST one;
- a unit whose primary changed in its course is refused, even if the first primary is
  named again by its end.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from rq.job import Job as RQJob
from rq.job import JobStatus

from vmpool import lifecycle
from vmpool.config import default_redis_options
from vmpool.ids import Job
from vmpool.lifecycle import batch
from vmpool.local.redis_server import free_port
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.durability import (
    DurabilitySetting,
    WriteNotConfirmed,
    confirmed,
    current_scope,
    unconfirmed,
)
from vmpool.state.group_watch import GroupView, GroupWatch, PinnedPrimary
from vmpool.state.keys import Keys
from vmpool.state.lua import run_pipelined
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.queues import enqueue
from workers.table import PERIODIC, job_id
from workers.worker import build_worker

from apihelp import API, PASSWORD, make_client, spec_config
from lifecyclehelp import create_request, make_config, make_fleet
from sentinelhelp import HOST, Node, wait_for

pytestmark = pytest.mark.slow

SET = "return redis.call('SET', KEYS[1], ARGV[1])"
GET = "return redis.call('GET', KEYS[1])"


def options(timeout_s: float) -> RedisOptions:
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=timeout_s)
    return dataclasses.replace(default_redis_options(), durability=setting)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    nodes = []
    for name, args in (("primary", ["--appendonly", "yes", "--appendfsync", "always"]),
                       ("replica", [])):  # fmt: skip
        (tmp_path / name).mkdir()
        if nodes:
            args = ["--replicaof", HOST, str(nodes[0].port)]
        nodes.append(Node(name, free_port(), tmp_path / name, ["--save", "", *args]).start())
    primary, replica = nodes
    try:
        wait_for(lambda: replica.client().info("replication")["master_link_status"] == "up",
                 20, "the replica to sync")  # fmt: skip
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def url_of(node: Node) -> str:
    return f"redis://{HOST}:{node.port}/0"


def waits(node: Node) -> int:
    """WAITs the server has run since its last CONFIG RESETSTAT."""
    stats = node.client().info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


def test_a_unit_is_acknowledged_only_once_the_replica_holds_all_its_writes(
    pair: tuple[Node, Node],
) -> None:
    """The replica is stopped (SIGSTOP). A unit writes five keys: each script call
    returns at once (no wait of its own), the unit's end does not return while the
    replica is stopped. Once it is continued, the end returns, and the five keys are
    on the replica at that moment. One WAIT for the five writes."""
    primary, replica = pair
    client = connect(url_of(primary), options(10.0), decode_responses=True)
    script = client.register_script(SET)
    primary.client().config_resetstat()
    written = threading.Event()
    ended: list[float] = []

    def unit() -> None:
        with confirmed(client):
            for n in range(5):
                script(keys=[f"k{n}"], args=[n])
            written.set()
        ended.append(time.monotonic())

    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    thread = threading.Thread(target=unit, daemon=True)
    try:
        thread.start()
        assert written.wait(5), "the unit's script calls waited for the stopped replica"
        thread.join(0.5)
        assert thread.is_alive() and not ended, "acknowledged before the replica held it"
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    thread.join(10)
    assert ended
    held = replica.client(decode_responses=True).mget([f"k{n}" for n in range(5)])
    assert held == [str(n) for n in range(5)]
    assert waits(primary) == 1


def test_a_unit_not_confirmed_in_time_raises(pair: tuple[Node, Node]) -> None:
    """With the replica stopped, the unit's end raises WriteNotConfirmed after the
    timeout: the unit is not acknowledged (a job fails, the API answers 503)."""
    primary, replica = pair
    client = connect(url_of(primary), options(0.3), decode_responses=True)
    script = client.register_script(SET)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        with pytest.raises(WriteNotConfirmed), confirmed(client):
            script(keys=["k"], args=["v"])
    finally:
        os.kill(replica.pid, signal.SIGCONT)


def test_what_sends_no_wait_and_what_waits_alone(pair: tuple[Node, Node]) -> None:
    """No WAIT for a unit that made no script call, one left by an exception, and an
    ``unconfirmed`` block; one per call outside any unit, as before; a unit inside a
    unit is part of it."""
    primary, _ = pair
    client = connect(url_of(primary), options(5.0), decode_responses=True)
    script = client.register_script(SET)
    primary.client().config_resetstat()
    with confirmed(client):
        client.get("k")
    with pytest.raises(ZeroDivisionError), confirmed(client):
        script(keys=["a"], args=["1"])
        raise ZeroDivisionError
    with unconfirmed():
        script(keys=["b"], args=["1"])
    assert waits(primary) == 0
    script(keys=["c"], args=["1"])
    script(keys=["d"], args=["1"])
    assert waits(primary) == 2
    with confirmed(client):
        script(keys=["e"], args=["1"])
        with confirmed(client):
            script(keys=["f"], args=["1"])
        script(keys=["g"], args=["1"])
    assert waits(primary) == 3


def test_a_create_claim_waits_once_before_its_creates(
    pair: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five reserved VMs created by one claim in one unit: one WAIT before the first
    provider call (the claim's locks and slots, the reservations), none before the four
    after it (red before: one per create, 6 in all), one at the unit's end for the
    records. Every VM pending, and its record on the replica."""
    primary, replica = pair
    config = dataclasses.replace(make_config(), redis_options=options(5.0))
    client = connect(url_of(primary), options(5.0), decode_responses=True)
    fleet = make_fleet(client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 5)], config)
    names = lifecycle.provision_request(fleet, "r1")
    assert len(names) == 5
    WorkSet(client, fleet.keys).add(Job.CREATE_VM, names)
    monkeypatch.setattr(batch, "FIRST_CLAIM", {})  # one claim of all five
    primary.client().config_resetstat()
    with confirmed(client):
        counts = lifecycle.create_vm_batch(fleet)
    assert counts == {"pending": 5}
    assert waits(primary) == 2
    on_replica = replica.client()
    assert all(on_replica.hget(fleet.keys.vm(n), "state") == b"pending" for n in names)


def test_a_settled_pipeline_confirms_the_units_writes_in_its_round_trip(
    pair: tuple[Node, Node],
) -> None:
    """A unit writes, then runs a pipeline ``settled`` (a create claim's slots and lock
    check, before its provider call): once it returns, nothing of the unit is pending
    (the earlier write and the pipeline's are confirmed), both are on the replica, and
    the unit's end sends no second WAIT: one in all."""
    primary, replica = pair
    client = connect(url_of(primary), options(5.0), decode_responses=True)
    work = WorkSet(client, Keys("settle"))
    primary.client().config_resetstat()
    with confirmed(client):
        work.add(Job.CREATE_VM, ["a"])
        scope = current_scope()
        assert scope is not None and scope.pending
        replies = run_pipelined(client, [work.add_call(Job.CREATE_VM, ["b"])], settled=True)
        assert replies == [1]
        assert not scope.pending and waits(primary) == 1
        members = replica.client().zrange(Keys("settle").work_set(Job.CREATE_VM), 0, -1)
        assert sorted(members) == [b"a", b"b"]
    assert waits(primary) == 1


def test_a_batch_job_that_finds_nothing_to_claim_waits_for_no_replica(
    pair: tuple[Node, Node],
) -> None:
    """A batch job whose work set another worker has emptied (its claim finds nothing)
    sends no WAIT: its claim is bookkeeping, as a dequeue is (red before: one WAIT for
    the empty claim). A job that claims and creates still waits, for the writes its
    claim led to."""
    primary, _ = pair
    config = dataclasses.replace(make_config(), redis_options=options(5.0))
    client = connect(url_of(primary), options(5.0), decode_responses=True)
    fleet = make_fleet(client, config)
    primary.client().config_resetstat()
    with confirmed(client):
        assert lifecycle.create_vm_batch(fleet) == {}
    assert waits(primary) == 0
    create_request(fleet.store, "r1", [Slot("deb", "debian", 1)], config)
    names = lifecycle.provision_request(fleet, "r1")
    WorkSet(client, fleet.keys).add(Job.CREATE_VM, names)
    primary.client().config_resetstat()
    with confirmed(client):
        assert lifecycle.create_vm_batch(fleet) == {"pending": 1}
    assert waits(primary) >= 1


def test_the_fleet_pays_one_wait_per_vm_or_so(pair: tuple[Node, Node]) -> None:
    """Ten one-VM requests posted through the API (each POST one WAIT at most, plus the
    one that queues the lanes) and run to ready by a vmpool worker: at most 3 WAITs per
    VM for all the jobs (about 12 per VM when every script call waits alone)."""
    primary, _ = pair
    url = url_of(primary)
    config = dataclasses.replace(make_config(), redis_options=options(5.0))
    client, _ = make_client(config, url)
    rids = [client.post(f"{API}/ondemandvm", json={"debian": 1}).json()["request_id"]]
    primary.client().config_resetstat()  # after the first: the app's own first writes
    for _ in range(10):
        r = client.post(f"{API}/ondemandvm", json={"debian": 1})
        assert r.status_code == 201, r.text
        rids.append(r.json()["request_id"])
    posts = waits(primary)
    assert posts <= 10 + 1, posts
    worker = build_worker(url, config, kind="simple")
    conn = redis.Redis.from_url(url)
    keys = Keys(config.key_prefix)
    deadline = time.monotonic() + 60
    total = 0
    while not all(client.get(f"{API}/ondemandvm/{rid}").status_code == 200 for rid in rids):
        assert time.monotonic() < deadline
        for job in ("provision_sweep", "check_pending_sweep"):
            enqueue(conn, keys, job)
        primary.client().config_resetstat()
        worker.work(burst=True)
        total += waits(primary)
    assert worker.failed_job_count == 0
    print(f"WAITs: {posts} for 10 POSTs, {total} for the jobs of {len(rids)} VMs")
    assert total <= 3 * len(rids), total


def test_a_unit_whose_primary_changed_is_refused() -> None:
    """The guard of a unit's first write counts the changes of the primary the watch
    saw: A, then B, then A again by the unit's end is still a refusal (writes may have
    gone to B), though A is named at both ends."""
    views = iter([GroupView(("h", 1)), GroupView(("h", 2)), GroupView(("h", 1))])
    watch = GroupWatch(lambda: next(views), interval_s=3600)
    watch.refresh()
    guard = PinnedPrimary(watch, ("h", 1), watch.changes)
    assert guard.refusal() is None
    watch.refresh()
    watch.refresh()
    assert watch.current().primary == ("h", 1)
    refusal = guard.refusal()
    assert refusal is not None and "changed" in refusal
    watch.close()


def test_an_idle_fleet_sends_no_wait(pair: tuple[Node, Node]) -> None:
    """Every periodic job run once on a fleet with nothing to do (pools of size 0, no
    request), by a vmpool worker, and the worker idling: no WAIT (each job's unit made
    no write; the loop's own writes are unconfirmed)."""
    primary, _ = pair
    url = url_of(primary)
    config = dataclasses.replace(make_config(), redis_options=options(5.0))
    worker = build_worker(url, config, kind="simple")
    conn = redis.Redis.from_url(url)
    keys = Keys(config.key_prefix)
    primary.client().config_resetstat()
    for spec in PERIODIC:
        enqueue(conn, keys, spec.name)
    worker.work(burst=True)
    assert worker.failed_job_count == 0
    per_job = {}
    for spec in PERIODIC:
        primary.client().config_resetstat()
        enqueue(conn, keys, spec.name)
        worker.work(burst=True)
        per_job[spec.name] = waits(primary)
    assert sum(per_job.values()) == 0, per_job


def test_an_api_call_pays_one_wait(pair: tuple[Node, Node]) -> None:
    """With auth and a rate limit on, each call is one unit of work: a POST (the
    token's use, the create), a GET (its read, confirmed) and a DELETE (the token's use,
    the delete) pay one WAIT each (2, 1 and 3 when every script call waits alone). The
    POST's answer is what the replica holds: the request is on it when the POST answers.
    """
    primary, replica = pair
    config = dataclasses.replace(
        spec_config(auth=True, rate_limit=1000), redis_options=options(5.0)
    )
    client, _ = make_client(config, url_of(primary))
    token = client.post(f"{API}/token", auth=("jdoe", PASSWORD)).json()["token"]
    auth = {"X-AUTH-TOKEN": token}
    first = client.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=auth)  # the app's first
    client.get(f"{API}/ondemandvm/{first.json()['request_id']}")  # its scripts loaded
    got = {}
    for call in ("post", "get", "delete"):
        primary.client().config_resetstat()
        if call == "post":
            r = client.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=auth)
            assert r.status_code == 201, r.text
            rid = r.json()["request_id"]
            held = replica.client().exists(f"vmpool:request:{{{rid}}}")
            assert held, "the POST answered before the replica held the request"
        elif call == "get":
            assert client.get(f"{API}/ondemandvm/{rid}").status_code == 202
        else:
            assert client.delete(f"{API}/ondemandvm/{rid}", headers=auth).status_code == 200
        got[call] = waits(primary)
    assert got == {"post": 1, "get": 1, "delete": 1}, got


def test_a_job_whose_writes_are_not_confirmed_fails(pair: tuple[Node, Node]) -> None:
    """A job is done only once its writes are confirmed: with the replica stopped, a
    provision job reserves its VM on the primary (its script calls do not wait), its
    unit's end is refused, and RQ records the job failed (WriteNotConfirmed), not
    finished."""
    primary, replica = pair
    url = url_of(primary)
    config = dataclasses.replace(make_config(), redis_options=options(0.5))
    client, _ = make_client(config, url)
    rid = client.post(f"{API}/ondemandvm", json={"debian": 1}).json()["request_id"]
    conn = redis.Redis.from_url(url)
    conn.delete(*conn.keys("rq:queue:*"))  # the POST's own batch job: not this test's
    worker = build_worker(url, config, kind="simple")
    enqueue(conn, Keys(config.key_prefix), "provision_request", rid)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        worker.work(burst=True)
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    job = RQJob.fetch(job_id(Keys(config.key_prefix), "provision_request", rid), connection=conn)
    assert job.get_status() == JobStatus.FAILED
    assert "WriteNotConfirmed" in str(job.latest_result().exc_string)
    reserved = primary.client().hget(f"vmpool:request:{{{rid}}}", "unreserved")
    assert reserved == b"0", reserved  # written on the primary, not acknowledged


def test_an_api_call_refused_at_its_end_is_one_503_and_no_error(pair: tuple[Node, Node]) -> None:
    """A call whose writes cannot be confirmed (the replica stopped: a DELETE's script
    ran on the primary) is answered 503 and nothing more: the unit's end does not raise
    again into the server after the refusal went out. Red before, when uvicorn logged
    "Exception in ASGI application" for such calls in a planned switch."""
    primary, replica = pair
    config = dataclasses.replace(spec_config(), redis_options=options(0.5))
    _, app = make_client(config, url_of(primary))
    client = TestClient(app)  # raises what reaches the server
    rid = client.post(f"{API}/ondemandvm", json={"pool3": 1}).json()["request_id"]
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        reply = client.delete(f"{API}/ondemandvm/{rid}")
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    assert reply.status_code == 503, reply.text
    assert reply.json()["ok"] is False

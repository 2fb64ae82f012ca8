"""Job ids, dedup, reclaim and dispatch, against a real Redis (the schedule: test_schedule.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import Job as RQJob
from rq.job import JobStatus

from vmpool.config import load_config
from vmpool.ids import Job
from vmpool.state.counters import SKIPPED_METRIC
from vmpool.state.keys import Keys
from workers import queues as q
from workers.batching import BatchDispatcher
from workers.jobs import noop
from workers.table import (
    JOBS,
    QUEUE_REQUESTS,
    QUEUE_SWEEPS,
    QUEUE_VMS,
    QUEUES,
    decode_fragment,
    encode_fragment,
    job_id,
    lookup,
    template_id,
)
from workers.worker import FleetJob, build_worker, current_fleet

K = Keys()  # the default prefix, `vmpool`


# -- ids --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "subject",
    [
        "abc",
        "a.b",
        "a_b",
        "a__b",
        "a_.b",
        "a._b",
        "x-y",
        "a:b",
        "a-_d",
        "3f2a9c1e-0b6d-4d2e-9a7f-1c2b3d4e5f60",
    ],
)
@pytest.mark.parametrize("keep_dashes", [False, True])
def test_encode_roundtrip(subject: str, keep_dashes: bool) -> None:
    enc = encode_fragment(subject, keep_dashes=keep_dashes)
    assert all(c.isalnum() or c in "_-" for c in enc)
    assert ("-" in enc) == (keep_dashes and "-" in subject)
    assert decode_fragment(enc) == subject


def test_encoding_is_injective_on_tricky_pairs() -> None:
    pairs = [
        ("a.b", "a_ob"),
        ("a_b", "a__b"),
        ("a._b", "a_.b"),
        ("a-b", "a.b"),
        ("a-b", "a_db"),
        ("a:b", "a_cb"),
    ]
    for keep in (False, True):
        for left, right in pairs:
            assert encode_fragment(left, keep_dashes=keep) != encode_fragment(
                right, keep_dashes=keep
            )


def test_ids_carry_the_prefix_and_stay_readable() -> None:
    rid = "3f2a9c1e-0b6d-4d2e-9a7f-1c2b3d4e5f60"
    assert job_id(K, "provision_request", rid) == f"vmpool-provision_request-{rid}"
    assert job_id(K, "create_vm", "deb-abc") == "vmpool-create_vm-deb-abc"
    assert job_id(K, "sweep_expired") == "vmpool-sweep_expired"
    assert job_id(Keys("ci:fleet-2"), "sweep_expired") == "ci_cfleet_d2-sweep_expired"
    assert template_id(K, "reap_running") == "vmpool-schedule-reap_running"


def test_old_job_names_are_aliases() -> None:
    assert job_id(K, lookup("provision").name, "r1") == job_id(K, "provision_request", "r1")
    assert job_id(K, lookup("check-pending-sweep").name) == "vmpool-check_pending_sweep"
    with pytest.raises(ValueError):  # an alias is text a person typed, not a job's name
        job_id(K, "provision", "r1")


def test_ids_of_two_fleets_never_collide() -> None:
    """The tag holds no '-', so the first '-' ends it: prefix 'a-b' and prefix 'a'
    with any job and subject give different ids."""
    ids = {
        job_id(Keys(prefix), job, subject)
        for prefix in ("a", "a-b", "a_b", "a.b", "a:b", "a_d")
        for job, subject in (("create_vm", "b-x"), ("provision_request", "x"), ("destroy_vm", "x"))
    }
    assert len(ids) == 18


@pytest.mark.parametrize("bad", ["", "a b", "{x}", "a/b", "a\n"])
def test_bad_subjects_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        encode_fragment(bad)
    with pytest.raises(ValueError):
        encode_fragment(bad + "\n")


def test_subject_arity_checked() -> None:
    with pytest.raises(ValueError):
        job_id(K, "provision_request")
    with pytest.raises(ValueError):
        job_id(K, "sweep_expired", "x")
    with pytest.raises(ValueError):
        job_id(K, "nonsense")


def test_run_ids_of_periodic_jobs() -> None:
    assert job_id(K, "sweep_expired", run=1796220642783) == "vmpool-sweep_expired_r1796220642783"
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            job_id(K, "sweep_expired", run=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        job_id(K, "create_vm", "deb-abc", run=1)  # per-subject jobs have no runs
    # no subject-bearing id equals a run id: an encoded subject escapes every "_"
    assert job_id(K, "check_pending_vm", "sweep_r1") == "vmpool-check_pending_vm-sweep__r1"
    assert job_id(K, "check_pending_sweep", run=1) == "vmpool-check_pending_sweep_r1"


def test_every_job_has_an_entry_point() -> None:
    import workers.jobs

    for spec in JOBS.values():
        module, _, attr = spec.func.rpartition(".")
        assert module == "workers.jobs"
        assert callable(getattr(workers.jobs, attr))
        assert spec.queue in QUEUES


def test_resolve_queue_names() -> None:
    assert q.resolve_queue_names(K, None) == ["vmpool-sweeps", "vmpool-requests", "vmpool-vms"]
    assert q.resolve_queue_names(K, "vms,vmpool-sweeps") == ["vmpool-vms", "vmpool-sweeps"]
    other = Keys("ci")
    assert q.resolve_queue_names(other, "vms,ci-sweeps") == ["ci-vms", "ci-sweeps"]
    for bad in ("nope", "ci-vms"):
        with pytest.raises(ValueError):
            q.resolve_queue_names(K, bad)


def test_keys_spell_rq_keys_as_rq_does(conn: redis.Redis) -> None:
    queue = Queue(K.queue(QUEUE_VMS), connection=conn)
    assert K.rq_queue(QUEUE_VMS) == queue.key
    assert K.rq_job("vmpool-x") == RQJob.key_for("vmpool-x")


# -- dedup ------------------------------------------------------------------------------
def test_at_most_one_queued_copy(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "provision_request", "r.1") is True
    assert q.enqueue(conn, K, "provision_request", "r.1") is False
    assert q.enqueue(conn, K, "provision_request", "r_1") is True  # a different subject
    queue = Queue(K.queue(QUEUE_REQUESTS), connection=conn)
    assert sorted(queue.job_ids) == sorted(
        [job_id(K, "provision_request", "r.1"), "vmpool-provision_request-r__1"]
    )
    job = RQJob.fetch(job_id(K, "provision_request", "r.1"), connection=conn)
    assert job.args == ("r.1",)
    assert job.result_ttl == 0
    assert job.failure_ttl == q.FAILURE_TTL


def test_jobs_go_to_their_queues(conn: redis.Redis) -> None:
    for name, spec in JOBS.items():
        subject = {None: None, "request": "rid-1", "vm": "vm-1", "vm_task": "vm-1:disk:d1"}[
            spec.subject
        ]
        assert q.enqueue(conn, K, name, subject)
    for short in QUEUES:
        ids = Queue(K.queue(short), connection=conn).job_ids
        assert ids and all(JOBS[_job_of(i)].queue == short for i in ids)


def _job_of(jid: str) -> str:
    return jid.split("-")[1]


def test_running_job_is_not_requeued_but_a_finished_one_is(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "sweep_expired")
    job = RQJob.fetch(job_id(K, "sweep_expired"), connection=conn)
    job.set_status(JobStatus.STARTED)
    conn.hset(job.key, q.HEARTBEAT_FIELD, f"{_server_now(conn):.3f}")
    Queue(K.queue(QUEUE_SWEEPS), connection=conn).remove(job)
    assert q.enqueue(conn, K, "sweep_expired") is False  # live: heartbeat fresh
    job.delete()  # what result_ttl=0 does on success
    assert q.enqueue(conn, K, "sweep_expired") is True


def test_failed_duplicate_is_reclaimed(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "reap_running")
    job = RQJob.fetch(job_id(K, "reap_running"), connection=conn)
    Queue(K.queue(QUEUE_SWEEPS), connection=conn).remove(job)
    job.set_status(JobStatus.FAILED)
    assert q.enqueue(conn, K, "reap_running") is True
    assert Queue(K.queue(QUEUE_SWEEPS), connection=conn).job_ids == [job_id(K, "reap_running")]


def test_stale_started_duplicate_is_reclaimed(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "destroy_vm", "vm-9")
    job = RQJob.fetch(job_id(K, "destroy_vm", "vm-9"), connection=conn)
    Queue(K.queue(QUEUE_VMS), connection=conn).remove(job)
    job.set_status(JobStatus.STARTED)
    stale = _server_now(conn) - q.STALE_AFTER_SECONDS - 1
    conn.hset(job.key, q.HEARTBEAT_FIELD, f"{stale:.3f}")
    assert q.enqueue(conn, K, "destroy_vm", "vm-9") is True
    assert Queue(K.queue(QUEUE_VMS), connection=conn).job_ids == [job_id(K, "destroy_vm", "vm-9")]


def test_started_without_heartbeat_is_left_alone(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "reconcile")
    job = RQJob.fetch(job_id(K, "reconcile"), connection=conn)
    Queue(K.queue(QUEUE_SWEEPS), connection=conn).remove(job)
    job.set_status(JobStatus.STARTED)
    assert q.enqueue(conn, K, "reconcile") is False


def test_dispatcher_enqueues_each_step(conn: redis.Redis) -> None:
    d = q.RQDispatcher(conn, K)
    d.send(Job.PROVISION_REQUEST, ["r1"])
    d.send(Job.CHECK_REQUEST, ["r1"])
    d.send(Job.CREATE_VM, ["vm-a"])
    d.send(Job.CHECK_PENDING_VM, ["vm-a"])
    d.send(Job.DESTROY_VM, ["vm-a"])
    d.send(Job.CREATE_VM, ["vm-a"])  # duplicate: silently absorbed
    assert sorted(Queue(K.queue(QUEUE_REQUESTS), connection=conn).job_ids) == [
        "vmpool-check_request-r1",
        "vmpool-provision_request-r1",
    ]
    assert Queue(K.queue(QUEUE_VMS), connection=conn).job_ids == [
        "vmpool-create_vm-vm-a",
        "vmpool-check_pending_vm-vm-a",
        "vmpool-destroy_vm-vm-a",
    ]


# -- enqueue_many (the sweeps' batched dispatch) ---------------------------------------
def _hash(conn: redis.Redis, jid: str) -> dict[bytes, bytes]:
    """A job hash minus the fields that are timestamps of the enqueue itself."""
    h = conn.hgetall(RQJob.key_for(jid))
    return {k: v for k, v in h.items() if k not in (b"created_at", b"enqueued_at")}


def test_enqueue_many_builds_the_same_job_as_enqueue(conn: redis.Redis) -> None:
    """Same id, same queue, same hash fields (args, ttls, timeout, description, status,
    origin, serialized call) as the one-at-a-time path: RQ's job, built RQ's way."""
    # a request id with '.' and '_' (escaped in the id); VM names hold neither
    assert q.enqueue(conn, K, "check_request", "r.a_1") is True
    one = _hash(conn, job_id(K, "check_request", "r.a_1"))
    conn.flushdb()
    assert q.enqueue_many(conn, K, "check_request", ["r.a_1"]) == 1
    many = _hash(conn, job_id(K, "check_request", "r.a_1"))
    assert many == one and many
    jid = "vmpool-check_request-r_oa__1"
    assert Queue(K.queue(QUEUE_REQUESTS), connection=conn).job_ids == [jid]
    job = RQJob.fetch(jid, connection=conn)
    assert job.args == ("r.a_1",)
    assert job.result_ttl == 0
    assert job.failure_ttl == q.FAILURE_TTL
    assert job.timeout == JOBS["check_request"].timeout
    assert conn.sismember("rq:queues", K.rq_queue(QUEUE_REQUESTS))


def test_enqueue_many_dedups_against_enqueue_and_itself(conn: redis.Redis) -> None:
    assert q.enqueue(conn, K, "destroy_vm", "vm-a") is True
    assert q.enqueue_many(conn, K, "destroy_vm", ["vm-a", "vm-b", "vm-c", "vm-b"]) == 2
    assert q.enqueue_many(conn, K, "destroy_vm", ["vm-c", "vm-b", "vm-a"]) == 0
    assert q.enqueue(conn, K, "destroy_vm", "vm-b") is False
    assert Queue(K.queue(QUEUE_VMS), connection=conn).job_ids == [
        "vmpool-destroy_vm-vm-a",
        "vmpool-destroy_vm-vm-b",
        "vmpool-destroy_vm-vm-c",
    ]
    # another job of the same subject is a different id
    assert q.enqueue_many(conn, K, "create_vm", ["vm-a"]) == 1


def test_enqueue_many_reclaims_dead_duplicates_only(conn: redis.Redis) -> None:
    names = ["vm-failed", "vm-stale", "vm-live", "vm-nobeat", "vm-queued"]
    assert q.enqueue_many(conn, K, "check_pending_vm", names) == 5
    queue = Queue(K.queue(QUEUE_VMS), connection=conn)
    now = _server_now(conn)
    for name, status, beat in [
        ("vm-failed", JobStatus.FAILED, None),
        ("vm-stale", JobStatus.STARTED, now - q.STALE_AFTER_SECONDS - 1),
        ("vm-live", JobStatus.STARTED, now),
        ("vm-nobeat", JobStatus.STARTED, None),
    ]:
        job = RQJob.fetch(job_id(K, "check_pending_vm", name), connection=conn)
        queue.remove(job)
        job.set_status(status)
        if beat is not None:
            conn.hset(job.key, q.HEARTBEAT_FIELD, f"{beat:.3f}")
    assert q.enqueue_many(conn, K, "check_pending_vm", names) == 2  # failed + stale
    assert queue.job_ids == [
        "vmpool-check_pending_vm-vm-queued",
        "vmpool-check_pending_vm-vm-failed",
        "vmpool-check_pending_vm-vm-stale",
    ]
    for name in ("vm-failed", "vm-stale"):
        job = RQJob.fetch(job_id(K, "check_pending_vm", name), connection=conn)
        assert job.get_status() == JobStatus.QUEUED
        assert conn.hget(job.key, q.HEARTBEAT_FIELD) is None  # a fresh hash


def test_enqueue_many_empty_and_invalid(conn: redis.Redis) -> None:
    assert q.enqueue_many(conn, K, "provision_request", []) == 0
    assert conn.dbsize() == 0  # nothing sent
    # a batch of nothing but bad subjects queues nothing and raises nothing
    assert q.enqueue_many(conn, K, "provision_request", ["not ok", "x\n"]) == 0
    assert Queue(K.queue(QUEUE_REQUESTS), connection=conn).job_ids == []
    with pytest.raises(ValueError):  # a bad job, unlike a bad subject, is the caller's bug
        q.enqueue_many(conn, K, "sweep_expired", ["x"])
    with pytest.raises(ValueError):
        q.enqueue_many(conn, K, "nonsense", ["x"])


HOSTILE_SUBJECTS = ["poison\n", "a b", "{tag}", "", "x" * 5000, "UPPER-vm\r\n", "\x00", "ü"]


@pytest.mark.parametrize(
    ("job", "good"),
    [
        ("provision_request", ["r-1", "R.2", "3f2a9c1e-0b6d-4d2e-9a7f-1c2b3d4e5f60"]),
        ("create_vm", ["vm-a", "vm-b"]),
        ("destroy_vm", ["vm-c"]),
    ],
)
def test_one_hostile_subject_never_fails_the_batch(
    conn: redis.Redis, caplog: pytest.LogCaptureFixture, job: str, good: list[str]
) -> None:
    """One request id RQ refuses ('poison\n') must not stop the provision sweep.

    A naive enqueue_many raises ValueError inside the sweep and queues nothing, for
    everyone. Each bad subject is skipped, logged once at warning (bounded: never the
    whole 5000 characters) and counted in Redis. The good ones are queued."""
    batch = [HOSTILE_SUBJECTS[0], good[0], *HOSTILE_SUBJECTS[1:], *good[1:], "poison\n"]
    with caplog.at_level("WARNING", logger="workers.queues"):
        assert q.enqueue_many(conn, K, job, batch) == len(good)
    queue = Queue(K.queue(lookup(job).queue), connection=conn)
    assert sorted(queue.job_ids) == sorted(job_id(K, job, s) for s in good)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == len(HOSTILE_SUBJECTS)  # once each, the repeat is not logged again
    assert all(len(w) < 300 and "\n" not in w for w in warnings), warnings
    skipped = conn.hgetall(K.metrics(SKIPPED_METRIC))
    assert skipped == {f"{job}:bad_subject".encode(): str(len(HOSTILE_SUBJECTS) + 1).encode()}


def test_a_subject_of_the_wrong_kind_is_skipped(conn: redis.Redis) -> None:
    """Subjects are checked by their kind's validator (vmpool.ids), not only by what an
    RQ job id can hold: an upper-case or dotted VM name is no VM name."""
    assert q.enqueue_many(conn, K, "create_vm", ["Vm-A", "vm.b", "vm-ok"]) == 1
    assert Queue(K.queue(QUEUE_VMS), connection=conn).job_ids == [job_id(K, "create_vm", "vm-ok")]
    with pytest.raises(ValueError):  # the single form still refuses loudly (CLI: exit 2)
        q.enqueue(conn, K, "create_vm", "Vm-A")


@pytest.mark.parametrize("chunk", [7, q.ENQUEUE_CHUNK])
def test_enqueue_many_more_than_a_chunk(conn: redis.Redis, chunk: int) -> None:
    n = 2 * chunk + 3
    names = [f"vm-{i:05d}" for i in range(n)]
    assert q.enqueue(conn, K, "create_vm", names[chunk]) is True  # a duplicate mid-batch
    assert q.enqueue_many(conn, K, "create_vm", names, chunk=chunk) == n - 1
    ids = Queue(K.queue(QUEUE_VMS), connection=conn).job_ids
    assert sorted(ids) == sorted(job_id(K, "create_vm", name) for name in names)
    assert len(ids) == n
    assert q.enqueue_many(conn, K, "create_vm", names, chunk=chunk) == 0


def test_dispatcher_batches(conn: redis.Redis) -> None:
    d = q.RQDispatcher(conn, K)
    d.send(Job.PROVISION_REQUEST, ["r1", "r2"])
    d.send(Job.CREATE_VM, ["vm-a"])
    d.send(Job.CHECK_PENDING_VM, ["vm-a", "vm-b"])
    d.send(Job.DESTROY_VM, [])
    d.send(Job.DESTROY_VM, ["vm-a"])
    d.send(Job.CREATE_VM, ["vm-a"])  # duplicate of a batched one: absorbed
    assert Queue(K.queue(QUEUE_REQUESTS), connection=conn).job_ids == [
        "vmpool-provision_request-r1",
        "vmpool-provision_request-r2",
    ]
    assert Queue(K.queue(QUEUE_VMS), connection=conn).job_ids == [
        "vmpool-create_vm-vm-a",
        "vmpool-check_pending_vm-vm-a",
        "vmpool-check_pending_vm-vm-b",
        "vmpool-destroy_vm-vm-a",
    ]


def test_a_single_name_is_not_a_sequence_of_subjects(conn: redis.Redis) -> None:
    """``send(job, "vm-a")`` would type-check (a str is a Sequence[str]) and queue one
    job per letter: it is refused, and nothing is queued."""
    for dispatch in (q.RQDispatcher(conn, K), BatchDispatcher(conn, K)):
        with pytest.raises(TypeError):
            dispatch.send(Job.CREATE_VM, "vm-a")
    assert conn.dbsize() == 0


def _server_now(conn: redis.Redis) -> float:
    sec, usec = conn.time()
    return float(sec) + float(usec) / 1e6


# -- the worker's Fleet -----------------------------------------------------------------
def test_current_fleet_outside_a_vmpool_worker() -> None:
    with pytest.raises(RuntimeError, match="vmpool worker"):
        current_fleet()


CONFIG = """
:providers:
  :simulated:
    boot_seconds: 0
:config:
  ondemand_request_ttl: 1
:pools:
  - name: deb
    template: deb
    size: 0
    provider: simulated
"""


@pytest.mark.parametrize("kind", ["simple", "fork"])
def test_worker_hands_its_fleet_to_jobs(
    kind: str, conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    assert q.enqueue(conn, K, "provision_sweep")
    assert q.enqueue(conn, K, "reap_running", run=7)  # a scheduled run: its hash waits with a TTL
    assert conn.ttl(RQJob.key_for(job_id(K, "reap_running", run=7))) > 0
    queue = Queue(K.queue(QUEUE_SWEEPS), connection=conn)
    queue.enqueue(noop, job_id="plain-noop", result_ttl=60)
    worker = build_worker(redis_url, config, [K.queue(QUEUE_SWEEPS)], kind=kind)
    assert worker.job_class is FleetJob
    assert worker.work(burst=True)
    assert RQJob.fetch("plain-noop", connection=conn).get_status() == JobStatus.FINISHED
    # the sweep ran with the Fleet (result_ttl=0: its hash is gone, not failed)
    assert not conn.exists(RQJob.key_for(job_id(K, "provision_sweep")))
    assert not conn.exists(RQJob.key_for(job_id(K, "reap_running", run=7)))
    assert worker.failed_job_count == 0
    # every finished vmpool job is counted in Redis for /metrics (the horse's too)
    counts = conn.hgetall(Keys(config.key_prefix).metrics("jobs"))
    assert counts.get(b"provision_sweep:ok") == b"1", counts
    assert counts.get(b"reap_running:ok") == b"1", counts


def test_a_queued_sweep_goes_before_a_flood_of_request_jobs(
    conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """The sweeps queue comes first. Red against the old order (requests, sweeps, VMs):
    in the 10,600-request soak a provision-sweep after a Redis restart flooded the
    requests queue, and the expiry sweep waited 7 s behind it (73 requests late)."""
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    flood = [f"00000000-0000-4000-8000-{i:012d}" for i in range(30)]
    assert q.enqueue_many(conn, K, "provision_request", flood) == 30
    assert q.enqueue(conn, K, "sweep_expired", run=1)
    worker = build_worker(redis_url, config, kind="simple")
    assert worker.work(burst=True, max_jobs=1)
    # the one job it ran was the sweep
    assert not conn.exists(RQJob.key_for(job_id(K, "sweep_expired", run=1)))
    assert len(Queue(K.queue(QUEUE_REQUESTS), connection=conn)) == 30


# -- round trips of a dispatch ------------------------------------------------------------
def test_a_dispatch_sends_no_script_exists_and_reloads_flushed_scripts(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: enqueue_many's two pipelines (the reclaim checks, the pushes) are two round
    trips, their scripts sent as bare EVALSHA (redis-py's pipeline sends a SCRIPT EXISTS
    round trip before each: four round trips, two SCRIPT calls); with the server's
    scripts flushed, the scripts are loaded and the jobs still queued, each once."""
    from redishelp import RoundTrips

    trips = RoundTrips()
    conn = trips.client(redis_url, decode=False)
    try:
        assert q.enqueue_many(conn, K, Job.DESTROY_VM, ["warm-up"]) == 1  # scripts loaded
        script_calls = redis_client.info("commandstats").get("cmdstat_script", {}).get("calls", 0)
        before = trips.count
        assert q.enqueue_many(conn, K, Job.DESTROY_VM, ["vm-a", "vm-b", "vm-c"]) == 3
        assert trips.count - before == 2
        stats = redis_client.info("commandstats")
        assert stats.get("cmdstat_script", {}).get("calls", 0) == script_calls
        redis_client.script_flush()
        assert q.enqueue_many(conn, K, Job.DESTROY_VM, ["vm-d", "vm-a"]) == 1  # vm-a: queued
        queued = Queue(K.queue(QUEUE_VMS), connection=conn).job_ids
        names = ["warm-up", "vm-a", "vm-b", "vm-c", "vm-d"]
        assert sorted(queued) == sorted(job_id(K, Job.DESTROY_VM, n) for n in names)
    finally:
        conn.close()

"""/metrics: the fleet read in O(pools) (no SCAN, a command count that does not grow with
the requests and VMs), the gauges, bounded labels, and `vmpool audit --metrics`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue, Worker

from vmpool.cli.main import cli
from vmpool.config import Config
from vmpool.providers.simulated import SimulatedProvider
from vmpool.state.counters import record_error
from vmpool.state.keys import Keys
from vmpool.state.records import Slot
from vmpool.state.semaphore import CloneSemaphore
from vmpool.state.store import Store
from workers.table import PERIODIC, template_id

from apihelp import API, drive_ready, make_client, spec_config
from storehelp import ACTOR, settings, wait_until


def commands_run(client: redis.Redis) -> Counter[str]:
    """The commands the server ran since its statistics were reset, by name (INFO
    commandstats), but the reset itself."""
    stats = client.info("commandstats")
    calls = {name.removeprefix("cmdstat_").upper(): int(v["calls"]) for name, v in stats.items()}
    return Counter({name: n for name, n in calls.items() if name != "CONFIG|RESETSTAT"})


Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(client: TestClient) -> Samples:
    """Sample name -> [(labels, value)] of one scrape."""
    response = client.get("/metrics")
    assert response.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    (found,) = [v for lbl, v in samples.get(name, []) if lbl == labels]
    return found


def app_client(config: Config, redis_url: str) -> TestClient:
    return make_client(config, redis_url)[0]


@pytest.fixture
def config() -> Config:
    return spec_config()


@pytest.fixture
def client(config: Config, redis_url: str, redis_client: redis.Redis) -> Iterator[TestClient]:
    with app_client(config, redis_url) as c:
        yield c


@pytest.fixture
def store(config: Config, redis_client: redis.Redis) -> Store:
    return Store(redis_client, Keys(config.key_prefix))


# -- O(pools), not O(keys) ----------------------------------------------------------------


def fill(store: Store, tag: str, n: int) -> None:
    """``n`` requests over the configured pools: ready, failed, deleted and pending."""
    for i in range(n):
        rid = f"{tag}{i}"
        pool = ("pool1", "pool2", "pool3")[i % 3]
        assert store.create_request(rid, [Slot(pool, pool, 2)], settings(), actor=ACTOR).ok
        if i % 4 == 0:
            drive_ready(store, rid)
        elif i % 4 == 1:
            store.delete_request(rid, actor=ACTOR)


def test_a_scrape_never_scans_and_costs_the_same_for_any_number_of_records(
    config: Config, redis_url: str, redis_client: redis.Redis, store: Store
) -> None:
    raw = redis.Redis.from_url(redis_url)
    worker_queues = [Queue(f"vmpool-{q}", connection=raw) for q in ("vms", "sweeps")]
    Worker(worker_queues, connection=raw, name="w1").register_birth()
    with app_client(config, redis_url) as c:
        c.get("/metrics")  # connect first: the handshake is not the scrape's cost

        def cost() -> Counter[str]:
            redis_client.config_resetstat()
            assert c.get("/metrics").status_code == 200
            return commands_run(redis_client)

        empty = cost()
        fill(store, "a", 12)
        few = cost()
        fill(store, "b", 120)
        many = cost()
    assert "SCAN" not in many and "KEYS" not in many
    assert empty == few == many, (empty, many)
    assert 0 < sum(many.values()) < 80  # the server counted the scrape's reads


# -- the fleet's gauges -------------------------------------------------------------------


def test_vms_requests_and_queue_depth(client: TestClient, store: Store, conn: redis.Redis) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1": 2}').json()["request_id"]
    client.post(f"{API}/ondemandvm", content='{"pool2": 1}')
    drive_ready(store, rid)
    conn.rpush(store.keys.rq_queue("vms"), "job-a", "job-b")  # two waiting job ids
    s = scrape(client)
    assert value(s, "vmpool_vms", pool="pool1", state="running") == 2
    assert value(s, "vmpool_vms", pool="pool2", state="running") == 0
    assert value(s, "vmpool_requests_open") == 1
    assert value(s, "vmpool_requests_finished_total", outcome="ready") == 1
    assert value(s, "vmpool_requests_finished_total", outcome="deleted") == 0
    assert value(s, "vmpool_queue_depth", queue="vmpool-vms") == 2
    assert value(s, "vmpool_queue_depth", queue="vmpool-sweeps") == 0
    assert "vmpool_requests" not in s  # the scanning gauge is gone
    assert value(s, "vmpool_redis_up") == 1


def test_ready_time_under_both_names(client: TestClient, store: Store) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1": 2}').json()["request_id"]
    drive_ready(store, rid)
    s = scrape(client)
    for name in ("vmpool_time_to_ready_seconds", "vmpooler_time_to_ready_state"):
        assert value(s, f"{name}_count", pool="pool1") == 2
        assert value(s, f"{name}_bucket", pool="pool1", le="1.0") == 2
        assert value(s, f"{name}_bucket", pool="pool1", le="+Inf") == 2
        assert value(s, f"{name}_count", pool="pool3") == 0


def test_schedule_lag_and_interval(
    client: TestClient, store: Store, config: Config, conn: redis.Redis
) -> None:
    keys = store.keys
    now = store.server_time()
    conn.zadd(keys.schedule_due, {template_id(keys, "sweep_expired"): now - 12})
    conn.zadd(keys.schedule_due, {template_id(keys, "reconcile"): now + 30})
    s = scrape(client)
    assert 12 <= value(s, "vmpool_schedule_lag_seconds", job="sweep_expired") < 30
    assert value(s, "vmpool_schedule_lag_seconds", job="reconcile") == 0
    lagging = {lbl["job"] for lbl, _ in s["vmpool_schedule_lag_seconds"]}
    assert lagging == {"sweep_expired", "reconcile"}  # no template, no sample
    for spec in PERIODIC:
        interval = value(s, "vmpool_schedule_interval_seconds", job=spec.name)
        assert interval == getattr(config.schedule, spec.name)


def test_clone_slots(client: TestClient, store: Store, config: Config) -> None:
    slots = CloneSemaphore(store.redis, store.keys, limit=5, lease_s=60)
    assert slots.acquire("vm-a") and slots.acquire("vm-b")
    short = CloneSemaphore(store.redis, store.keys, limit=5, lease_s=0.05)
    assert short.acquire("vm-c")
    expiry = float(store.redis.zscore(store.keys.clone_slots, "vm-c"))
    wait_until(lambda: store.server_time() > expiry)
    s = scrape(client)
    assert value(s, "vmpool_clone_slots_in_use") == 2  # the expired lease is not in use
    assert value(s, "vmpool_clone_slots_limit") == config.ondemand_clone_limit
    assert value(s, "vmpool_clone_slots_peak") == 3  # the three leases were live at once
    assert value(s, "vmpool_clone_slot_overruns_total") == 0


def test_workers_alive_are_the_fleets_with_a_fresh_heartbeat(
    client: TestClient, conn: redis.Redis
) -> None:
    for prefix, name in [("vmpool", "w-fresh"), ("vmpool", "w-stale"), ("other", "w-theirs")]:
        queues = [Queue(f"{prefix}-{q}", connection=conn) for q in ("sweeps", "requests", "vms")]
        Worker(queues, connection=conn, name=name).register_birth()
    assert value(scrape(client), "vmpool_workers_alive") == 2
    conn.hset("rq:worker:w-stale", "last_heartbeat", "2020-01-01T00:00:00.000000Z")
    s = scrape(client)
    assert value(s, "vmpool_workers_alive") == 1
    assert sum(v for _, v in s["vmpool_workers"]) == 2  # registered, stale or not


# -- bounded labels -------------------------------------------------------------------------


def test_an_odd_http_method_is_labelled_other(client: TestClient) -> None:
    client.request("FOO", f"{API}/status")
    client.request("PATCH", f"{API}/status")
    client.get(f"{API}/status")
    text = client.get("/metrics").text
    assert 'method="FOO"' not in text
    s = scrape(client)
    methods = {lbl["method"] for lbl, _ in s["vmpool_http_responses_total"]}
    assert methods == {"GET", "PATCH", "other"}


def test_pool_labels_are_the_configured_pools(
    client: TestClient, redis_client: redis.Redis, store: Store
) -> None:
    record_error(redis_client, store.keys, "markedasfailed", "pool1")
    record_error(redis_client, store.keys, "markedasfailed", "retired-pool")
    redis_client.hincrby(store.keys.time_to_ready("retired-pool"), "1.0", 1)
    s = scrape(client)
    pools = {
        lbl["pool"]
        for name, samples in s.items()
        for lbl, _ in samples
        if "pool" in lbl and not name.startswith("vmpooler_ondemandrequest")
    }
    assert pools == {"pool1", "pool2", "pool3"}


# -- vmpool audit --metrics ----------------------------------------------------------------


def test_audit_metrics_then_a_scrape_shows_the_result(
    client: TestClient, redis_url: str, redis_client: redis.Redis, store: Store
) -> None:
    assert "vmpool_audit_violations" not in scrape(client)  # no sample before a run
    runner = CliRunner()
    ok = runner.invoke(cli, ["audit", "--metrics", "--redis-url", redis_url])
    assert ok.exit_code == 0, ok.output
    s = scrape(client)
    assert value(s, "vmpool_audit_violations") == 0
    ran = value(s, "vmpool_audit_last_run_timestamp_seconds")
    assert abs(store.server_time() - ran) < 60
    provider = SimulatedProvider(redis_client, store.keys, "simulated", {"boot_seconds": 0})
    provider.leak_vm("debian-12-x86_64", "t", "leaky-vm")
    bad = runner.invoke(cli, ["audit", "--metrics", "--redis-url", redis_url])
    assert bad.exit_code == 1 and "invariant 3" in bad.output
    s = scrape(client)
    assert value(s, "vmpool_audit_violations") == 1
    assert value(s, "vmpool_audit_last_run_timestamp_seconds") >= ran


def test_audit_without_metrics_records_nothing(
    client: TestClient, redis_url: str, store: Store
) -> None:
    assert CliRunner().invoke(cli, ["audit", "--redis-url", redis_url]).exit_code == 0
    assert not store.redis.exists(store.keys.audit_result)
    assert "vmpool_audit_violations" not in scrape(client)


# -- the reference ------------------------------------------------------------------------


def test_docs_list_every_exported_metric(client: TestClient) -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation time of each in-process counter
        name = f"{family.name}_total" if family.type == "counter" else family.name
        assert f"| `{name}` |" in docs, f"docs/metrics.md has no row for {name}"


def test_skipped_items_of_a_batch_are_exported(
    client: TestClient, conn: redis.Redis, store: Store
) -> None:
    """A batch that skips a hostile subject counts it; the scrape shows the count by job
    and reason (an operator's sign that a bad id sits in an index or queue)."""
    from workers.queues import enqueue_many

    raw = redis.Redis(connection_pool=conn.connection_pool)
    assert enqueue_many(raw, store.keys, "provision_request", ["ok-1", "poison\n"]) == 1
    s = scrape(client)
    labels = {"job": "provision_request", "reason": "bad_subject"}
    assert value(s, "vmpool_skipped_items_total", **labels) == 1

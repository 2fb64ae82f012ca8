"""The HTTP API against a real Redis: vmpooler 3.9's ondemandvm_spec.rb behaviours
(exact bodies, byte for byte, key order included: pretty as vmpooler's, compact for the
hot replies), the path form, GET/DELETE in every state, status, health and metrics."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool.lifecycle.failpoints import ENV as FAILPOINTS
from vmpool.state.keys import Keys
from vmpool.state.quotas import Standing
from vmpool.state.store import Store
from vmpool.state.tokens import TokenStore

from apihelp import (
    API,
    compact,
    drive_ready,
    make_app,
    make_client,
    pretty,
    provision_work,
    queued_provision_lanes,
    snapshot,
    spec_config,
    store_for,
)
from storehelp import wait_until

UUID_RE = r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"


@pytest.fixture
def client(redis_url: str, redis_client: redis.Redis) -> TestClient:
    c, _ = make_client(spec_config(), redis_url)
    return c


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return store_for(redis_client, spec_config())


def post(client: TestClient, body: str | bytes, **kw: object) -> tuple[int, str]:
    r = client.post(f"{API}/ondemandvm", content=body, **kw)  # type: ignore[arg-type]
    assert r.headers["content-type"].startswith("application/json")
    return r.status_code, r.text


# -- POST /ondemandvm (ondemandvm_spec.rb) -------------------------------------------------


def test_generates_a_request_id(
    client: TestClient, store: Store, redis_client: redis.Redis, redis_url: str
) -> None:
    status, text = post(client, '{"pool1":"1"}')
    assert status == 201
    rid = json.loads(text)["request_id"]
    assert re.match(UUID_RE, rid)
    assert text == compact({"ok": True, "request_id": rid})
    record = store.get_request(rid)
    assert record is not None and record.status == "pending"
    assert record.requested == "pool1:pool1:1"
    # handed to the fleet: in the provision work set, a provision batch job queued
    assert provision_work(redis_client, spec_config()) == [rid]
    assert queued_provision_lanes(redis_url, spec_config())
    # The request and its queue entry exist together (one atomic unit).
    assert rid in store.provision_candidates()
    assert rid in store.open_requests()


def test_alias_selects_its_pool(client: TestClient, store: Store) -> None:
    status, text = post(client, '{"poolone":"1"}')
    assert status == 201
    rid = json.loads(text)["request_id"]
    record = store.get_request(rid)
    assert record is not None and record.requested == "poolone:pool1:1"


def test_weighted_selection_never_picks_a_zero_weight(client: TestClient, store: Store) -> None:
    # pool2 is a pool (compute2, weight 0) and an alias of pool1 (compute1, weight 5).
    for _ in range(5):
        status, text = post(client, '{"pool2":"3"}')
        assert status == 201
        rid = json.loads(text)["request_id"]
        record = store.get_request(rid)
        assert record is not None and record.requested == "pool2:pool1:3"


def test_zero_weight_backend_with_a_single_candidate(
    redis_url: str, redis_client: redis.Redis
) -> None:
    cfg = spec_config(weights={"compute1": 0, "compute2": 0})
    c, _ = make_client(cfg, redis_url)
    r = c.post(f"{API}/ondemandvm", content='{"pool1":"1"}')
    assert r.status_code == 201
    record = store_for(redis_client, cfg).get_request(r.json()["request_id"])
    assert record is not None and record.requested == "pool1:pool1:1"


def test_uniform_selection_without_complete_weights(
    redis_url: str, redis_client: redis.Redis
) -> None:
    cfg = spec_config(weights={"compute1": 5})  # pool2's target has no weight: uniform
    c, _ = make_client(cfg, redis_url, seed=7)
    r = c.post(f"{API}/ondemandvm", content='{"pool2":"40"}')
    assert r.status_code == 201
    record = store_for(redis_client, cfg).get_request(r.json()["request_id"])
    assert record is not None
    picked = {s.pool: s.want for s in record.slots}
    assert set(picked) == {"pool1", "pool2"} and sum(picked.values()) == 40
    assert record.requested.startswith("pool2:")


def test_over_the_maximum_is_403(client: TestClient, redis_url: str) -> None:
    before = snapshot(redis_url)
    status, text = post(client, '{"pool1":"51"}')
    assert status == 403
    assert text == pretty(
        {"ok": False, "message": "requested amount of instances exceeds the maximum 50"}
    )
    assert snapshot(redis_url) == before


def test_given_request_id_is_used(client: TestClient) -> None:
    status, text = post(client, '{"pool1":"1","request_id":"1234"}')
    assert status == 201
    assert text == compact({"ok": True, "request_id": "1234"})


def test_duplicate_request_id_is_409(client: TestClient, redis_url: str) -> None:
    post(client, '{"pool1":"1","request_id":"1234"}')
    before = snapshot(redis_url)
    status, text = post(client, '{"pool1":"1","request_id":"1234"}')
    assert status == 409
    assert text == pretty(
        {"ok": False, "request_id": "1234", "message": "request_id '1234' has already been created"}
    )
    assert snapshot(redis_url) == before


def test_unknown_pool_is_404_bad_templates(client: TestClient, redis_url: str) -> None:
    before = snapshot(redis_url)
    status, text = post(client, '{"pool4":"1"}')
    assert status == 404
    assert text == pretty({"ok": False, "bad_templates": ["pool4"]})
    assert snapshot(redis_url) == before


def test_invalid_json_is_400(client: TestClient, redis_url: str) -> None:
    before = snapshot(redis_url)
    status, text = post(client, '{"pool1":"1}')
    assert status == 400
    assert text == pretty({"ok": False, "message": "JSON payload could not be parsed"})
    assert snapshot(redis_url) == before


def test_null_body_is_404(client: TestClient) -> None:
    status, text = post(client, "null")
    assert (status, text) == (404, pretty({"ok": False}))


def test_counts_as_numbers_and_several_names(client: TestClient, store: Store) -> None:
    status, text = post(client, '{"pool1": 2, "pool3": "1"}')
    assert status == 201
    record = store.get_request(json.loads(text)["request_id"])
    assert record is not None and record.requested == "pool1:pool1:2,pool3:pool3:1"


@pytest.mark.parametrize(
    "body",
    [
        '{"pool1": -1}',
        '{"pool1": "-1"}',
        '{"pool1": 0}',
        '{"pool1": 1.5}',
        '{"pool1": "1.5"}',
        '{"pool1": "two"}',
        '{"pool1": true}',
        '{"pool1": null}',
        '{"pool1": [1]}',
        '{"pool1": {"n": 1}}',
        "{}",
        '{"request_id": "only-an-id"}',
        '{"pool1": 1, "request_id": "../../etc"}',
        '{"pool1": 1, "request_id": 1234}',
        '{"pool1": 1, "request_id": "{tag}"}',
        "[1, 2]",
        '"pool1"',
        "42",
        '{"pool1": NaN}',
        '{"pool1": Infinity}',
        "",
    ],
)
def test_hostile_bodies_are_400_and_write_nothing(
    client: TestClient, redis_url: str, body: str
) -> None:
    before = snapshot(redis_url)
    r = client.post(f"{API}/ondemandvm", content=body)
    assert r.status_code == 400, r.text
    data = r.json()
    assert list(data) == ["ok", "message"] and data["ok"] is False
    assert snapshot(redis_url) == before  # no request, no work, no job


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"\xff\xfe{}", 400),  # not UTF-8
        (b'{"pool1": "' + b"9" * 5000 + b'"}', 403),  # enormous count
        (b'{"pool1": 1e300}', 403),
        (b'{"pool1": ' + b"9" * 5000 + b"}", 400),  # beyond Python's int parsing limit
        (b'{"../etc/passwd": 1}', 404),
        (b'{"pool1/x": 1}', 404),
        (b'{"pool1": 1, "extra_field": 1}', 404),  # vmpooler: every key is a template
        (b"[" * 100_000, 413),
        (b" " * (64 * 1024 + 1), 413),
        (b"[" * 20_000 + b"]" * 20_000, 400),  # deep nesting
    ],
)
def test_more_hostile_bodies(client: TestClient, redis_url: str, body: bytes, status: int) -> None:
    before = snapshot(redis_url)
    r = client.post(f"{API}/ondemandvm", content=body)
    assert r.status_code == status, r.text
    assert r.json()["ok"] is False
    assert snapshot(redis_url) == before


def test_unknown_names_listed_in_order(client: TestClient) -> None:
    r = client.post(f"{API}/ondemandvm", content='{"a": 1, "pool1": 1, "b/c": 1}')
    assert r.status_code == 404
    assert r.text == pretty({"ok": False, "bad_templates": ["a", "b/c"]})


def test_enqueue_failure_still_creates(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: when queueing the provision job fails after the create (the failpoint
    raises where RQ is called), the answer is still 201, the request is where the sweep
    and the batch jobs find it, and the failure is counted."""
    cfg = spec_config()
    c, _ = make_client(cfg, redis_url)
    monkeypatch.setenv(FAILPOINTS, "api.queue_lanes=raise")
    r = c.post(f"{API}/ondemandvm", content='{"pool1": 1}')
    assert r.status_code == 201
    rid = r.json()["request_id"]
    store = store_for(redis_client, cfg)
    assert rid in store.provision_candidates()  # the sweep will find it
    assert provision_work(redis_client, cfg) == [rid]
    assert queued_provision_lanes(redis_url, cfg) == []
    assert "vmpool_api_enqueue_failures_total 1.0" in c.get("/metrics").text


def test_real_enqueue_puts_a_provision_job_on_rq(redis_url: str, redis_client: redis.Redis) -> None:
    from rq import Queue

    from workers.table import JOBS, job_id

    cfg = spec_config()
    keys = Keys(cfg.key_prefix)
    c, _ = make_client(cfg, redis_url)
    r = c.post(f"{API}/ondemandvm/pool1+pool3")
    assert r.status_code == 201
    rid = r.json()["request_id"]
    raw = redis.Redis.from_url(redis_url)
    queue_name = keys.queue(JOBS["provision_batch"].queue)
    # the request waits in provision_request's work set for a batch job
    assert raw.zscore(keys.work_set("provision_request"), rid) is not None
    assert job_id(keys, "provision_batch", run=0) in Queue(queue_name, connection=raw).job_ids
    status = c.get(f"{API}/status").json()
    assert status["queues"][queue_name] == 1


# -- POST /ondemandvm/<a+a+b> (vmfloaty's form) -------------------------------------------


def test_path_form_counts_repeats(client: TestClient, store: Store) -> None:
    r = client.post(
        f"{API}/ondemandvm/pool1+pool1+pool3",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 201
    assert list(r.json()) == ["ok", "request_id"]
    record = store.get_request(r.json()["request_id"])
    assert record is not None and record.requested == "pool1:pool1:2,pool3:pool3:1"


def test_path_form_unknown_and_over_maximum(client: TestClient, redis_url: str) -> None:
    before = snapshot(redis_url)
    r = client.post(f"{API}/ondemandvm/pool1+nope")
    assert (r.status_code, r.text) == (404, pretty({"ok": False, "bad_templates": ["nope"]}))
    r = client.post(f"{API}/ondemandvm/" + "+".join(["pool1"] * 51))
    assert r.status_code == 403
    r = client.post(f"{API}/ondemandvm/pool1%2F..%2Fx")
    assert r.status_code == 404
    assert snapshot(redis_url) == before


def test_trailing_slash_is_the_same_route(client: TestClient) -> None:
    r = client.post(f"{API}/ondemandvm/pool1/")
    assert r.status_code == 201
    rid = r.json()["request_id"]
    assert client.get(f"{API}/ondemandvm/{rid}/").status_code == 202


# -- GET /ondemandvm/<id> -------------------------------------------------------------------


def test_get_unknown_is_404(client: TestClient) -> None:
    rid = str(uuid.uuid4())
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 404
    assert r.text == pretty({"ok": False, "message": f"no request found for request_id '{rid}'"})


def test_get_pending_then_ready(client: TestClient, store: Store) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1":"1"}').json()["request_id"]
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 202
    assert r.text == compact(  # vmpooler's fields, then vmpool's: where it stands
        {"ok": True, "request_id": rid, "ready": False, "pool1": {"ready": "0", "pending": "1"},
         "position": 1, "eta_s": 0.0}
    )  # fmt: skip
    [vm] = drive_ready(store, rid)
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200
    assert r.text == compact(
        {"ok": True, "request_id": rid, "ready": True, "pool1": {"hostname": [f"{vm}.example.com"]}}
    )


def test_get_partial_progress_per_alias(client: TestClient, store: Store) -> None:
    r = client.post(f"{API}/ondemandvm", content='{"poolone": 2, "pool3": 1}')
    rid = r.json()["request_id"]
    out = store.reserve_vm(
        rid,
        name="vm-partial-0",
        alias="poolone",
        pool="pool1",
        template="t",
        provider="simulated",
        domain="example.com",
        actor="test",
    )
    assert out.ok
    store.vm_created("vm-partial-0", actor="test")
    store.vm_ready("vm-partial-0", actor="test")
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 202
    assert r.text == compact(
        {
            "ok": True,
            "request_id": rid,
            "ready": False,
            "poolone": {"ready": "1", "pending": "1"},
            "pool3": {"ready": "0", "pending": "1"},
            "position": 0,  # being provisioned
            "eta_s": 0.0,
        }
    )


def test_get_ready_merges_pools_under_one_alias(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = spec_config(weights={})  # uniform: pool2 spreads over pool2 and pool1
    c, _ = make_client(cfg, redis_url, seed=3)
    rid = c.post(f"{API}/ondemandvm", content='{"pool2": 6}').json()["request_id"]
    store = store_for(redis_client, cfg)
    record = store.get_request(rid)
    assert record is not None and len(record.slots) == 2
    names = drive_ready(store, rid)
    body = c.get(f"{API}/ondemandvm/{rid}").json()
    assert list(body) == ["ok", "request_id", "ready", "pool2"]
    assert sorted(body["pool2"]["hostname"]) == sorted(f"{n}.example.com" for n in names)


def test_get_deleted(client: TestClient) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1":"1"}').json()["request_id"]
    assert client.delete(f"{API}/ondemandvm/{rid}").status_code == 200
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200
    assert r.text == compact(
        {"ok": True, "request_id": rid, "ready": False, "message": "The request has been deleted"}
    )


def test_get_failed(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = spec_config(ttl_minutes=0.005)  # 0.3 s
    c, _ = make_client(cfg, redis_url)
    rid = c.post(f"{API}/ondemandvm", content='{"pool1":"1"}').json()["request_id"]
    store = store_for(redis_client, cfg)
    wait_until(lambda: store.expire_request(rid, actor="test").code == "failed", timeout=5)
    r = c.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200
    assert r.text == compact(
        {
            "ok": True,
            "request_id": rid,
            "ready": False,
            "message": "The request failed to provision instances within the configured"
            " ondemand_request_ttl '0.005'",
        }
    )
    # DELETE of a failed request: 200 {"ok": true}, and it stays failed.
    r = c.delete(f"{API}/ondemandvm/{rid}")
    assert (r.status_code, r.text) == (200, pretty({"ok": True}))
    record = store.get_request(rid)
    assert record is not None and record.status == "failed"
    assert "failed to provision" in c.get(f"{API}/ondemandvm/{rid}").json()["message"]


def test_get_bad_ids_are_404_and_read_nothing_odd(client: TestClient) -> None:
    for rid in ["{x}", "a b", "..", "x" * 200, "%00"]:
        r = client.get(f"{API}/ondemandvm/{rid}")
        assert r.status_code == 404
        assert r.json()["ok"] is False


# -- DELETE /ondemandvm/<id> ----------------------------------------------------------------


def test_delete_unknown_is_404(client: TestClient, redis_url: str) -> None:
    rid = str(uuid.uuid4())
    before = snapshot(redis_url)
    r = client.delete(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 404
    assert r.text == pretty({"ok": False, "message": f"no request found for request_id '{rid}'"})
    assert snapshot(redis_url) == before


def test_delete_ready_releases_vms(client: TestClient, store: Store) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1":"2"}').json()["request_id"]
    names = drive_ready(store, rid)
    r = client.delete(f"{API}/ondemandvm/{rid}")
    assert (r.status_code, r.text) == (200, pretty({"ok": True}))
    record = store.get_request(rid)
    assert record is not None and record.status == "deleted"
    for vm in store.get_vms(names):
        assert vm.state == "completed"  # on their way to destruction
    assert sorted(store.pool_vms("pool1", "completed")) == sorted(names)
    r = client.delete(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200
    assert r.text == pretty({"ok": True, "message": "the request has already been deleted"})
    assert [e.dst for e in store.history(rid) if e.entity == "request"] == [
        "pending",
        "ready",
        "deleted",
    ]


# -- other routes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/dashboard/nope"),  # `/` is vmpooler's redirect to the dashboard
        ("GET", f"{API}/nope"),
        ("PUT", f"{API}/ondemandvm"),
        ("PATCH", f"{API}/ondemandvm/x"),
        ("GET", f"{API}/ondemandvm"),
        ("GET", "/api/v2/status"),
        ("DELETE", f"{API}/ondemandvm/a/b"),
    ],
)
def test_unknown_routes_are_404_ok_false(client: TestClient, method: str, path: str) -> None:
    r = client.request(method, path)
    assert r.status_code == 404
    assert r.text == pretty({"ok": False})


def test_status(client: TestClient, store: Store) -> None:
    rid = client.post(f"{API}/ondemandvm", content='{"pool1":"2"}').json()["request_id"]
    drive_ready(store, rid)
    r = client.get(f"{API}/status")
    assert r.status_code == 200
    body = r.json()
    assert list(body) == sorted(body)  # vmpooler sorts the top level
    assert body["status"]["ok"] is True
    assert body["pools"]["pool1"]["running"] == 2
    assert body["pools"]["pool1"]["alias"] == ["poolone", "pool2"]
    assert body["requests"] == {"open": 0, "provisioning": 0}
    assert isinstance(body["workers"], list)
    assert isinstance(body["queues"], dict)


def test_health_and_readiness(client: TestClient, redis_url: str) -> None:
    assert client.get("/healthz").json() == {"ok": True}
    assert client.get("/readyz").status_code == 200


def test_readyz_without_redis_is_503() -> None:
    c, _ = make_client(spec_config(), "redis://127.0.0.1:1/0")
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["ok"] is False
    assert c.get("/healthz").status_code == 200
    r = c.post(f"{API}/ondemandvm", content='{"pool1": 1}')
    assert r.status_code == 503
    body = r.json()
    assert body == {
        "ok": False,
        "message": "the state store is unavailable; retry later",
        "redis": "unreachable",
        "request_id": body["request_id"],  # the id it tried, to look up later
    }
    assert "Traceback" not in r.text
    assert c.get(f"{API}/ondemandvm/abc").status_code == 503
    assert "vmpool_redis_up 0.0" in c.get("/metrics").text


def test_metrics(client: TestClient, store: Store, redis_client: redis.Redis) -> None:
    from vmpool.state.counters import record_error, record_job

    rid = client.post(f"{API}/ondemandvm", content='{"pool1":"1"}').json()["request_id"]
    client.post(f"{API}/ondemandvm", content='{"pool1":"1","request_id":"' + rid + '"}')
    client.post(f"{API}/ondemandvm", content='{"pool1":"99"}')
    client.post(f"{API}/ondemandvm", content='{"nope":"1"}')
    drive_ready(store, rid)
    client.get(f"{API}/ondemandvm/{rid}")
    keys = Keys("vmpool")
    record_job(redis_client, keys, "provision", "ok")
    record_job(redis_client, keys, "provision", "ok")
    record_error(redis_client, keys, "markedasfailed", "pool1")
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in [
        'vmpooler_ondemandrequest_generate_total{type="success"} 1.0',
        'vmpooler_ondemandrequest_generate_total{type="duplicaterequests"} 1.0',
        'vmpooler_ondemandrequest_fail_total{pool="pool1",type="toomanyrequests"} 1.0',
        'vmpooler_ondemandrequest_fail_total{pool="unknown",type="invalid"} 1.0',
        'vmpooler_http_requests_vm_total{method="post",operation="requestid",subject="ondemand"}'
        " 4.0",
        'vmpooler_http_requests_vm_total{method="get",operation="request",subject="ondemand"} 1.0',
        'vmpool_vms{pool="pool1",state="running"} 1.0',
        'vmpool_requests_finished_total{outcome="ready"} 1.0',
        'vmpool_requests_finished_total{outcome="failed"} 0.0',
        'vmpool_time_to_ready_seconds_count{pool="pool1"} 1.0',
        'vmpooler_time_to_ready_state_count{pool="pool1"} 1.0',
        'vmpool_worker_jobs_total{job="provision",outcome="ok"} 2.0',
        'vmpooler_errors_total{pool="pool1",type="markedasfailed"} 1.0',
        'vmpool_queue_depth{queue="vmpool-requests"} 1.0',  # its provision batch job
        "vmpool_redis_up 1.0",
    ]:
        assert line in text, line


@pytest.mark.parametrize("path", ["thread pool", "asyncio"])
def test_no_traceback_on_unexpected_errors(
    redis_url: str, redis_client: redis.Redis, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: an unexpected error is vmpooler's 500 without its text, both where a
    route's Redis work runs in the thread pool (DELETE) and where it is awaited on the
    loop (GET)."""
    cfg = spec_config()
    c, app = make_client(cfg, redis_url)

    def boom(*a: object, **k: object) -> object:
        raise RuntimeError("secret internals")

    st = app.state.vmpool
    if path == "thread pool":
        st.store.delete_request = boom
        r = c.delete(f"{API}/ondemandvm/abc")
    else:
        monkeypatch.setattr(Standing, "from_reply", boom)
        r = c.get(f"{API}/ondemandvm/abc")
    assert r.status_code == 500
    assert r.json() == {"ok": False, "message": "internal error"}
    assert "secret" not in r.text


def test_apps_do_not_share_state(redis_url: str, redis_client: redis.Redis) -> None:
    a, _ = make_client(spec_config(), redis_url)
    b, _ = make_client(spec_config(), redis_url)
    a.post(f"{API}/ondemandvm", content='{"pool1":"1"}')
    line = 'vmpooler_ondemandrequest_generate_total{type="success"}'
    assert f"{line} 1.0" in a.get("/metrics").text
    assert f"{line} 0.0" in b.get("/metrics").text


def test_selection_distribution_follows_weights(redis_url: str, redis_client: redis.Redis) -> None:
    from random import Random

    from vmpool.lifecycle.plan import choose_pools

    cfg = spec_config(weights={"compute1": 3, "compute2": 1})
    picks: Counter[str] = Counter()
    rng = Random(5)
    for _ in range(200):
        picks.update(choose_pools(cfg, "pool2", 1, rng))
    assert 110 < picks["pool1"] < 190 and picks["pool2"] > 10
    assert choose_pools(cfg, "nope", 3, rng) == {}


def test_a_name_of_one_pool_draws_nothing_from_the_rng() -> None:
    """Proves: a name only one pool can serve picks it without a draw (the API's rng is
    the system's, a read of the OS per draw), however many instances are asked for."""
    from random import Random

    from vmpool.lifecycle.plan import choose_pools

    class NoDraws(Random):
        def random(self) -> float:
            raise AssertionError("drew from the rng")

        def getrandbits(self, k: int) -> int:
            raise AssertionError("drew from the rng")

    cfg = spec_config()
    assert cfg.resolve_name("pool1") == ["pool1"]
    assert choose_pools(cfg, "pool1", 3, NoDraws()) == {"pool1": 3}


def test_tokens_store_hashed_only(redis_url: str, redis_client: redis.Redis) -> None:
    tokens = TokenStore(redis_client, Keys("vmpool"))
    token = tokens.create("jdoe")
    dump = repr(
        {k: redis_client.hgetall(k) for k in redis_client.scan_iter(match="vmpool:token:*")}
    )
    assert token not in dump and "jdoe" in dump


# -- shutdown ----------------------------------------------------------------------------


def test_shutdown_closes_the_redis_connections_the_app_opened(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """An app built from a URL closes its clients when its lifespan ends.

    The sync clients (status, metrics) and the asyncio one (the POST) each open a
    connection. Without the close they stay open on the server after shutdown: one
    leak per uvicorn worker restart.
    """
    before = {c["id"] for c in redis_client.client_list()}

    def opened_by_app() -> set[str]:
        return {c["id"] for c in redis_client.client_list()} - before

    with TestClient(make_app(spec_config(), redis_url)) as c:
        assert c.post(f"{API}/ondemandvm", content='{"pool1":"1"}').status_code == 201
        assert c.get(f"{API}/status").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert opened_by_app()
    wait_until(lambda: not opened_by_app())

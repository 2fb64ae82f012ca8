"""The API's parts on their own: request parsing (payload -> counts), the status
summary, the dependencies' order, and an app that reports only its own fleet."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from rq import Queue, Worker

from vmpool.api.confirming import ConfirmedCalls
from vmpool.api.errors import MAX_BODY_BYTES, Rejected
from vmpool.api.hot_routes import Entry
from vmpool.api.parsing import (
    MAX_NAMES,
    Ondemand,
    ondemand_from_json,
    ondemand_from_path,
    parse_count,
    parse_json_body,
)
from vmpool.api.routers.status import pools_status
from vmpool.ids import new_request_id, validate_request_id
from vmpool.lifecycle.plan import RequestRejected
from vmpool.state.keys import Keys
from workers.queues import queue_names

from apihelp import API, make_client, spec_config

# -- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "count"),
    [(1, 1), ("2", 2), (" 3 ", 3), (4.0, 4), ("9" * 19, 51), (1e30, 51)],
)
def test_parse_count_accepts(value: Any, count: int) -> None:
    assert parse_count("p", value, 50) == count


@pytest.mark.parametrize("value", [0, -1, "0", "1.5", 1.5, True, None, [], "x", float("nan")])
def test_parse_count_refuses(value: Any) -> None:
    with pytest.raises(Rejected) as caught:
        parse_count("p", value, 50)
    assert caught.value.status == 400
    assert caught.value.fields == {"message": "invalid count for 'p': must be a positive integer"}


@pytest.mark.parametrize("body", [b"", b"{", b"NaN", b'{"a": Infinity}', b"\xff"])
def test_parse_json_body_refuses(body: bytes) -> None:
    with pytest.raises(Rejected) as caught:
        parse_json_body(body)
    assert (caught.value.status, caught.value.fields) == (
        400,
        {"message": "JSON payload could not be parsed"},
    )


def test_new_request_ids_are_canonical_uuid4s() -> None:
    """Proves: the ids the API makes are uuid4s in ``str(uuid.uuid4())``'s text (version
    4, RFC 4122 variant, lowercase), all distinct, each a valid request id."""
    made = [new_request_id() for _ in range(2000)]
    assert len(set(made)) == len(made)
    for rid in made:
        parsed = uuid.UUID(rid)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == rid == validate_request_id(rid)
    # every value of the variant's two random bits occurs
    assert {rid[19] for rid in made} == set("89ab")


def test_ondemand_from_json() -> None:
    cfg = spec_config()
    wanted = ondemand_from_json({"pool1": "2", "poolone": 1, "request_id": "abc-1"}, cfg)
    assert wanted == Ondemand({"pool1": 2, "poolone": 1}, "abc-1")
    assert ondemand_from_json({"pool3": 1}, cfg).request_id is None


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (None, 404),
        ([], 400),
        ("pool1", 400),
        ({}, 400),
        ({"request_id": "x"}, 400),
        ({"pool1": 1, "request_id": "../x"}, 400),
        ({"pool1": 0}, 400),
        ({f"p{i}": 1 for i in range(MAX_NAMES + 1)}, 400),
    ],
)
def test_ondemand_from_json_refuses(data: Any, status: int) -> None:
    with pytest.raises(Rejected) as caught:
        ondemand_from_json(data, spec_config())
    assert caught.value.status == status


def test_unknown_names_come_before_bad_counts() -> None:
    """vmpooler answers an unknown name (404) before it looks at the counts."""
    with pytest.raises(RequestRejected) as caught:
        ondemand_from_json({"pool1": "x", "nope": "y", "b/c": 1}, spec_config())
    assert caught.value.bad_templates == ("nope", "b/c")


def test_ondemand_from_path() -> None:
    assert ondemand_from_path("pool1+pool3+pool1") == Ondemand({"pool1": 2, "pool3": 1})
    # Names are the plan's to check: the path form passes them on as they are.
    assert ondemand_from_path("nope") == Ondemand({"nope": 1})
    with pytest.raises(Rejected):
        ondemand_from_path("+".join(f"p{i}" for i in range(MAX_NAMES + 1)))


# -- status ----------------------------------------------------------------------------


def test_pools_status() -> None:
    cfg = spec_config()
    zero = {"reserved": 0, "pending": 0, "ready": 0, "running": 0, "completed": 0, "on_hold": 0}
    counts = {"pool1": {**zero, "reserved": 1, "pending": 2, "ready": 5, "running": 3,
                        "completed": 4, "on_hold": 1}}  # fmt: skip
    counts |= {"pool2": zero, "pool3": zero}
    pools, totals = pools_status(cfg, counts)
    assert list(pools) == ["pool1", "pool2", "pool3"]
    assert pools["pool1"] == {
        "ready": 5,
        "running": 3,
        "pending": 3,
        "max": 0,
        "lastBoot": None,
        "reserved": 1,
        "booting": 2,
        "completed": 4,
        "on_hold": 1,
        "alias": ["poolone", "pool2"],
    }
    assert "alias" not in pools["pool3"]
    assert totals == {"pending": 3, "cloning": 1, "ready": 5, "running": 3, "completed": 4}


# -- dependencies ------------------------------------------------------------------------


def test_refused_calls_are_counted(redis_url: str, redis_client: redis.Redis) -> None:
    """vmpooler counts a POST before it checks the token, a DELETE after."""
    c, _ = make_client(spec_config(auth=True), redis_url)
    assert c.post(f"{API}/ondemandvm", content='{"pool1": 1}').status_code == 401
    assert c.post(f"{API}/ondemandvm/pool1").status_code == 401
    assert c.delete(f"{API}/ondemandvm/abc").status_code == 401
    text = c.get("/metrics").text
    for labels in [
        'method="post",operation="requestid",subject="ondemand"} 1.0',
        'method="delete",operation="template",subject="ondemand"} 1.0',
    ]:
        assert "vmpooler_http_requests_vm_total{" + labels in text
    assert 'operation="request",subject="ondemand"' not in text


# -- the hot routes --------------------------------------------------------------------


def _responses(app: FastAPI, route: str, method: str, status: int) -> float:
    counter = app.state.vmpool.metrics.responses.labels(route, method, str(status))
    return float(counter._value.get())


def test_hot_routes_answer_as_the_framework_would(redis_url: str) -> None:
    """Proves: each route the entry layer serves itself (vmpool.api.hot_routes) is the one
    FastAPI's own stack picks for that path, answers alike (status, body, content type)
    and is counted under the same route template; a trailing slash is served too. Fails
    if a hot route's template or endpoint drifts from its router's."""
    client, app = make_client(spec_config(), redis_url)
    outer = app.build_middleware_stack()  # each call one unit of work, around the entry
    assert isinstance(outer, ConfirmedCalls)
    entry = outer.app
    assert isinstance(entry, Entry)

    async def framework(scope: Any, receive: Any, send: Any) -> None:
        """FastAPI's stack without the entry layer (as Starlette's own call enters it)."""
        await entry.app({**scope, "app": app}, receive, send)

    stack = TestClient(framework, raise_server_exceptions=False)
    rid = str(uuid.uuid4())
    calls = [
        ("POST", f"{API}/ondemandvm", f"{API}/ondemandvm", '{"pool1": 1}', 201),
        ("POST", f"{API}/ondemandvm/pool1/", f"{API}/ondemandvm/{{template}}", "", 201),
        ("GET", f"{API}/ondemandvm/{rid}", f"{API}/ondemandvm/{{request_id}}", "", 202),
        ("GET", "/healthz", "/healthz", "", 200),
    ]
    for method, path, template, body, status in calls:
        assert entry.routes.match(method, path.rstrip("/")) is not None, path
        if method == "GET" and "ondemandvm" in path:  # a pending request to look at
            client.post(f"{API}/ondemandvm", content=f'{{"pool1": 1, "request_id": "{rid}"}}')
        hot = client.request(method, path, content=body)
        framework = stack.request(method, path.rstrip("/"), content=body)
        assert (hot.status_code, framework.status_code) == (status, status), path
        assert hot.headers["content-type"] == framework.headers["content-type"]
        if method == "GET":
            assert hot.text == framework.text
        else:  # each POST made its own request
            assert hot.json().keys() == framework.json().keys()
        assert _responses(app, template, method, status) == 2, template


def test_hot_routes_keep_the_error_handlers(redis_url: str) -> None:
    """Proves: a hot route's refusals are the app's handlers' (a 401 from auth, a 400 for
    a bad body, a 413 for a body over the limit), counted under its template."""
    client, app = make_client(spec_config(auth=True), redis_url)
    assert client.post(f"{API}/ondemandvm", content="{}").status_code == 401
    client, app = make_client(spec_config(), redis_url)
    r = client.post(f"{API}/ondemandvm", content="{nope")
    assert (r.status_code, r.json()) == (
        400,
        {"ok": False, "message": "JSON payload could not be parsed"},
    )
    r = client.post(f"{API}/ondemandvm", content=b"x" * (MAX_BODY_BYTES + 1))
    assert r.status_code == 413
    assert _responses(app, f"{API}/ondemandvm", "POST", 413) == 1


# -- one fleet per key prefix ------------------------------------------------------------


def test_an_app_reports_only_its_own_fleet(redis_url: str, redis_client: redis.Redis) -> None:
    raw = redis.Redis.from_url(redis_url)
    mine, theirs = Keys("vmpool"), Keys("other")
    for keys, name in [(mine, "w-mine"), (theirs, "w-theirs")]:
        queues = [Queue(q, connection=raw) for q in queue_names(keys)]
        Worker(queues, connection=raw, name=name).register_birth()
    c, _ = make_client(spec_config(), redis_url)
    status = c.get(f"{API}/status").json()
    assert sorted(status["queues"]) == sorted(queue_names(mine))
    assert [w["name"] for w in status["workers"]] == ["w-mine"]
    text = c.get("/metrics").text
    assert 'vmpool_queue_depth{queue="vmpool-requests"}' in text
    assert "other-" not in text
    workers = [line for line in text.splitlines() if line.startswith("vmpool_workers{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in workers) == 1.0


def test_the_enqueue_uses_the_key_prefix(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = spec_config(key_prefix="other")
    c, _ = make_client(cfg, redis_url)
    rid = c.post(f"{API}/ondemandvm", content='{"pool1": 1}').json()["request_id"]
    raw = redis.Redis.from_url(redis_url)
    keys = Keys("other")
    assert Queue(keys.queue("requests"), connection=raw).count == 1
    assert Queue(Keys("vmpool").queue("requests"), connection=raw).count == 0
    assert c.get(f"{API}/ondemandvm/{rid}").status_code == 202

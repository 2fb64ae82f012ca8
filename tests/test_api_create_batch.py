"""POST /ondemandvm's creates of one event-loop turn share one round trip
(vmpool/api/create_batch.py), and each POST keeps its own answer.

The POSTs are sent to the app itself (ASGI), started together in one ``asyncio.gather``:
none of them waits on anything before its create, so every create of the gather is
asked for in the same turn of the loop, deterministically.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import uuid
from typing import Any

import redis
from fastapi import FastAPI

from vmpool.api.turn_batch import BATCH_MOST
from vmpool.config import default_redis_options
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from workers.batching import LANES

from apihelp import API, make_app, make_client, spec_config
from storehelp import poll


async def _post(app: FastAPI, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST /ondemandvm with ``body`` straight to ``app``: (status, JSON answer)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": f"{API}/ondemandvm",
        "raw_path": f"{API}/ondemandvm".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(raw))],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(sent[0]["status"]), json.loads(body_out)


def _together(app: FastAPI, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    async def run() -> list[tuple[int, dict[str, Any]]]:
        return list(await asyncio.gather(*(_post(app, b) for b in bodies)))

    return asyncio.run(run())


def _calls(conn: redis.Redis, name: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_the_creates_of_one_turn_go_in_one_pipeline_each_with_its_own_answer(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: six POSTs of one turn send six create scripts and one lane check (seven
    EVALSHA; one POST at a time sends two each: twelve), and each gets its own answer:
    five requests created (pending, in the provision work set), and the one whose
    request id exists refused with vmpooler's 409 naming it, creating nothing."""
    config = spec_config()
    client, _ = make_client(config, redis_url)
    for _ in range(LANES):  # every lane queued: the lane check then finds none free
        assert client.post(f"{API}/ondemandvm", json={"pool1": 1}).status_code == 201
    taken = client.post(f"{API}/ondemandvm", json={"pool1": 1}).json()["request_id"]
    chosen = [str(uuid.uuid4()) for _ in range(5)]
    bodies: list[dict[str, Any]] = [{"pool1": 1, "request_id": rid} for rid in chosen]
    bodies.insert(3, {"pool3": 1, "request_id": taken})
    app = make_app(config, redis_url)
    redis_client.config_resetstat()
    answers = _together(app, bodies)
    assert _calls(redis_client, "evalsha") == len(bodies) + 1
    message = f"request_id '{taken}' has already been created"
    assert answers[3] == (409, {"ok": False, "request_id": taken, "message": message})
    created = answers[:3] + answers[4:]
    assert created == [(201, {"ok": True, "request_id": rid}) for rid in chosen]
    keys = Keys(config.key_prefix)
    store = Store(redis_client, keys)
    work = redis_client.zrange(keys.work_set("provision_request"), 0, -1)
    for rid in chosen:
        record = store.get_request(rid)
        assert record is not None and record.status == "pending"
        assert rid in work
    taken_record = store.get_request(taken)
    assert taken_record is not None and taken_record.requested == "pool1:pool1:1"


def test_a_turn_of_more_creates_than_a_batch_holds_is_sent_in_batches_of_the_most(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a turn's creates past BATCH_MOST start another batch (so Redis runs the
    first while the loop answers the replies of another): 19
    POSTs of one turn with a most of 8 send three pipelines, each with its own lane
    check (22 EVALSHA; one pipeline for the whole turn sends 20), and each POST is still
    answered for its own request, all of them created."""
    config = spec_config()
    client, _ = make_client(config, redis_url)
    for _ in range(LANES):  # every lane queued: the lane check then finds none free
        assert client.post(f"{API}/ondemandvm", json={"pool1": 1}).status_code == 201
    chosen = [str(uuid.uuid4()) for _ in range(2 * BATCH_MOST + 3)]
    app = make_app(config, redis_url)
    redis_client.config_resetstat()
    answers = _together(app, [{"pool1": 1, "request_id": rid} for rid in chosen])
    assert _calls(redis_client, "evalsha") == len(chosen) + 3
    assert answers == [(201, {"ok": True, "request_id": rid}) for rid in chosen]
    work = redis_client.zrange(Keys(config.key_prefix).work_set("provision_request"), 0, -1)
    assert set(chosen) <= set(work)


def test_a_batch_not_confirmed_fails_each_post_with_its_own_503(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the batch's writes are confirmed once (one WAIT for the turn's creates),
    and when that confirmation does not come (durability ``replicas`` on a Redis with no
    replica) no POST of the batch is acknowledged: each answers 503 naming the request
    id it tried, as a POST alone does."""
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=0.05)
    options = dataclasses.replace(default_redis_options(), durability=setting)
    config = dataclasses.replace(spec_config(), redis_options=options)
    app = make_app(config, redis_url)
    chosen = [str(uuid.uuid4()) for _ in range(4)]
    redis_client.config_resetstat()
    answers = _together(app, [{"pool1": 1, "request_id": rid} for rid in chosen])
    assert _calls(redis_client, "wait") == 1
    for rid, (status, body) in zip(chosen, answers, strict=True):
        assert status == 503, body
        assert body["request_id"] == rid and body["redis"] == "not_confirmed"


def test_a_batch_whose_connection_dies_in_flight_is_sent_again_and_creates_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the creates' round trip keeps the connection's retry. Redis holds the
    batch (CLIENT PAUSE WRITE: its first script waits, unrun), its connection is killed
    while it waits, and the batch goes again on a new connection: every POST 201, each
    request created once, in the provision work set."""
    config = spec_config()
    app = make_app(config, redis_url)
    assert _together(app, [{"pool1": 1}])[0][0] == 201  # the scripts loaded, a lane queued
    chosen = [str(uuid.uuid4()) for _ in range(3)]
    killed: list[str] = []

    def held() -> list[dict[str, Any]]:
        return [
            c for c in redis_client.client_list() if "b" in c["flags"] and c["cmd"] == "evalsha"
        ]

    def kill_the_held_batch() -> None:
        try:
            if poll(lambda: bool(held()), 10.0):
                for client in held():
                    redis_client.client_kill_filter(_id=client["id"])
                    killed.append(client["id"])
        finally:
            redis_client.execute_command("CLIENT", "UNPAUSE")

    redis_client.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    killer = threading.Thread(target=kill_the_held_batch)
    killer.start()
    try:
        answers = _together(app, [{"pool1": 1, "request_id": rid} for rid in chosen])
    finally:
        killer.join(15)
    assert len(killed) == 1
    assert answers == [(201, {"ok": True, "request_id": rid}) for rid in chosen]
    keys = Keys(config.key_prefix)
    work = redis_client.zrange(keys.work_set("provision_request"), 0, -1)
    store = Store(redis_client, keys)
    for rid in chosen:
        record = store.get_request(rid)
        assert record is not None and record.status == "pending" and record.version == 1
        assert work.count(rid) == 1

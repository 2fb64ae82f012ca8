"""GET /ondemandvm/<id>'s reads of one event-loop turn share one round trip
(vmpool/api/turn_batch.py), and each GET keeps its own answer.

The GETs are sent to the app itself (ASGI), started together in one ``asyncio.gather``:
none of them waits on anything before its read, so every read of the gather is asked
for in the same turn of the loop, deterministically.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import redis
from fastapi import FastAPI

from vmpool.config import default_redis_options
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from apihelp import API, make_app, make_client, spec_config


async def _get(app: FastAPI, rid: str) -> tuple[int, dict[str, Any]]:
    """GET /ondemandvm/<rid> straight to ``app``: (status, JSON answer)."""
    path = f"{API}/ondemandvm/{rid}"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(sent[0]["status"]), json.loads(body)


def _together(app: FastAPI, rids: list[str]) -> list[tuple[int, dict[str, Any]]]:
    async def run() -> list[tuple[int, dict[str, Any]]]:
        return list(await asyncio.gather(*(_get(app, rid) for rid in rids)))

    return asyncio.run(run())


def _calls(conn: redis.Redis, name: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_the_gets_of_one_turn_each_get_their_own_answer(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: GETs of one turn, each its own script call in the turn's round trip, are
    each answered for their own request: pending ones with their own position, a
    deleted one 200 with vmpooler's message, an unknown one 404 naming it."""
    config = spec_config()
    client, _ = make_client(config, redis_url)
    rids = [client.post(f"{API}/ondemandvm", json={"pool1": 1}).json()["request_id"]
            for _ in range(3)]  # fmt: skip
    store = Store(redis_client, Keys(config.key_prefix))
    assert store.delete_request(rids[1], actor="test").ok
    client.get(f"{API}/ondemandvm/{rids[0]}")  # the script loaded (NOSCRIPT: sent again)
    app = make_app(config, redis_url)
    redis_client.config_resetstat()
    answers = _together(app, [*rids, "nosuch"])
    assert _calls(redis_client, "evalsha") == 4
    (s0, first), (s1, deleted), (s2, third), (s3, unknown) = answers
    assert (s0, first["request_id"], first["position"]) == (202, rids[0], 1), first
    assert (s2, third["request_id"], third["position"]) == (202, rids[2], 2), third
    assert s1 == 200 and deleted["message"] == "The request has been deleted", deleted
    assert "position" not in deleted
    assert s3 == 404 and unknown["message"] == "no request found for request_id 'nosuch'"


def test_a_batch_not_confirmed_fails_each_get_and_is_confirmed_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the turn's reads go in one round trip, confirmed once (one WAIT for four
    GETs; each GET alone sent its own), and when that confirmation does not come
    (durability ``replicas`` on a Redis with no replica) no GET is answered from it:
    each is a 503, as a GET alone is."""
    client, _ = make_client(spec_config(), redis_url)
    rids = [client.post(f"{API}/ondemandvm", json={"pool1": 1}).json()["request_id"]
            for _ in range(4)]  # fmt: skip
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=0.05)
    options = dataclasses.replace(default_redis_options(), durability=setting)
    config = dataclasses.replace(spec_config(), redis_options=options)
    app = make_app(config, redis_url)
    redis_client.config_resetstat()
    answers = _together(app, rids)
    assert _calls(redis_client, "wait") == 1
    for status, body in answers:
        assert status == 503 and body["redis"] == "not_confirmed", body

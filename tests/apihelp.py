"""Helpers shared by the API tests: configs, apps, state snapshots, driving to ready.

Every API test builds its app with :func:`make_app`: the production app, made by the
factory ``vmpool api`` calls with the options it passes, over the test Redis. A test
observes what the app sent to the fleet in Redis (the work sets and RQ's queues) and
injects faults through real peers or failpoints (vmpool.lifecycle.failpoints), never
through an app built another way (tests/test_api_app.py holds the two to one shape).
"""

from __future__ import annotations

import json
import random
from typing import Any

import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from rq import Queue

from vmpool.api.app import create_app
from vmpool.config import Config, parse_config
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from vmpool.state.tokens import hash_password
from workers.table import JOBS, job_id

API = "/api/v3"
# Where `vmpool api` listens unless told otherwise (its --host default).
LISTEN_HOST = "127.0.0.1"
PASSWORD = "s3cret-pass"
PASSWORD_HASH = hash_password(PASSWORD, iterations=1000, salt="testsalt")


def spec_config(
    *,
    auth: bool = False,
    rate_limit: int | None = None,
    weights: dict[str, float] | None = None,
    ttl_minutes: float = 5,
    key_prefix: str | None = None,
) -> Config:
    """vmpooler's ondemandvm_spec.rb configuration, in vmpool's loader."""
    data = spec_data(
        auth=auth,
        rate_limit=rate_limit,
        weights=weights,
        ttl_minutes=ttl_minutes,
        key_prefix=key_prefix,
    )
    return parse_config(data, source="test", env={})


def spec_data(
    *,
    auth: bool = False,
    rate_limit: int | None = None,
    weights: dict[str, float] | None = None,
    ttl_minutes: float = 5,
    key_prefix: str | None = None,
) -> dict[str, Any]:
    """:func:`spec_config`'s file, as data (JSON is YAML: a config file's text as well)."""
    data: dict[str, Any] = {
        "config": {
            "site_name": "test pooler",
            "vm_lifetime_auth": 2,
            "max_ondemand_instances_per_request": 50,
            "ondemand_request_ttl": ttl_minutes,
            "backend_weight": {"compute1": 5, "compute2": 0} if weights is None else weights,
        },
        "dns_configs": {"mock": {"dns_class": "mock", "domain": "example.com"}},
        "pools": [
            {
                "name": "pool1",
                "alias": ["poolone", "pool2"],
                "size": 0,
                "clone_target": "compute1",
                "dns_plugin": "mock",
            },
            {"name": "pool2", "size": 0, "clone_target": "compute2", "dns_plugin": "mock"},
            {"name": "pool3", "size": 0, "clone_target": "compute1", "dns_plugin": "mock"},
        ],
    }
    if key_prefix is not None:
        data["redis"] = {"key_prefix": key_prefix}
    if auth:
        data["auth"] = {
            "provider": "static",
            "users": {"jdoe": PASSWORD_HASH, "alice": PASSWORD_HASH},
        }
        if rate_limit is not None:
            data["auth"]["rate_limit_per_minute"] = rate_limit
    return data


def make_app(
    config: Config, redis_url: str, *, seed: int = 1, listen_host: str | None = LISTEN_HOST
) -> FastAPI:
    """The app ``vmpool api`` serves for ``config`` and ``redis_url``.

    ``seed`` seeds its backend picks (served: the system's random source, the same
    code). Enter a TestClient of it (``with``) to run its lifespan, as uvicorn does.
    """
    return create_app(config, redis_url, rng=random.Random(seed), listen_host=listen_host)


def make_client(
    config: Config, redis_url: str, *, seed: int = 1, listen_host: str | None = LISTEN_HOST
) -> tuple[TestClient, FastAPI]:
    """A client of :func:`make_app`'s app that answers an unexpected error with its 500."""
    app = make_app(config, redis_url, seed=seed, listen_host=listen_host)
    return TestClient(app, raise_server_exceptions=False), app


def provision_work(redis_client: redis.Redis, config: Config) -> list[str]:
    """The request ids waiting in the provision work set, in arrival order: where a POST
    hands a new request to the fleet."""
    keys = Keys(config.key_prefix)
    return [str(rid) for rid in redis_client.zrange(keys.work_set("provision_request"), 0, -1)]


def queued_provision_lanes(redis_url: str, config: Config) -> list[str]:
    """The provision batch jobs waiting in RQ's queue: what a POST queued for a worker."""
    keys = Keys(config.key_prefix)
    raw = redis.Redis.from_url(redis_url)
    try:
        queue = Queue(keys.queue(JOBS["provision_batch"].queue), connection=raw)
        lane = job_id(keys, "provision_batch") + "_r"
        return [jid for jid in queue.job_ids if jid.startswith(lane)]
    finally:
        raw.close()


def pretty(obj: Any) -> str:
    """Ruby's JSON.pretty_generate for the shapes vmpooler returns."""
    return json.dumps(obj, indent=2, ensure_ascii=False)


def compact(obj: Any) -> str:
    """Ruby's JSON.generate: the hot replies (vmpool.api.responses)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def snapshot(redis_url: str) -> dict[bytes, tuple[bytes, bytes | None]]:
    """Every key with its type and DUMP: equal snapshots mean nothing was written."""
    raw = redis.Redis.from_url(redis_url, decode_responses=False)
    try:
        out: dict[bytes, tuple[bytes, bytes | None]] = {}
        for key in raw.scan_iter(count=1000):
            out[key] = (raw.type(key), raw.dump(key))
        return out
    finally:
        raw.close()


def store_for(redis_client: redis.Redis, config: Config) -> Store:
    return Store(redis_client, Keys(config.key_prefix))


def drive_ready(store: Store, rid: str, domain: str = "example.com") -> list[str]:
    """Reserve, create and ready every VM the request still needs, through the store's
    transitions (as the workers would). Returns the short VM names."""
    record = store.get_request(rid)
    assert record is not None
    names = []
    i = 0
    for slot in record.slots:
        for _ in range(slot.want - slot.live):
            name = f"vm-{rid[:8].lower()}-{i}"
            i += 1
            out = store.reserve_vm(
                rid,
                name=name,
                alias=slot.alias,
                pool=slot.pool,
                template=slot.pool,
                provider="simulated",
                domain=domain,
                actor="test",
            )
            assert out.ok, out
            assert store.vm_created(name, actor="test").code == "pending"
            assert store.vm_ready(name, actor="test").ok
            names.append(name)
    return names


# Every request id a client might send to break a key, a job id or a log line. The
# first stops provisioning for everyone under a naive check: `$` in
# `re.match(r"^...$")` also matches before a final newline, and RQ refuses the job id.
HOSTILE_IDS: list[Any] = [
    "poison\n", "poison\r\n", "poison\n\n", "\npoison", "poi\nson", "poison\r",
    "poison\x00", "poison\t", " poison", "poison ", "poi son", "poison\u2028",
    "poison\x85", "p\u043eison",  # a Cyrillic o
    "", "-poison", ".poison", "_poison", "..", "../../etc/passwd", "a/b", "a\\b",
    "{poison}", "poi{son", "poi}son", "a:b", "a*", "*", "?", "[ab]", "a%0Ab", "a+b",
    "x" * 129, "1" * 10_000, "ü" * 3, "\ud800",
    1, 1.5, True, None, [], {}, ["poison"], {"id": "poison"},
]  # fmt: skip

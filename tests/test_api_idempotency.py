"""The ``Idempotency-Key`` header (vmpool/api/idempotency.py, docs/api.md "Retrying a
call"): a mutating call sent again with its key answers what the first call did and
changes nothing; a key reused for another request is a 422; a call without a key works
as vmpooler's; the 503 of a checkout that could not be confirmed names a key the client
retries with to learn which VMs it got."""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool.config import default_redis_options
from vmpool.local.redis_server import free_port
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from vmpool.state.tokens import TokenStore

from apihelp import API, PASSWORD, make_client, snapshot, spec_config
from sentinelhelp import HOST, Node, wait_for
from storehelp import make_ready

POOL = "pool1"
KEY = {"Idempotency-Key": "0b7c9e4e-4a61-4d7e-9a44-6f1f3c2f0d11"}
OTHER = {"Idempotency-Key": "5f0a3a52-0d0e-4a0c-8f61-2b8a4c3e9d77"}


def experimental(auth: bool = False) -> Any:
    config = spec_config(auth=auth)
    return dataclasses.replace(config, experimental_features=True)


def basic(user: str = "jdoe") -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def running(r: redis.Redis) -> list[str]:
    return sorted(str(n) for n in r.zrange(Keys().pool_state(POOL, "running"), 0, -1))


def test_a_repeated_checkout_hands_out_the_first_vms(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the checkout sent again with its key answers the same hostname and takes
    no second VM; without a key the same call takes another (the control); the key of
    one user is not another's."""
    c, _ = make_client(spec_config(), redis_url)
    make_ready(Store(redis_client, Keys()), POOL, 3)
    first = c.post(f"{API}/vm/{POOL}", headers=KEY)
    assert first.status_code == 200, first.text
    again = c.post(f"{API}/vm/{POOL}", headers=KEY)
    assert again.json() == first.json()
    assert len(running(redis_client)) == 1
    other = c.post(f"{API}/vm/{POOL}")
    assert other.status_code == 200 and other.json() != first.json()
    assert len(running(redis_client)) == 2


def test_an_alias_checkout_repeat_answers_under_the_first_names(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the repeat answers the VMs under the names the first call asked, even
    when what is ready now would make the API choose another pool for the alias (the
    first call's choice travels with the checkout). "pool2" names pool2, then pool1
    (which lists it as an alias): with pool2 empty the first call takes pool1's VM."""
    c, _ = make_client(spec_config(), redis_url)
    store = Store(redis_client, Keys())
    make_ready(store, POOL, 1)
    first = c.post(f"{API}/vm", json={"pool2": 1}, headers=KEY)
    assert first.status_code == 200, first.text
    assert first.json()["pool2"]["hostname"].startswith("pool1-")
    make_ready(store, "pool2", 2, prefix="x")
    again = c.post(f"{API}/vm", json={"pool2": 1}, headers=KEY)
    assert (again.status_code, again.json()) == (200, first.json())


def test_a_key_reused_for_another_request_is_refused(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a key first used for a checkout of pool1, then sent with another body,
    is a 422 that changes nothing."""
    c, _ = make_client(spec_config(), redis_url)
    make_ready(Store(redis_client, Keys()), POOL, 3)
    assert c.post(f"{API}/vm", json={POOL: 1}, headers=KEY).status_code == 200
    before = snapshot(redis_url)
    r = c.post(f"{API}/vm", json={POOL: 2}, headers=KEY)
    assert r.status_code == 422 and r.json()["ok"] is False, r.text
    assert {k: v for k, v in snapshot(redis_url).items() if b":op:" not in k} == {
        k: v for k, v in before.items() if b":op:" not in k
    }


def test_a_malformed_key_is_a_400() -> None:
    """Proves: a key that is no visible ASCII string is refused before anything runs."""
    c, _ = make_client(spec_config(), "redis://127.0.0.1:1/0")
    r = c.delete(f"{API}/vm/pool1-w0", headers={"Idempotency-Key": "a b"})
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["message"]


Call = Callable[[TestClient, dict[str, str]], Any]


def _given_back(c: TestClient, h: dict[str, str]) -> Any:
    return c.delete(f"{API}/vm/pool1-w0", headers=h)


def _modified(c: TestClient, h: dict[str, str]) -> Any:
    return c.put(f"{API}/vm/pool1-w0", json={"lifetime": 3, "tags": {"a": "b"}}, headers=h)


def _snapshot(c: TestClient, h: dict[str, str]) -> Any:
    return c.post(f"{API}/vm/pool1-w0/snapshot", headers=h)


@pytest.mark.parametrize("call", [_given_back, _modified, _snapshot], ids=lambda f: f.__name__)
def test_a_repeated_change_of_a_held_vm_answers_the_first_reply(
    call: Call, redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves, for give-back, PUT (lifetime and tags) and a snapshot: the call sent
    again with its key answers what the first answered (a give-back: 200, not a 404
    for a VM no longer held; a snapshot: the same id) and the data is as after one."""
    c, _ = make_client(spec_config(), redis_url)
    make_ready(Store(redis_client, Keys()), POOL, 1)
    assert c.post(f"{API}/vm/{POOL}").status_code == 200
    first = call(c, KEY)
    assert first.status_code in (200, 202), first.text
    after = snapshot(redis_url)
    again = call(c, KEY)
    assert (again.status_code, again.json()) == (first.status_code, first.json())
    assert {k: v for k, v in snapshot(redis_url).items() if b":op:" not in k} == {
        k: v for k, v in after.items() if b":op:" not in k
    }


def test_ondemand_create_and_delete_with_a_key(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: POST /ondemandvm with a key and no request_id creates the request the
    key names (its repeat: 201, the same id, one request); DELETE sent again with its
    key answers the first 200 without the "already deleted" message."""
    c, _ = make_client(spec_config(), redis_url)
    first = c.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=KEY)
    again = c.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=KEY)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert len(list(redis_client.scan_iter(match="vmpool:request:{*}"))) == 1
    rid = first.json()["request_id"]
    gone = c.delete(f"{API}/ondemandvm/{rid}", headers=OTHER)
    assert (gone.status_code, gone.json()) == (200, {"ok": True})
    assert c.delete(f"{API}/ondemandvm/{rid}", headers=OTHER).json() == {"ok": True}
    assert "already" in c.delete(f"{API}/ondemandvm/{rid}").json()["message"]


def test_tokens_minted_and_revoked_once_per_key(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: POST /token sent again with its key answers the same token (kept sealed
    under the key: Redis holds no plain token) and mints no second one; DELETE
    /token/<t> sent again answers 200 again (not 404); a short key on POST /token is
    refused (a sealing key must not be guessable)."""
    c, _ = make_client(spec_config(auth=True), redis_url)
    token = c.post(f"{API}/token", headers={**basic(), **KEY}).json()["token"]
    assert c.post(f"{API}/token", headers={**basic(), **KEY}).json()["token"] == token
    assert len(TokenStore(redis_client, Keys()).of_user("jdoe")) == 1
    dump = b"".join(v[1] or b"" for v in snapshot(redis_url).values())
    assert token.encode() not in dump
    short = c.post(f"{API}/token", headers={**basic(), "Idempotency-Key": "k1"})
    assert short.status_code == 400
    for _ in range(2):
        r = c.delete(f"{API}/token/{token}", headers={**basic(), **OTHER})
        assert (r.status_code, r.json()) == (200, {"ok": True})
    assert c.delete(f"{API}/token/{token}", headers=basic()).status_code == 404


def test_pool_overrides_once_per_key(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: POST /config/poolsize sent again with its key answers the first 201
    (not 200, "nothing changed"); DELETE /config/poolsize/<pool> sent again answers the
    size it removed (not the configured one)."""
    c, _ = make_client(experimental(), redis_url)
    first = c.post(f"{API}/config/poolsize", json={POOL: 4}, headers=KEY)
    again = c.post(f"{API}/config/poolsize", json={POOL: 4}, headers=KEY)
    assert first.status_code == again.status_code == 201
    gone = c.delete(f"{API}/config/poolsize/{POOL}", headers=OTHER)
    again = c.delete(f"{API}/config/poolsize/{POOL}", headers=OTHER)
    assert gone.status_code == again.status_code == 201
    assert gone.json() == again.json() and gone.json()["pool_size_before_reset"] == 4


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    nodes = []
    for name, extra in (("primary", []), ("replica", ["--replicaof", HOST, "{port}"])):
        directory = tmp_path / name
        directory.mkdir()
        args = [a.format(port=nodes[0].port) if nodes else a for a in extra]
        nodes.append(Node(name, free_port(), directory, ["--save", "", *args]).start())
    primary, replica = nodes
    try:
        link = lambda: replica.client().info("replication")["master_link_status"] == "up"  # noqa: E731
        wait_for(link, 20, "the replica to sync")
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


@pytest.mark.slow
def test_an_unconfirmed_checkout_names_a_key_that_learns_what_it_got(
    primary_and_replica: tuple[Node, Node],
) -> None:
    """Proves the 503 path: every write waits for a replica, which is stopped
    (SIGSTOP). A checkout without a key runs on the primary but is not confirmed: 503
    naming ``idempotency_key`` (and the header). Once the replica is back, the same call
    sent with that key answers 200 with the VM the first one took: one VM running, held
    by the one caller."""
    primary, replica = primary_and_replica
    url = f"redis://{HOST}:{primary.port}/0"
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=0.5)
    opts = dataclasses.replace(default_redis_options(), durability=setting)
    c, _ = make_client(dataclasses.replace(spec_config(), redis_options=opts), url)
    r = primary.client(decode_responses=True)
    make_ready(Store(r, Keys()), POOL, 3)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        lost = c.post(f"{API}/vm/{POOL}")
        assert lost.status_code == 503, lost.text
        key = lost.json()["idempotency_key"]
        assert lost.headers["Idempotency-Key"] == key and lost.json()["redis"] == "not_confirmed"
        assert len(running(r)) == 1  # written, not acknowledged
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_for(lambda: c.get("/readyz").status_code == 200, 15, "ready again")
    learnt = c.post(f"{API}/vm/{POOL}", headers={"Idempotency-Key": key})
    assert learnt.status_code == 200, learnt.text
    assert learnt.json()[POOL]["hostname"].split(".")[0] == running(r)[0]
    assert len(running(r)) == 1

"""vmpooler's API behaviours vmpool lacked: `allowed_tags` on PUT /vm/<hostname>,
checkout without a token with auth on (and the setting that requires one), `/status`'s
`cloning` and `booting` and its `?view=`. Each case says what vmpooler 3.9.1 does
(lib/vmpooler/api/v3.rb)."""

from __future__ import annotations

import json
from typing import Any

import redis
from fastapi.testclient import TestClient

from vmpool.config import Config, parse_config
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from apihelp import API, PASSWORD_HASH, make_client, snapshot

POOL = "deb"


def config(**extra: Any) -> Config:
    auth = extra.pop("auth", None)
    data: dict[str, Any] = {
        ":config": {"vm_lifetime": 2, "vm_lifetime_auth": 5, **extra},
        ":pools": [{"name": POOL, "alias": ["debian"], "size": 0, "domain": "example.com"}],
    }
    if auth is not None:
        data[":auth"] = {"provider": "static", "users": {"jdoe": PASSWORD_HASH}, **auth}
    return parse_config(data, source="test", env={})


def warm(client: redis.Redis, n: int) -> list[str]:
    """``n`` ready VMs in the pool, through the store's transitions."""
    store = Store(client, Keys())
    names = []
    for i in range(n):
        name = f"gap-vm-{i}"
        assert store.pools.reserve_pool_vm(
            name, pool=POOL, template="t", provider="simulated", domain="example.com",
            size=n, data_ttl_s=60, actor="test",
        ).ok  # fmt: skip
        store.vm_created(name, actor="test")
        store.vm_ready(name, actor="test")
        names.append(name)
    return names


def checked_out(client: TestClient) -> str:
    r = client.post(f"{API}/vm/{POOL}")
    assert r.status_code == 200, r.text
    return str(r.json()[POOL]["hostname"]).split(".")[0]


# -- allowed_tags -----------------------------------------------------------------------


def test_a_tag_outside_allowed_tags_is_400_with_vmpoolers_failure(
    redis_url: str, redis_client: redis.Redis
) -> None:
    warm(redis_client, 1)
    client, _ = make_client(config(allowed_tags=["project", "created_by"]), redis_url)
    vm = checked_out(client)
    before = snapshot(redis_url)
    r = client.put(f"{API}/vm/{vm}", content=json.dumps({"tags": {"project": "x", "team": "y"}}))
    assert r.status_code == 400
    assert r.json() == {
        "ok": False,
        "failure": ['You provided unsuppored tags ({"project"=>"x", "team"=>"y"}).'],
    }
    assert snapshot(redis_url) == before  # nothing tagged
    r = client.put(f"{API}/vm/{vm}", content=json.dumps({"tags": {"project": "x"}}))
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert client.get(f"{API}/vm/{vm}").json()[vm]["tags"] == {"project": "x"}


def test_without_allowed_tags_any_tag_is_taken(redis_url: str, redis_client: redis.Redis) -> None:
    warm(redis_client, 1)
    client, _ = make_client(config(), redis_url)
    vm = checked_out(client)
    r = client.put(f"{API}/vm/{vm}", content=json.dumps({"tags": {"team": "y"}}))
    assert r.status_code == 200 and r.json() == {"ok": True}


# -- checkout without a token ------------------------------------------------------------


def token_for(client: TestClient, user: str = "jdoe") -> str:
    r = client.post(f"{API}/token", auth=(user, "s3cret-pass"))
    assert r.status_code == 200, r.text
    return str(r.json()["token"])


def test_auth_on_a_checkout_without_a_token_gets_vm_lifetime_and_a_token_extends_it(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler: POST /vm/<pool> and POST /vm need no token even with auth on; the VM
    then gets vm_lifetime (2 h here), and a token gives it vm_lifetime_auth (5 h). vmpool
    answered 401, which broke CI jobs that check out anonymously."""
    warm(redis_client, 3)
    client, _ = make_client(config(auth={}), redis_url)
    anonymous = checked_out(client)
    assert client.get(f"{API}/vm/{anonymous}").json()[anonymous]["lifetime"] == 2
    r = client.post(f"{API}/vm", content=json.dumps({"debian": 1}))
    assert r.status_code == 200 and r.json()["ok"] is True
    token = token_for(client)
    r = client.post(f"{API}/vm/{POOL}", headers={"X-AUTH-TOKEN": token})
    mine = str(r.json()[POOL]["hostname"]).split(".")[0]
    assert client.get(f"{API}/vm/{mine}").json()[mine]["lifetime"] == 5


def test_a_bad_token_on_a_checkout_is_401_and_takes_nothing(
    redis_url: str, redis_client: redis.Redis
) -> None:
    warm(redis_client, 1)
    client, _ = make_client(config(auth={}), redis_url)
    before = snapshot(redis_url)
    for token in ("nope", ""):
        r = client.post(f"{API}/vm/{POOL}", headers={"X-AUTH-TOKEN": token})
        assert r.status_code == 401 and r.json() == {"ok": False}
    assert snapshot(redis_url) == before


def test_a_vm_handed_out_without_a_token_is_given_back_without_one(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler's DELETE /vm/<hostname> asks for a token only when the VM was handed out
    with one (need_token! if rdata['token:token']): an anonymous VM goes back without
    one; a user's VM is 401 without a token, 403 with another user's."""
    warm(redis_client, 2)
    client, _ = make_client(
        config(auth={"users": {"jdoe": PASSWORD_HASH, "alice": PASSWORD_HASH}}), redis_url
    )
    anonymous = checked_out(client)
    token = token_for(client)
    r = client.post(f"{API}/vm/{POOL}", headers={"X-AUTH-TOKEN": token})
    mine = str(r.json()[POOL]["hostname"]).split(".")[0]
    r = client.delete(f"{API}/vm/{mine}")
    assert r.status_code == 401 and r.json() == {"ok": False}
    r = client.delete(f"{API}/vm/{mine}", headers={"X-AUTH-TOKEN": token_for(client, "alice")})
    assert r.status_code == 403
    assert client.delete(f"{API}/vm/{anonymous}").json() == {"ok": True}
    assert client.delete(f"{API}/vm/{mine}", headers={"X-AUTH-TOKEN": token}).json() == {"ok": True}


def test_checkout_requires_token_refuses_a_checkout_without_one(
    redis_url: str, redis_client: redis.Redis
) -> None:
    warm(redis_client, 1)
    client, _ = make_client(config(auth={"checkout_requires_token": True}), redis_url)
    before = snapshot(redis_url)
    for r in (client.post(f"{API}/vm/{POOL}"), client.post(f"{API}/vm", content='{"deb": 1}')):
        assert r.status_code == 401 and r.json() == {"ok": False}
        assert r.headers["www-authenticate"] == 'Basic realm="Authentication required"'
    assert snapshot(redis_url) == before
    r = client.post(f"{API}/vm/{POOL}", headers={"X-AUTH-TOKEN": token_for(client)})
    assert r.status_code == 200


# -- /status ------------------------------------------------------------------------------


def test_status_queue_has_vmpoolers_cloning_and_booting(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler's queue: pending is cloning (a create in flight: vmpool's reserved VMs)
    plus booting (created, not ready yet); total counts each VM once."""
    store = Store(redis_client, Keys())
    warm(redis_client, 1)
    for i in range(3):
        name = f"gap-boot-{i}"
        assert store.pools.reserve_pool_vm(
            name, pool=POOL, template="t", provider="simulated", domain=None, size=9,
            data_ttl_s=60, actor="test",
        ).ok  # fmt: skip
        if i:
            store.vm_created(name, actor="test")  # two booting, one still cloning
    client, _ = make_client(config(), redis_url)
    queue = client.get(f"{API}/status").json()["queue"]
    assert queue == {
        "pending": 3,
        "cloning": 1,
        "booting": 2,
        "ready": 1,
        "running": 0,
        "completed": 0,
        "total": 4,
    }


def test_status_view_returns_the_parts_named_and_status(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler's ?view=capacity,boot: only those parts, and status always; a pool with
    no ready VM makes status not ok only when the pools are in the view."""
    client, _ = make_client(
        parse_config({":pools": [{"name": POOL, "size": 2}]}, source="t", env={}), redis_url
    )
    full = client.get(f"{API}/status").json()
    assert {"pools", "queue", "capacity", "status", "workers"} <= set(full)
    assert full["status"]["ok"] is False and full["status"]["empty"] == [POOL]
    some = client.get(f"{API}/status", params={"view": "capacity,boot"}).json()
    assert list(some) == ["capacity", "status"]
    assert some["status"]["ok"] is True and "empty" not in some["status"]
    pools = client.get(f"{API}/status", params={"view": "pools,queue"}).json()
    assert list(pools) == ["pools", "queue", "status"] and pools["status"]["ok"] is False
    assert list(client.get(f"{API}/status", params={"view": ""}).json()) == ["status"]

"""vmpooler's operator endpoints and read-only pool endpoints, built from its specs
(spec/integration/api/v3/config_spec.rb, poolreset.rb, status_spec.rb's poolstat and
totalrunning, token_spec.rb's GET /token): status codes and exact bodies, plus what
vmpool adds (admins only with auth on; overrides the workers honour)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis

from vmpool.config import Config, parse_config
from vmpool.lifecycle.overrides import pools_with_overrides
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from apihelp import PASSWORD, PASSWORD_HASH, make_client, pretty

V = "/api/v3"


def operator_config(*, experimental: bool = True, auth: bool = False) -> Config:
    """config_spec.rb's configuration."""
    data: dict[str, Any] = {
        "config": {"site_name": "test pooler", "vm_lifetime_auth": 2,
                   "experimental_features": experimental},
        "pools": [
            {"name": "pool1", "size": 5, "template": "templates/pool1",
             "clone_target": "default_cluster", "alias": ["poolone"]},
            {"name": "pool2", "size": 10},
        ],
    }  # fmt: skip
    if auth:
        data["auth"] = {
            "provider": "static",
            "users": {"admin": PASSWORD_HASH, "jdoe": PASSWORD_HASH},
            "admins": ["admin"],
        }
    return parse_config(data, source="test", env={})


def body_of(r: Any) -> str:
    return str(r.text)


def expect(r: Any, status: int, body: dict[str, Any]) -> None:
    assert r.status_code == status, r.text
    assert body_of(r) == pretty(body)


@pytest.fixture
def client(redis_url: str, redis_client: redis.Redis) -> Any:
    return make_client(operator_config(), redis_url)[0]


def test_pooltemplate(client: Any) -> None:
    """config_spec.rb, POST and DELETE /config/pooltemplate."""
    expect(client.post(f"{V}/config/pooltemplate", content='{"pool1":"templates/new_template"}'),
           201, {"ok": True})  # fmt: skip
    expect(client.delete(f"{V}/config/pooltemplate/pool1"), 201,
           {"ok": True, "template_before_reset": "templates/new_template",
            "template_before_overrides": "templates/pool1"})  # fmt: skip
    expect(client.delete(f"{V}/config/pooltemplate/pool1"), 200,
           {"ok": True, "template_before_reset": "templates/pool1",
            "template_before_overrides": "templates/pool1"})  # fmt: skip
    expect(client.delete(f"{V}/config/pooltemplate/poolpoolpool"), 404, {"ok": False})
    body = '{"pool1":"templates/new_template","pool2":"templates/new_template2"}'
    expect(client.post(f"{V}/config/pooltemplate", content=body), 201, {"ok": True})
    expect(client.post(f"{V}/config/pooltemplate", content=body), 200, {"ok": True})
    r = client.post(f"{V}/config/pooltemplate", content='{"poolpoolpool":"templates/x"}')
    expect(r, 400, {"ok": False, "bad_templates": ["poolpoolpool"]})
    body = '{"pool1":"templates/new_template","pool3":"templates/new_template2"}'
    expect(client.post(f"{V}/config/pooltemplate", content=body), 400,
           {"ok": False, "bad_templates": ["pool3"]})  # fmt: skip
    for bad in ("template1", "/template1", "template1/"):
        r = client.post(f"{V}/config/pooltemplate", content=json.dumps({"pool1": bad}))
        expect(r, 400, {"ok": False, "bad_templates": ["pool1"]})


def test_poolsize(client: Any) -> None:
    """config_spec.rb, POST and DELETE /config/poolsize."""
    expect(client.post(f"{V}/config/poolsize", content='{"pool1":"2"}'), 201, {"ok": True})
    expect(client.delete(f"{V}/config/poolsize/pool1"), 201,
           {"ok": True, "pool_size_before_reset": 2, "pool_size_before_overrides": 5})  # fmt: skip
    expect(client.delete(f"{V}/config/poolsize/pool10"), 404, {"ok": False})
    expect(client.delete(f"{V}/config/poolsize/pool1"), 200,
           {"ok": True, "pool_size_before_reset": 5, "pool_size_before_overrides": 5})  # fmt: skip
    expect(client.post(f"{V}/config/poolsize", content='{"pool1":"2","pool2":"2"}'), 201,
           {"ok": True})  # fmt: skip
    expect(client.post(f"{V}/config/poolsize", content='{"pool10":"2"}'), 400,
           {"ok": False, "not_configured": ["pool10"]})  # fmt: skip
    expect(client.post(f"{V}/config/poolsize", content='{"pool1":"5"}'), 201, {"ok": True})
    expect(client.post(f"{V}/config/poolsize", content='{"pool1":"5"}'), 200, {"ok": True})
    expect(client.post(f"{V}/config/poolsize", content='{"pool1":"5","pool2":"5"}'), 201,
           {"ok": True})  # fmt: skip
    for bad in ('"four"', '"-1"', "-1", "true", "1.5"):
        r = client.post(f"{V}/config/poolsize", content='{"pool1":' + bad + "}")
        expect(r, 400, {"ok": False, "not_configured": ["pool1"]})


def test_clonetarget(client: Any) -> None:
    """config_spec.rb, POST /config/clonetarget."""
    expect(client.post(f"{V}/config/clonetarget", content='{"pool1":"cluster1"}'), 201,
           {"ok": True})  # fmt: skip
    body = '{"pool1":"cluster1","pool2":"cluster2"}'
    expect(client.post(f"{V}/config/clonetarget", content=body), 201, {"ok": True})
    expect(client.post(f"{V}/config/clonetarget", content='{"pool10":"cluster1"}'), 400,
           {"ok": False, "bad_templates": ["pool10"]})  # fmt: skip
    expect(client.post(f"{V}/config/clonetarget", content=body), 200, {"ok": True})


def test_poolreset(client: Any) -> None:
    """poolreset.rb, with v3.rb's answers where the two disagree (bad JSON: the
    parse message; an unknown pool: bad_pools)."""
    expect(client.post(f"{V}/poolreset", content='{"pool1":"1"}'), 201, {"ok": True})
    expect(client.post(f"{V}/poolreset", content='{"pool1":"1","pool2":"1"}'), 201, {"ok": True})
    expect(client.post(f"{V}/poolreset", content='{"pool1":"1","pool3":"1"}'), 400,
           {"ok": False, "bad_pools": ["pool3"]})  # fmt: skip
    expect(client.post(f"{V}/poolreset", content='{"pool1":"1}'), 400,
           {"ok": False, "message": "JSON payload could not be parsed"})  # fmt: skip
    expect(client.post(f"{V}/poolreset", content="null"), 404, {"ok": False})


def test_experimental_features_off(redis_url: str, redis_client: redis.Redis) -> None:
    """Every operator endpoint: 405 {"ok": false} with experimental_features off."""
    client = make_client(operator_config(experimental=False), redis_url)[0]
    for path in ("config/poolsize", "config/pooltemplate", "config/clonetarget", "poolreset"):
        expect(client.post(f"{V}/{path}", content='{"pool1":"1"}'), 405, {"ok": False})
    for path in ("config/poolsize/pool1", "config/pooltemplate/pool1"):
        expect(client.delete(f"{V}/{path}"), 405, {"ok": False})
    assert redis_client.dbsize() == 0


def basic(user: str) -> dict[str, str]:
    creds = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {creds}"}


def test_operator_auth_and_admins(redis_url: str, redis_client: redis.Redis) -> None:
    """Auth on: no token 401 (before the body is read), a non-admin's token 403 and
    nothing written, an admin's token changes the pool."""
    client = make_client(operator_config(auth=True), redis_url)[0]
    r = client.post(f"{V}/config/poolsize", content="not json")
    assert r.status_code == 401 and r.json() == {"ok": False}
    jdoe = client.post(f"{V}/token", headers=basic("jdoe")).json()["token"]
    admin = client.post(f"{V}/token", headers=basic("admin")).json()["token"]
    r = client.post(f"{V}/config/poolsize", content='{"pool1":"7"}', headers={"X-AUTH-TOKEN": jdoe})
    assert r.status_code == 403 and r.json()["ok"] is False
    r = client.post(f"{V}/poolreset", content='{"pool1":"1"}', headers={"X-AUTH-TOKEN": jdoe})
    assert r.status_code == 403
    cfg = operator_config(auth=True)
    assert pools_with_overrides(redis_client, Keys(), cfg)["pool1"].size == 5
    r = client.post(f"{V}/config/poolsize", content='{"pool1":"7"}',
                    headers={"X-AUTH-TOKEN": admin})  # fmt: skip
    assert r.status_code == 201
    assert pools_with_overrides(redis_client, Keys(), cfg)["pool1"].size == 7
    assert client.get(f"{V}/poolstat?pool=pool1").json()["pools"]["pool1"]["max"] == 7
    assert client.get(f"{V}/status").json()["pools"]["pool1"]["max"] == 7


def test_get_config_shows_overrides(client: Any) -> None:
    """config_spec.rb's GET /config: the pools, with their runtime values."""
    client.post(f"{V}/config/poolsize", content='{"pool2":"3"}')
    client.post(f"{V}/config/pooltemplate", content='{"pool1":"templates/other"}')
    r = client.get(f"{V}/config")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    pools = r.json()["pool_configuration"]
    assert r.json()["status"] == {"ok": True}
    assert [p["name"] for p in pools] == ["pool1", "pool2"]
    assert pools[0]["template"] == "templates/other" and pools[0]["size"] == 5
    assert pools[0]["clone_target"] == "default_cluster" and pools[1]["size"] == 3


def test_poolstat_and_totalrunning(client: Any, redis_client: redis.Redis) -> None:
    """status_spec.rb's poolstat (by name or alias, csv) and totalrunning."""
    assert client.get(f"{V}/poolstat").json() == {"pools": {}}
    assert client.get(f"{V}/poolstat?pool=unknownpool").json() == {"pools": {}}
    expect(client.get(f"{V}/poolstat?pool=pool1"), 200,
           {"pools": {"pool1": {"max": 5, "alias": ["poolone"], "ready": 0}}})  # fmt: skip
    assert client.get(f"{V}/poolstat?pool=poolone").json()["pools"].keys() == {"pool1"}
    assert client.get(f"{V}/poolstat?pool=pool2").json() == {
        "pools": {"pool2": {"max": 10, "ready": 0}}
    }
    assert len(client.get(f"{V}/poolstat?pool=pool1,pool2").json()["pools"]) == 2
    expect(client.get(f"{V}/totalrunning"), 200, {"running": 0})


def test_get_token_lists_the_callers_tokens(redis_url: str, redis_client: redis.Redis) -> None:
    """token_spec.rb's GET /token: 401 without credentials, the caller's tokens (by
    their SHA-256: only that is stored), 404 with auth off."""
    client = make_client(operator_config(auth=True), redis_url)[0]
    assert client.get(f"{V}/token").status_code == 401
    assert client.get(f"{V}/token", headers=basic("jdoe")).status_code == 404  # none yet
    client.post(f"{V}/token", headers=basic("jdoe"))
    client.post(f"{V}/token", headers=basic("jdoe"))
    client.post(f"{V}/token", headers=basic("admin"))
    r = client.get(f"{V}/token", headers=basic("jdoe"))
    assert r.status_code == 200 and r.json()["ok"] is True
    tokens = {k: v for k, v in r.json().items() if k != "ok"}
    assert len(tokens) == 2
    for sha, entry in tokens.items():
        assert len(sha) == 64 and set(entry) == {"created", "last"} and entry["last"] == "never"
    off = make_client(operator_config(), redis_url)[0]
    expect(off.get(f"{V}/token"), 404, {"ok": False})


def test_snapshot_on_a_provider_without_them_is_501(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a pool whose provider has no Snapshots/Disks capability answers vmpooler's
    error shape with 501 (never a 500), and records no task."""
    aws = {"provider_class": "ec2", "region": "us-east-1", "image_id": "ami-1"}
    pools = [{"name": "p", "provider": "aws", "domain": "example.com"}]
    cfg = parse_config({":providers": {"aws": aws}, ":pools": pools}, source="test", env={})
    store = Store(redis_client, Keys())
    assert store.pools.reserve_pool_vm(
        "vm-1",
        pool="p",
        template="ami-1",
        provider="aws",
        domain="example.com",
        size=1,
        data_ttl_s=60,
        actor="t",
    ).ok
    store.vm_created("vm-1", actor="t")
    store.vm_ready("vm-1", actor="t")
    assert store.pools.checkout({"p": 1}, owner="", owner_hash="", lifetime_s=60, actor="t").ok
    client = make_client(cfg, redis_url)[0]
    for path in ("snapshot", "disk/10"):
        r = client.post(f"{V}/vm/vm-1.example.com/{path}")
        assert r.status_code == 501 and r.json()["ok"] is False and "message" in r.json()
    assert not any(k.startswith("task:") for k in redis_client.hkeys(Keys().vm("vm-1")))

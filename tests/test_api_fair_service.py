"""Quotas, priorities and the queue position at the API (the production app over the
test Redis).

Proves: a POST's ``priority`` is ABS's 1-3, a bad one is a 400 and one above the user's
a 403, both changing nothing; a request larger than the user's whole quota is refused
(403 naming it); a pool called ``priority`` is still a pool; GET of a pending request
adds ``position`` and ``eta_s`` (null while it waits for its user's quota) and a ready
one has neither; a checkout over quota is vmpooler's 403 shape naming the quota and
hands out nothing; the checkout outcomes are counted under vmpooler's names; `vmpool
request get` prints where a request stands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool.config import Config
from vmpool.config.quota_settings import QuotasSection, build_quotas
from vmpool.state.keys import Keys
from vmpool.state.quotas import QuotaLimits
from vmpool.state.store import Store
from vmpool.state.tokens import TokenStore

from apihelp import API, make_client, spec_config
from storehelp import make_ready, snapshot

QUOTAS = {
    "default": {"max_vms": 3},
    "users": {"alice": {"max_vms": 2}, "jdoe": {"priority": 1}},
    "priority_aging": 60,
}


def _config(**extra: object) -> Config:
    config = spec_config(auth=True)
    section = QuotasSection.model_validate({**QUOTAS, **extra})
    return dataclasses.replace(config, quotas=build_quotas(section, lower_case_users=False))


@pytest.fixture
def client(redis_url: str, redis_client: redis.Redis) -> Iterator[TestClient]:
    test_client, _ = make_client(_config(), redis_url)
    with test_client:
        yield test_client


def _token(redis_client: redis.Redis, user: str) -> dict[str, str]:
    return {"X-AUTH-TOKEN": TokenStore(redis_client, Keys("vmpool")).create(user)}


def _store(redis_client: redis.Redis) -> Store:
    return Store(redis_client, Keys("vmpool"))


def _state(redis_client: redis.Redis) -> dict[str, object]:
    """Every key but the tokens' (a call touches its token's last use)."""
    return {k: v for k, v in snapshot(redis_client).items() if ":token:" not in k}


def test_a_priority_is_one_two_or_three(client: TestClient, redis_client: redis.Redis) -> None:
    alice = _token(redis_client, "alice")
    before = _state(redis_client)
    for bad in (0, 4, "high", 1.5, True, None):
        r = client.post(f"{API}/ondemandvm", json={"pool1": 1, "priority": bad}, headers=alice)
        assert r.status_code == 400, (bad, r.text)
        assert r.json() == {"ok": False, "message": "priority must be 1, 2 or 3 (1 is the highest)"}
    r = client.post(f"{API}/ondemandvm", json={"pool1": 1, "priority": 1}, headers=alice)
    assert r.status_code == 403
    assert r.json()["message"] == "priority 1 is above the highest user alice may ask (2)"
    assert _state(redis_client) == before  # refused: nothing changed
    store = _store(redis_client)
    for asked, user, taken in ((3, "alice", 3), ("2", "alice", 2), (None, "jdoe", 1)):
        body: dict[str, object] = {"pool1": 1}
        if asked is not None:
            body["priority"] = asked
        r = client.post(f"{API}/ondemandvm", json=body, headers=_token(redis_client, user))
        assert r.status_code == 201, r.text
        record = store.get_request(r.json()["request_id"])
        assert record is not None and record.priority == taken


def test_a_request_larger_than_the_users_whole_quota_is_refused(
    client: TestClient, redis_client: redis.Redis
) -> None:
    alice = _token(redis_client, "alice")
    before = _state(redis_client)
    r = client.post(f"{API}/ondemandvm", json={"pool1": 3}, headers=alice)
    assert r.status_code == 403
    assert r.json() == {
        "ok": False,
        "message": "requested 3 VMs, over the quota of user alice (max_vms 2)",
    }
    assert _state(redis_client) == before
    r = client.post(f"{API}/ondemandvm", json={"pool1": 2}, headers=alice)
    assert r.status_code == 201


def test_a_pool_called_priority_is_a_pool(redis_url: str, redis_client: redis.Redis) -> None:
    config = _config()
    pools = {
        **config.pools,
        "priority": dataclasses.replace(config.pools["pool3"], name="priority"),
    }
    test_client, _ = make_client(dataclasses.replace(config, pools=pools), redis_url)
    with test_client:
        r = test_client.post(
            f"{API}/ondemandvm", json={"priority": 2}, headers=_token(redis_client, "jdoe")
        )
    assert r.status_code == 201
    record = _store(redis_client).get_request(r.json()["request_id"])
    assert record is not None and record.requested == "priority:priority:2"


def _calls(conn: redis.Redis, name: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_a_pending_request_is_read_with_its_place_in_one_snapshot(
    client: TestClient, redis_client: redis.Redis
) -> None:
    """Proves: GET of a pending request reads its record, its VMs and its place in line
    in one script call (one atomic read, one round trip), so a request that moves on
    (turns ready, fails, is deleted) is answered as it is at that one instant, never as
    "pending" without a position; it read the record in a MULTI/EXEC, then the place in
    a second round trip, and a request that moved on between the two was read again."""
    bob = _token(redis_client, "bob")
    rid = client.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=bob).json()["request_id"]
    client.get(f"{API}/ondemandvm/{rid}")  # the script loaded (NOSCRIPT: a second EVALSHA)
    redis_client.config_resetstat()
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 202 and r.json()["position"] == 1, r.json()
    assert (_calls(redis_client, "evalsha"), _calls(redis_client, "multi")) == (1, 0)
    assert _store(redis_client).delete_request(rid, actor="test").ok
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200 and "position" not in r.json(), r.json()
    assert r.json()["message"], r.json()


def test_a_pending_request_shows_where_it_stands(
    client: TestClient, redis_client: redis.Redis
) -> None:
    store = _store(redis_client)
    bob = _token(redis_client, "bob")
    rids = [client.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=bob).json()["request_id"]
            for _ in range(3)]  # fmt: skip
    for i, rid in enumerate(rids):
        body = client.get(f"{API}/ondemandvm/{rid}").json()
        assert (body["position"], body["eta_s"]) == (i + 1, 0.0), body
    # the first gets its VM: being provisioned (0); the others move up
    assert store.reserve_vm(rids[0], name="vm-first", alias="pool3", pool="pool3", template="t",
                            provider="sim", domain=None, actor="test").ok  # fmt: skip
    assert [client.get(f"{API}/ondemandvm/{r}").json()["position"] for r in rids] == [0, 1, 2]
    # parked on its user's quota: a position, no ETA
    assert store.quotas.park(rids[2], QuotaLimits(max_vms=1), actor="test").code == "parked"
    body = client.get(f"{API}/ondemandvm/{rids[2]}").json()
    assert (body["position"], body["eta_s"]) == (2, None)
    assert store.vm_created("vm-first", actor="test").ok
    assert store.vm_ready("vm-first", actor="test").code == "fulfilled"
    ready = client.get(f"{API}/ondemandvm/{rids[0]}").json()
    assert ready["ready"] is True and "position" not in ready and "eta_s" not in ready


def test_a_checkout_over_quota_is_refused_and_counted(
    client: TestClient, redis_client: redis.Redis
) -> None:
    store = _store(redis_client)
    make_ready(store, "pool1", 3)
    alice = _token(redis_client, "alice")
    assert client.post(f"{API}/vm/pool1+pool1", headers=alice).status_code == 200
    before = _state(redis_client)
    r = client.post(f"{API}/vm/pool1", headers=alice)
    assert r.status_code == 403
    assert r.json() == {
        "ok": False,
        "message": "quota exceeded: user alice holds 2 VMs of max_vms 2; 1 more VMs asked,"
        " none handed out",
    }
    assert _state(redis_client) == before  # nothing reserved, nothing counted
    assert client.post(f"{API}/vm/nosuchpool", headers=alice).status_code == 404
    jdoe = _token(redis_client, "jdoe")
    assert client.post(f"{API}/vm/pool1", headers=jdoe).status_code == 200
    assert client.post(f"{API}/vm/pool1", headers=jdoe).status_code == 503  # empty
    metrics = client.get("/metrics").text
    for line in (
        'vmpooler_checkout_total{pool="pool1",type="success"} 2.0',
        'vmpooler_checkout_total{pool="pool1",type="quota"} 1.0',
        'vmpooler_checkout_total{pool="pool1",type="empty"} 1.0',
        'vmpooler_checkout_total{pool="unknown",type="invalid"} 1.0',
        'vmpool_quota_held_vms{user="alice"} 2.0',
        'vmpool_quota_held_vms{user="jdoe"} 1.0',
        'vmpool_quota_held_vms{user="other"} 0.0',
    ):
        assert line in metrics, line


def test_the_service_figures_are_kept_by_the_transitions(
    client: TestClient, redis_client: redis.Redis
) -> None:
    """A request served from a warm pool and one cloned: POST-to-ready by source, the warm
    hit ratio (1 of 2), the ETA's error (each had one), a quota wait per named user."""
    store = _store(redis_client)
    make_ready(store, "pool1", 1)
    jdoe = _token(redis_client, "jdoe")
    warm = client.post(f"{API}/ondemandvm", json={"pool1": 1}, headers=jdoe).json()["request_id"]
    fresh = client.post(f"{API}/ondemandvm", json={"pool3": 1}, headers=jdoe).json()["request_id"]
    assert store.pools.claim_for_request(warm, ["pool1"], actor="test").code == "fulfilled"
    assert store.reserve_vm(fresh, name="vm-fresh", alias="pool3", pool="pool3", template="t",
                            provider="sim", domain=None, actor="test").ok  # fmt: skip
    assert store.vm_created("vm-fresh", actor="test").ok
    assert store.vm_ready("vm-fresh", actor="test").code == "fulfilled"
    for rid, user in (("waits-a", "alice"), ("waits-b", "carol")):
        r = client.post(f"{API}/ondemandvm", json={"pool1": 1, "request_id": rid},
                        headers=_token(redis_client, user))  # fmt: skip
        assert r.status_code == 201
        assert store.quotas.park(rid, QuotaLimits(max_vms=0), actor="test").code == "parked"
    metrics = client.get("/metrics").text
    for line in (
        'vmpool_request_ready_seconds_count{source="warm"} 1.0',
        'vmpool_request_ready_seconds_count{source="fresh"} 1.0',
        "vmpool_warm_hit_ratio 0.5",
        "vmpool_eta_error_seconds_count 2.0",
        'vmpool_quota_waits_total{user="alice"} 1.0',
        'vmpool_quota_waits_total{user="other"} 1.0',
        'vmpool_quota_waits_total{user="jdoe"} 0.0',
        "vmpool_requests_waiting_for_quota 2.0",
    ):
        assert line in metrics, line

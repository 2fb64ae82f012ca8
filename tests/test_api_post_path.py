"""POST /ondemandvm's path with the fleet's batching dispatcher: the create,
the work-set add and the lane check in one round trip, without weakening what a POST
guarantees (the request and its queue entries in one unit, its provisioning started)."""

from __future__ import annotations

import json

import redis
from fastapi.testclient import TestClient

from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from vmpool.state.workset import WorkSet
from workers.batching import LANES
from workers.table import job_id

from apihelp import API, drive_ready, make_client, spec_config


def _batched_client(redis_url: str) -> tuple[TestClient, Keys]:
    config = spec_config()
    client, _ = make_client(config, redis_url)
    return client, Keys(config.key_prefix)


def _calls(conn: redis.Redis, name: str) -> int:
    return int(conn.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def test_a_post_is_one_round_trip_and_lands_in_the_work_set(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: with the batching dispatcher a POST sends two scripts in one pipeline
    (create_request, which adds the id to the provision work set in its own unit, and
    the lane check) and nothing else once a lane is live: no SCRIPT EXISTS, no reclaim
    script per lane id (31 commands and three round trips before)."""
    client, keys = _batched_client(redis_url)
    for _ in range(LANES):  # each POST that finds a lane free queues it (ensure_lanes)
        first = client.post(f"{API}/ondemandvm", json={"pool1": 1})
        assert first.status_code == 201, first.text
    for lane in range(LANES):
        jid = job_id(keys, "provision_batch", run=lane)
        assert redis_client.hget(keys.rq_job(jid), "status") == "queued"
    redis_client.config_resetstat()
    r = client.post(f"{API}/ondemandvm", json={"pool1": "2"})
    assert r.status_code == 201, r.text
    rid = json.loads(r.text)["request_id"]
    assert _calls(redis_client, "evalsha") == 2
    assert _calls(redis_client, "script|exists") == 0
    assert _calls(redis_client, "hgetall") == 0
    work = WorkSet(redis_client, keys)
    assert work.size("provision_request") == LANES + 1
    record = Store(redis_client, keys).get_request(rid)
    assert record is not None and record.status == "pending" and record.version == 1
    # served in the order of places: its place in line (vmpool/state/scripts/_line.lua)
    assert redis_client.zscore(keys.work_set("provision_request"), rid) == record.place


def test_a_post_after_a_script_flush_still_creates_and_dispatches(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: the pipelined path loads a script the server lost (NOSCRIPT: the call did
    not run) and runs it, so a Redis restart or SCRIPT FLUSH costs no POST."""
    client, keys = _batched_client(redis_url)
    assert client.post(f"{API}/ondemandvm", json={"pool1": 1}).status_code == 201
    redis_client.script_flush()
    r = client.post(f"{API}/ondemandvm", json={"pool1": 1})
    assert r.status_code == 201, r.text
    rid = json.loads(r.text)["request_id"]
    assert redis_client.zscore(keys.work_set("provision_request"), rid) is not None
    assert Store(redis_client, keys).get_request(rid) is not None
    dup = client.post(f"{API}/ondemandvm", json={"pool1": 1, "request_id": rid})
    assert dup.status_code == 409


def test_create_request_adds_to_the_work_set_only_when_it_creates(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: create_request.lua's optional work-set key gets the id in the unit that
    creates the request, claimable at once, at its place in line (fair share between
    users is in the place, so every request is in the one queue), and a refused create
    (the id exists) adds nothing and leaves a claimed entry alone."""
    store = Store(redis_client, keys)
    work_set = keys.work_set("provision_request")
    settings = RequestSettings(ttl_s=60)
    slots = [Slot("a", "a", 1)]
    out = store.create_request("r1", slots, settings, actor="t", token_user="ann",
                               work_set=work_set)  # fmt: skip
    assert out.ok
    place = store.get_request("r1").place  # type: ignore[union-attr]
    assert redis_client.zscore(work_set, "r1") == place
    assert redis_client.zscore(keys.work_queue("provision_request", ""), "r1") == place
    assert redis_client.zscore(keys.work_queue("provision_request", "ann"), "r1") is None
    work = WorkSet(redis_client, keys)
    claim = work.claim("provision_request", 5, lease_s=60)  # claimed by a batch job
    assert claim.subjects == ["r1"]
    again = store.create_request("r1", slots, settings, actor="t", work_set=work_set)
    assert (again.ok, again.code) == (False, "exists")
    assert work.claim("provision_request", 5, lease_s=60).subjects == []  # still claimed
    assert work.done("provision_request", claim, ["r1"]) == 1
    assert store.create_request("r2", slots, settings, actor="t").ok
    assert not store.create_request("r2", slots, settings, actor="t", work_set=work_set).ok
    assert redis_client.zscore(work_set, "r2") is None


def test_a_get_reads_in_pipelines_not_a_round_trip_per_key(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: GET /ondemandvm/<id> of a ready request reads the record, its VM set and
    every VM's hash once, in one script call (request_place.lua: no MULTI/EXEC, no
    pipeline of the VMs after it; the VM set was read twice before); GET /vm/<host> is
    one pipeline of the VM's hash and the server's time. The answers are vmpooler's,
    unchanged."""
    client, keys = _batched_client(redis_url)
    r = client.post(f"{API}/ondemandvm", json={"pool1": 2, "poolone": 1})
    rid = json.loads(r.text)["request_id"]
    names = drive_ready(Store(redis_client, keys), rid)
    client.get(f"{API}/ondemandvm/{rid}")  # the script loaded (NOSCRIPT: sent again)
    redis_client.config_resetstat()
    r = client.get(f"{API}/ondemandvm/{rid}")
    assert r.status_code == 200 and r.json()["ready"] is True, r.text
    hosts = sorted(h for alias in ("pool1", "poolone") for h in r.json()[alias]["hostname"])
    assert hosts == sorted(f"{n}.example.com" for n in names)
    assert _calls(redis_client, "smembers") == 1
    assert _calls(redis_client, "hgetall") == 1 + len(names)
    assert (_calls(redis_client, "exec"), _calls(redis_client, "evalsha")) == (0, 1)
    redis_client.config_resetstat()
    r = client.get(f"{API}/vm/{names[0]}.example.com")
    assert r.status_code == 200 and names[0] in r.json(), r.text
    assert (_calls(redis_client, "hgetall"), _calls(redis_client, "time")) == (1, 1)
    assert client.get(f"{API}/vm/nosuchvm").status_code == 404

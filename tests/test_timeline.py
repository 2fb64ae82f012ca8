"""Each request's and VM's timeline (vmpool/state/timeline.py): GET
/api/v3/ondemandvm/<id>/timeline, GET /api/v3/vm/<hostname>/timeline and `vmpool request
history`, one reader of the audit trails. In-process fleet, real Redis, simulated cloud."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
import yaml

from vmpool import lifecycle

from apihelp import API, HOSTILE_IDS, make_client
from clihelp import run
from dashhelp import filled, three_pools, three_pools_data
from lifecyclehelp import run_dispatched


def steps(timeline: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [(e["entity"].split(":")[0], e["from"], e["to"]) for e in timeline]


def test_a_request_made_ready_and_deleted_lists_its_transitions_in_order(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """The acceptance: created, provisioned (a ready VM of the warm pool, with its own
    life: reserved, created at the provider, ready), ready, deleted, destroyed at the
    provider, in that order, each with a server timestamp and its actor; the provider
    calls named."""
    config = three_pools()
    fleet = filled(redis_client, config)
    client, _ = make_client(config, redis_url)
    rid = client.post(f"{API}/ondemandvm", json={"debian-11": 1}).json()["request_id"]
    lifecycle.provision_request(fleet, rid)
    run_dispatched(fleet)
    assert client.get(f"{API}/ondemandvm/{rid}").json()["ready"] is True
    assert client.delete(f"{API}/ondemandvm/{rid}").json() == {"ok": True}
    lifecycle.destroy_sweep(fleet)  # the API dispatches nothing: the sweep finds the VM
    run_dispatched(fleet)
    got = client.get(f"{API}/ondemandvm/{rid}/timeline")
    assert got.status_code == 200
    body = got.json()
    assert body["ok"] is True and body["request_id"] == rid
    timeline = body["timeline"]
    request_steps = [s for s in steps(timeline) if s[0] == "request"]
    assert request_steps == [
        ("request", "none", "pending"),
        ("request", "pending", "ready"),
        ("request", "ready", "deleted"),
    ]
    times = [e["time"] for e in timeline]
    assert times == sorted(times) and all(t > 1.6e9 for t in times)
    # the warm pool lent a ready VM (ondemand_from_ready): its life in the pool (its own
    # trail) comes first, then the request's entries about it
    vm_steps = [s[1:] for s in steps(timeline) if s[0] == "vm"]
    assert vm_steps == [
        ("none", "reserved"),
        ("reserved", "pending"),
        ("pending", "ready"),
        ("ready", "running"),
        ("running", "completed"),
        ("completed", "destroyed"),
    ]
    calls = [e["provider_call"] for e in timeline if e["provider_call"]]
    assert calls == ["create", "ready_check", "destroy"]
    assert not any(e["error"] for e in timeline)
    assert {e["actor"].split(":")[0].split("/")[0] for e in timeline} <= {"api", "worker"}


def test_a_failed_request_shows_the_providers_error(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Of a request that failed: the failed create with the provider's error text, and
    the request's failure, both marked as errors."""
    config = three_pools()
    fleet = filled(redis_client, config)
    client, _ = make_client(config, redis_url)
    rid = client.post(f"{API}/ondemandvm", json={"broken": 1}).json()["request_id"]
    lifecycle.provision_request(fleet, rid)
    run_dispatched(fleet)
    timeline = client.get(f"{API}/ondemandvm/{rid}/timeline").json()["timeline"]
    errors = [e for e in timeline if e["error"]]
    assert [(e["entity"].split(":")[0], e["provider_call"]) for e in errors] == [
        ("vm", "create"),
        ("request", None),
    ]
    assert all("template 'missing' not found" in e["reason"] for e in errors)
    vm = errors[0]["entity"].split(":", 1)[1]
    of_vm = client.get(f"{API}/vm/{vm}.example.com/timeline").json()
    assert of_vm["hostname"] == vm
    assert steps(of_vm["timeline"]) == [
        ("vm", "none", "reserved"),
        ("vm", "reserved", "completed"),
        ("vm", "completed", "destroyed"),
    ]


def test_a_warm_vm_shows_its_life_in_the_pool(redis_url: str, redis_client: redis.Redis) -> None:
    """A VM made for a warm pool: its own trail (reserved for the pool, created at the
    provider, ready in the pool), with the provider calls named."""
    config = three_pools()
    fleet = filled(redis_client, config)
    (vm,) = fleet.store.pool_vms("centos", "ready")
    client, _ = make_client(config, redis_url)
    timeline = client.get(f"{API}/vm/{vm}/timeline").json()["timeline"]
    assert steps(timeline) == [
        ("vm", "none", "reserved"),
        ("vm", "reserved", "pending"),
        ("vm", "pending", "ready"),
    ]
    assert [e["provider_call"] for e in timeline] == [None, "create", "ready_check"]


def test_bad_and_unknown_ids_are_4xx_json(redis_url: str, redis_client: redis.Redis) -> None:
    """A malformed id or hostname: 400 naming the problem; an unknown one: 404; nothing
    written either way."""
    client, _ = make_client(three_pools(), redis_url)
    for rid in (h for h in HOSTILE_IDS if isinstance(h, str) and h):
        path = quote(rid, safe="", errors="surrogatepass")
        for route in (f"{API}/ondemandvm/{path}/timeline", f"{API}/vm/{path}/timeline"):
            got = client.get(route)
            assert 400 <= got.status_code < 500, (rid, got.status_code, got.text)
            assert got.json()["ok"] is False
    bad = client.get(f"{API}/ondemandvm/{quote('a b')}/timeline")
    assert bad.status_code == 400 and "request_id must be" in bad.json()["message"]
    unknown = client.get(f"{API}/ondemandvm/no-such-request/timeline")
    assert unknown.status_code == 404
    assert unknown.json()["message"] == "no request found for request_id 'no-such-request'"
    assert client.get(f"{API}/vm/no-such-vm/timeline").status_code == 404
    assert client.get(f"{API}/vm/10.9.8.7/timeline").status_code == 404
    assert redis_client.dbsize() == 0


def test_vmpool_request_history_shows_the_same_entries(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """One reader: the CLI's --json is the API's timeline, entry for entry."""
    config = three_pools()
    fleet = filled(redis_client, config)
    client, _ = make_client(config, redis_url)
    rid = client.post(f"{API}/ondemandvm", json={"broken": 1}).json()["request_id"]
    lifecycle.provision_request(fleet, rid)
    run_dispatched(fleet)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(three_pools_data()))
    cli = run("request", "history", rid, "--json", "--config", str(path), "--redis-url", redis_url)
    assert cli.exit_code == 0, cli.output
    api = client.get(f"{API}/ondemandvm/{rid}/timeline").json()["timeline"]
    assert json.loads(cli.stdout) == api
    table = run("request", "history", rid, "--config", str(path), "--redis-url", redis_url)
    assert "! create failed: simulated provider 'sim': template 'missing'" in table.stdout

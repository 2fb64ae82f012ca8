"""A replay of vmfloaty's exact calls for ``floaty token get`` and
``floaty get pool1=2 --ondemand`` (puppetlabs/vmfloaty, lib/vmfloaty/pooler.rb and
http.rb): Faraday with ``request :url_encoded``, relative paths under the service URL,
X-AUTH-TOKEN on the POST, GET polled without a token until 200, then the hostnames as
``standardize_hostnames`` reads them. The request is driven to ready through the store's
transitions, as the workers would (no workers run in this test)."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis

from vmpool.lifecycle import Fleet, RecordingDispatcher, vm_task
from vmpool.providers.simulated import SimulatedProvider
from vmpool.state.store import Store

from apihelp import PASSWORD, drive_ready, make_client, spec_config, store_for

FORM = {"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "Faraday v2.9.0"}


def standardize_hostnames(body: dict[str, Any]) -> dict[str, list[str]]:
    """vmfloaty's Utils.standardize_hostnames for a v3 on-demand response."""
    domain = body.get("domain")
    out: dict[str, list[str]] = {}
    for os_name, value in body.items():
        if os_name in ("ok", "request_id", "ready", "domain", "message"):
            continue
        hosts = value["hostname"]
        hosts = hosts if isinstance(hosts, list) else [hosts]
        out[os_name] = [f"{h}.{domain}" if domain else h for h in hosts]
    return out


def test_floaty_get_ondemand(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = spec_config(auth=True)
    client, _ = make_client(cfg, redis_url)
    base = "/api/v3/"

    # floaty token get: POST token with basic auth (url_encoded, empty body).
    creds = base64.b64encode(f"jdoe:{PASSWORD}".encode()).decode()
    r = client.post(base + "token", headers={**FORM, "Authorization": f"Basic {creds}"})
    assert r.status_code == 200
    token = r.json()["token"]

    # floaty get pool1=2 --ondemand: os_string "pool1+pool1".
    r = client.post(base + "ondemandvm/pool1+pool1", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 201
    body = r.json()
    assert body["ok"] is True
    request_id = body["request_id"]

    # Polling: 202 while pending (vmfloaty prints progress and waits).
    store = store_for(redis_client, cfg)
    polls = 0
    names: list[str] = []
    while True:
        r = client.get(base + f"ondemandvm/{request_id}", headers={"User-Agent": "Faraday"})
        polls += 1
        assert polls < 10
        if r.status_code == 200:
            break
        assert r.status_code == 202
        assert r.json()["pool1"] == {"ready": "0", "pending": "2"}
        names = drive_ready(store, request_id)  # the fleet's work
    hosts = standardize_hostnames(r.json())
    assert sorted(hosts["pool1"]) == sorted(f"{n}.example.com" for n in names)
    assert len(hosts["pool1"]) == 2

    # floaty delete <request_id>: DELETE ondemandvm/<id> with the token.
    r = client.delete(base + f"ondemandvm/{request_id}", headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 200 and r.json() == {"ok": True}


# -- every other command, with warm pools (vmfloaty's lib/vmfloaty/pooler.rb) ----------------


def warm(store: Store, pool: str, n: int) -> list[str]:
    """n ready VMs in ``pool``, made through the store's transitions (as top-up would)."""
    names = []
    base = len(store.pool_vms(pool, "ready")) + len(store.pool_vms(pool, "running"))
    for i in range(n):
        name = f"{pool}-warm-{base + i}"
        out = store.pools.reserve_pool_vm(
            name,
            pool=pool,
            template=pool,
            provider="simulated",
            domain="example.com",
            size=base + n,
            data_ttl_s=3600,
            actor="test",
        )
        assert out.ok, out
        assert store.vm_created(name, actor="test").code == "pending"
        assert store.vm_ready(name, actor="test").code == "ready"
        names.append(name)
    return names


def floaty_token(client: Any, user: str = "jdoe") -> str:
    creds = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
    r = client.post("/api/v3/token", headers={**FORM, "Authorization": f"Basic {creds}"})
    assert r.status_code == 200
    return str(r.json()["token"])


def test_floaty_every_command(redis_url: str, redis_client: redis.Redis) -> None:
    """Replays vmfloaty's exact calls for list, get (checkout), list --active, query,
    modify --lifetime/--tags/--disk, delete, status, summary, token status, snapshot and
    revert, and checks what vmfloaty reads from each answer (it prints ``{"ok"=>false}`` and
    exits 0 on a 404, so the bodies are what matters)."""
    cfg = spec_config(auth=True)
    client, _ = make_client(cfg, redis_url)
    store = store_for(redis_client, cfg)
    base = "/api/v3/"
    token = floaty_token(client)
    warm(store, "pool1", 2)
    warm(store, "pool3", 1)

    # floaty list: GET vm -> the pool names (vmfloaty filters them with a regexp)
    r = client.get(base + "vm", headers={"User-Agent": "Faraday"})
    assert r.status_code == 200 and r.json() == ["pool1", "pool2", "pool3"]

    # floaty get pool1=2 pool3: POST vm/pool1+pool1+pool3, no body, the token
    r = client.post(base + "vm/pool1+pool1+pool3", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is True and list(body) == ["ok", "pool1", "pool3"]
    assert len(body["pool1"]["hostname"]) == 2 and isinstance(body["pool3"]["hostname"], str)
    host = body["pool3"]["hostname"]
    assert host.endswith(".example.com")
    short = host.split(".")[0]

    # floaty get pool3 again: the pool is empty now -> 503 {"ok": false}, nothing handed out
    r = client.post(base + "vm/pool3", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 503 and r.json() == {"ok": False}
    # an unknown pool: 404
    r = client.post(base + "vm/nosuch", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 404 and r.json() == {"ok": False}

    # floaty list --active / token status: GET token/<t> -> short names of its VMs
    r = client.get(base + f"token/{token}")
    assert r.status_code == 200
    entry = r.json()[token]
    assert entry["user"] == "jdoe"
    assert sorted(entry["vms"]["running"]) == sorted(
        [h.split(".")[0] for h in body["pool1"]["hostname"]] + [short]
    )

    # floaty query <host>: GET vm/<host> (full or short name)
    r = client.get(base + f"vm/{host}")
    assert r.status_code == 200
    vm = r.json()[short]
    assert vm["template"] == "pool3" and vm["state"] == "running"
    assert vm["lifetime"] == 2  # vm_lifetime_auth
    for key in ("running", "remaining", "start_time", "end_time", "ip"):
        assert key in vm
    assert client.get(base + "vm/nosuch-host").json() == {"ok": False}

    # floaty modify <host> --lifetime 12 --tags '{"project":"x"}': PUT, JSON body
    # labelled as a form
    put = {"lifetime": 12, "tags": {"project": "x"}}
    r = client.put(
        base + f"vm/{short}", content=json.dumps(put), headers={**FORM, "X-AUTH-TOKEN": token}
    )
    assert r.status_code == 200 and r.json() == {"ok": True}
    vm = client.get(base + f"vm/{short}").json()[short]
    assert vm["lifetime"] == 12 and vm["tags"] == {"project": "x"}
    r = client.put(
        base + f"vm/{short}",
        content=json.dumps({"lifetime": 0}),
        headers={**FORM, "X-AUTH-TOKEN": token},
    )
    assert r.status_code == 400 and r.json()["failure"] == [
        "Lifetime must be a positive integer (got 0)"
    ]

    # another user may neither modify nor give back jdoe's VM (vmpool's stricter rule)
    other = floaty_token(client, "alice")
    r = client.delete(base + f"vm/{short}", headers={"X-AUTH-TOKEN": other})
    assert r.status_code == 403 and r.json()["ok"] is False

    # floaty delete <host>: DELETE vm/<host>, one call per host
    r = client.delete(base + f"vm/{short}", headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 200 and r.json() == {"ok": True}
    r = client.delete(base + f"vm/{short}", headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 404 and r.json() == {"ok": False}
    assert client.get(base + f"vm/{short}").json()[short]["state"] == "destroyed"

    # floaty status: GET status -> vmpooler's keys, ready counts
    r = client.get(base + "status")
    status = r.json()
    assert status["pools"]["pool1"]["ready"] == 0 and status["queue"]["ready"] == 0
    assert {"capacity", "queue", "pools", "status"} <= set(status)

    # floaty summary: GET summary -> today's boots (3 warm VMs), clones and the tag set
    r = client.get(base + "summary")
    summary = r.json()
    assert r.status_code == 200 and list(summary) == ["daily", "boot", "clone", "tag"]
    assert summary["boot"]["count"]["total"] == 3
    assert summary["clone"]["count"]["total"] == 3
    assert summary["boot"]["count"]["pool"] == {"pool1": {"total": 2}, "pool3": {"total": 1}}
    assert summary["tag"] == {"project": {"x": 1, "total": 1}}

    # floaty snapshot <host> / revert <host> <sha> / modify <host> --disk 10, on a VM
    # jdoe still holds; the vm_task job (run here as a worker would) does the work
    held = body["pool1"]["hostname"][0]
    held_short = held.split(".")[0]
    fleet = Fleet.build(redis_client, cfg, RecordingDispatcher(), "worker:test")
    sim = fleet.providers["simulated"]
    assert isinstance(sim, SimulatedProvider)
    sim.leak_vm("pool1", "pool1", held_short)  # the simulated cloud's copy of the VM
    r = client.post(base + f"vm/{held}/snapshot", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 202
    sha = r.json()[held_short]["snapshot"]
    assert len(sha) == 32 and list(r.json()) == ["ok", held_short]
    assert "snapshots" not in client.get(base + f"vm/{held}").json()[held_short]  # pending
    assert vm_task(fleet, f"{held_short}:snapshot:{sha}") == "done"
    assert client.get(base + f"vm/{held}").json()[held_short]["snapshots"] == [sha]
    r = client.post(base + f"vm/{held}/snapshot/{sha}", headers={**FORM, "X-AUTH-TOKEN": token})
    assert r.status_code == 202 and r.json() == {"ok": True}
    revert_field = next(k for k in redis_client.hkeys(store.keys.vm(held_short))
                        if k.startswith("task:revert:"))  # fmt: skip
    assert vm_task(fleet, f"{held_short}:revert:{revert_field.rsplit(':', 1)[1]}") == "done"
    assert sim.annotations(held_short)["reverted_to"] == f"snapshot:{sha}"
    r = client.post(base + f"vm/{held}/snapshot/nosuchsnapshot",
                    headers={**FORM, "X-AUTH-TOKEN": token})  # fmt: skip
    assert r.status_code == 404 and r.json() == {"ok": False}
    r = client.put(base + f"vm/{held}", content=json.dumps({"disk": 10}),
                   headers={**FORM, "X-AUTH-TOKEN": token})  # fmt: skip
    assert r.status_code == 200 and r.json() == {"ok": True}
    disk_field = next(k for k in redis_client.hkeys(store.keys.vm(held_short))
                      if k.startswith("task:disk:"))  # fmt: skip
    assert vm_task(fleet, f"{held_short}:disk:{disk_field.rsplit(':', 1)[1]}") == "done"
    assert client.get(base + f"vm/{held}").json()[held_short]["disk"] == ["+10gb"]
    # another user may not snapshot jdoe's VM
    r = client.post(base + f"vm/{held}/snapshot", headers={**FORM, "X-AUTH-TOKEN": other})
    assert r.status_code == 403 and r.json()["ok"] is False


def test_floaty_delete_of_an_ondemand_vm(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: ``floaty delete <host>`` of a VM of a ready on-demand request gives back
    that VM only; the request stays ready and GET ondemandvm/<id> lists it still (as
    vmpooler does: the host stays in the request's set)."""
    cfg = spec_config(auth=True)
    client, _ = make_client(cfg, redis_url)
    store = store_for(redis_client, cfg)
    token = floaty_token(client)
    r = client.post("/api/v3/ondemandvm/pool3+pool3", headers={**FORM, "X-AUTH-TOKEN": token})
    rid = r.json()["request_id"]
    names = drive_ready(store, rid)
    r = client.delete(f"/api/v3/vm/{names[0]}.example.com", headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 200 and r.json() == {"ok": True}
    r = client.get(f"/api/v3/ondemandvm/{rid}")
    assert r.status_code == 200 and r.json()["ready"] is True
    assert sorted(r.json()["pool3"]["hostname"]) == sorted(f"{n}.example.com" for n in names)
    record = store.get_request(rid)
    assert record is not None and record.status == "ready"

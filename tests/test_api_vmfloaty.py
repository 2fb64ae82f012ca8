"""A replay of vmfloaty's exact calls for ``floaty token get`` and
``floaty get pool1=2 --ondemand`` (puppetlabs/vmfloaty, lib/vmfloaty/pooler.rb and
http.rb): Faraday with ``request :url_encoded``, relative paths under the service URL,
X-AUTH-TOKEN on the POST, GET polled without a token until 200, then the hostnames as
``standardize_hostnames`` reads them. The request is driven to ready through the store's
transitions, as the workers would (no workers run in this test)."""

from __future__ import annotations

import base64
from typing import Any

import redis
from test_api_support import PASSWORD, drive_ready, make_client, spec_config, store_for

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

"""vmpooler's dashboard endpoints and vmpool's live feed (vmpool/api/routers/dashboard.py,
vmpool/api/dashboard_data.py), through the API app against a real Redis, the fleet's
state made by the lifecycle in-process (simulated provider)."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from vmpool import lifecycle
from vmpool.config import parse_config
from vmpool.state.history import Point, minute_of, write_points

from apihelp import API, PASSWORD_HASH, make_client
from dashhelp import filled, three_pools
from lifecyclehelp import make_fleet, run_dispatched


def test_root_redirects_to_the_page_which_names_the_site(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler's `/` -> 302 /dashboard/; the page is 200 with :config: site_name (its
    HTML tags dropped, the rest escaped), its own script and style, and a policy that
    allows nothing from elsewhere."""
    client, _ = make_client(three_pools(site_name="<b>ACME</b> & co"), redis_url)
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 302 and root.headers["location"] == "/dashboard/"
    page = client.get("/dashboard/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<h1 id="site-name">ACME &amp; co</h1>' in page.text
    assert "<b>" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = client.get(f"/dashboard/assets/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(media)
        assert f"/dashboard/assets/{name}" in page.text
    missing = client.get("/dashboard/assets/..%2fapp.py")
    assert missing.status_code == 404 and missing.json() == {"ok": False}


def test_pool_stats_have_vmpoolers_shape_and_history(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """``{"<pool>": {"size": N, "ready": N}}``; with ?history=1 a ``history`` of ready
    counts written by the record_history job (one point a minute)."""
    config = three_pools()
    fleet = filled(redis_client, config)
    client, _ = make_client(config, redis_url)
    plain = client.get("/dashboard/stats/vmpooler/pool")
    assert plain.status_code == 200
    assert plain.json() == {
        "debian-12": {"size": 3, "ready": 3},
        "debian-11": {"size": 2, "ready": 2},
        "centos": {"size": 1, "ready": 1},
        "broken": {"size": 0, "ready": 0},
    }
    assert all(
        v["history"] == []
        for v in client.get("/dashboard/stats/vmpooler/pool?history=1").json().values()
    )
    lifecycle.record_history(fleet)
    with_history = client.get("/dashboard/stats/vmpooler/pool?history=1").json()
    assert with_history["debian-12"] == {"size": 3, "ready": 3, "history": [3]}
    assert with_history["centos"]["history"] == [1]


def test_running_groups_pools_by_the_name_before_the_first_dash(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """vmpooler's ``{"<major>": {"running": N}}``: debian-12 and debian-11 add up under
    debian; ?history=1 adds the group's running counts."""
    config = three_pools()
    fleet = filled(redis_client, config)
    client, _ = make_client(config, redis_url)
    for pool in ("debian-12", "debian-11", "centos"):
        assert client.post(f"{API}/vm/{pool}").status_code == 200
    assert client.get("/dashboard/stats/vmpooler/running").json() == {
        "debian": {"running": 2},
        "centos": {"running": 1},
        "broken": {"running": 0},
    }
    lifecycle.record_history(fleet)
    running = client.get("/dashboard/stats/vmpooler/running?history=1").json()
    assert running["debian"] == {"running": 2, "history": [2]}


def test_the_live_feed_shows_pools_requests_failures_and_rates(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """The page's feed: each pool's counts and failures, the open requests with their
    age, a failed request's reason in the latest failures, VMs created per minute."""
    config = three_pools()
    fleet = make_fleet(redis_client, config)
    before = minute_of(fleet.store.server_time()) - 1  # a point, empty, the minute before
    write_points(
        redis_client, fleet.keys, [(p, Point(before, 0, 0, 0, 0, 0, 0)) for p in config.pools]
    )
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    lifecycle.record_history(fleet)
    client, _ = make_client(config, redis_url)
    failed = client.post(f"{API}/ondemandvm", json={"broken": 1}).json()["request_id"]
    lifecycle.provision_request(fleet, failed)
    run_dispatched(fleet)
    waiting = client.post(f"{API}/ondemandvm", json={"centos": 3}).json()["request_id"]
    feed = client.get("/dashboard/stats/vmpool/live").json()
    pools = {p["name"]: p for p in feed["pools"]}
    assert pools["debian-12"] | {"history": None, "failures": None} == {
        "name": "debian-12", "size": 3, "ready": 3, "pending": 0, "running": 0,
        "history": None, "failures": None,
    }  # fmt: skip
    # a minute may turn between two reads: the series' ends are what is certain
    history = pools["debian-12"]["history"]
    assert history[0] == 0 and history[-1] == 3 and len(history) in (2, 3)
    assert pools["broken"]["failures"]["failing"] is True
    assert "template 'missing' not found" in pools["broken"]["failures"]["last_error"]
    assert feed["requests"]["open"] == 1
    (shown,) = feed["requests"]["shown"]
    assert shown["request_id"] == waiting and shown["pools"] == {"centos": {"want": 3, "ready": 0}}
    assert 0 <= shown["age_s"] < 60
    (failure,) = feed["failures"]
    assert failure["request_id"] == failed and failure["kind"] == "create"
    assert "not found" in failure["reason"]
    rates = feed["rates"]
    assert rates["minutes"] == 60 and sum(rates["created"]) == 6 == rates["created"][0]
    assert sum(rates["destroyed"]) == 0


def test_every_dashboard_read_works_without_a_token_when_auth_is_on(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Read-only and public, as vmpooler's: 200 without X-AUTH-TOKEN, and nothing in
    them names a user; a write still needs the token."""
    config = three_pools(auth=True)
    filled(redis_client, config)
    client: TestClient = make_client(config, redis_url)[0]
    for path in (
        "/dashboard/",
        "/dashboard/assets/dashboard.js",
        "/dashboard/stats/vmpooler/pool?history=1",
        "/dashboard/stats/vmpooler/running?history=1",
        "/dashboard/stats/vmpool/live",
    ):
        got = client.get(path)
        assert got.status_code == 200, (path, got.text)
        assert "jdoe" not in got.text and PASSWORD_HASH not in got.text
    assert client.post(f"{API}/ondemandvm", json={"centos": 1}).status_code == 401


def test_site_name_comes_from_the_file_or_vmpoolers_variable() -> None:
    """`:config: site_name` (vmpooler's key, no longer ignored), `SITE_NAME` over it as
    vmpooler reads it, `vmpool` without either."""
    pools = {":pools": [{"name": "p"}]}
    assert parse_config(pools, source="t", env={}).site_name == "vmpool"
    named = {**pools, ":config": {"site_name": "<b>vmpooler</b>"}}
    assert parse_config(named, source="t", env={}).site_name == "<b>vmpooler</b>"
    assert parse_config(named, source="t", env={"SITE_NAME": "Lab"}).site_name == "Lab"

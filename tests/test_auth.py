"""Auth: password hashes, tokens (stored hashed), X-AUTH-TOKEN, ownership, rate limit."""

from __future__ import annotations

import base64
import hashlib

import pytest
import redis
from fastapi.testclient import TestClient

from vmpool.config import parse_config
from vmpool.state.keys import Keys
from vmpool.state.tokens import (
    TokenStore,
    check_rate_limit,
    generate_token,
    hash_password,
    token_sha256,
    verify_password,
)

from apihelp import (
    API,
    PASSWORD,
    make_client,
    pretty,
    snapshot,
    spec_config,
    store_for,
)

REALM = 'Basic realm="Authentication required"'


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


@pytest.fixture
def client(redis_url: str, redis_client: redis.Redis) -> TestClient:
    c, _ = make_client(spec_config(auth=True), redis_url)
    return c


def mint(client: TestClient, user: str = "jdoe") -> str:
    r = client.post(f"{API}/token", headers=basic(user, PASSWORD))
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["ok", "token"] and body["ok"] is True
    return str(body["token"])


# -- hashes and tokens ---------------------------------------------------------------------


def test_password_hashes() -> None:
    h = hash_password("pw", iterations=1000, salt="abc")
    assert h.startswith("pbkdf2_sha256$1000$abc$")
    assert verify_password("pw", h)
    assert not verify_password("pW", h)
    assert verify_password("pw", hash_password("pw", iterations=1000))
    plain = "sha256$s$" + hashlib.sha256(b"s" + b"pw").hexdigest()
    assert verify_password("pw", plain) and not verify_password("px", plain)
    for bad in ["", "pw", "md5$x$y", "pbkdf2_sha256$x$y$z", "pbkdf2_sha256$0$s$00", "sha256$$"]:
        assert not verify_password("pw", bad)
    # The loader accepts what hash_password writes.
    cfg = parse_config({"auth": {"users": {"u": h}}}, source="t", env={})
    assert cfg.auth is not None and cfg.auth.users["u"] == h


def test_tokens_look_like_vmpoolers() -> None:
    tokens = {generate_token() for _ in range(200)}
    assert len(tokens) == 200
    for t in tokens:
        assert len(t) == 32 and t[0].isalpha() and t.isalnum() and t == t.lower()


def test_token_store(redis_client: redis.Redis) -> None:
    keys = Keys("vmpool")
    store = TokenStore(redis_client, keys)
    token = store.create("jdoe")
    sha = token_sha256(token)
    assert redis_client.hget(keys.token(sha), "user") == "jdoe"
    assert not list(redis_client.scan_iter(match=f"*{token}*"))
    info = store.lookup(token)
    assert info is not None and info.user == "jdoe"
    assert redis_client.hget(keys.token(sha), "last") != ""
    assert store.lookup("x" * 32) is None
    assert not store.revoke(token, user="alice")
    assert store.revoke(token, user="jdoe")
    assert store.lookup(token) is None
    assert not redis_client.exists(keys.token(sha))  # a lookup does not recreate it


def test_rate_limit_counter(redis_client: redis.Redis) -> None:
    keys = Keys("vmpool")
    decisions = [check_rate_limit(redis_client, keys, "abc", 3) for _ in range(5)]
    assert [d.allowed for d in decisions[:3]] == [True, True, True]
    assert not decisions[3].allowed and not decisions[4].allowed
    assert 1 <= decisions[4].retry_after <= 60 and decisions[4].period == 60


# -- the API with auth on --------------------------------------------------------------------


def test_post_without_or_with_a_bad_token_is_401(client: TestClient, redis_url: str) -> None:
    before = snapshot(redis_url)
    for headers in [{}, {"X-AUTH-TOKEN": "nope"}, {"X-AUTH-TOKEN": ""}]:
        for r in [
            client.post(f"{API}/ondemandvm", content='{"pool1":"1"}', headers=headers),
            client.post(f"{API}/ondemandvm/pool1", headers=headers),
            client.delete(f"{API}/ondemandvm/abc", headers=headers),
        ]:
            assert r.status_code == 401
            assert r.text == pretty({"ok": False})
            assert r.headers["www-authenticate"] == REALM
    assert snapshot(redis_url) == before


def test_token_from_basic_auth_and_request_records_its_user(
    client: TestClient, redis_client: redis.Redis
) -> None:
    token = mint(client)
    r = client.post(f"{API}/ondemandvm", content='{"pool1":"1"}', headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 201
    record = store_for(redis_client, spec_config(auth=True)).get_request(r.json()["request_id"])
    assert record is not None
    assert record.token_user == "jdoe"
    assert record.token_hash == token_sha256(token)  # never the token itself
    # GET needs no token.
    assert client.get(f"{API}/ondemandvm/{r.json()['request_id']}").status_code == 202


@pytest.mark.parametrize(
    "headers",
    [
        {},
        basic("jdoe", "wrong"),
        basic("nobody", PASSWORD),
        {"Authorization": "Basic !!!"},
        {"Authorization": "Bearer abc"},
        {"Authorization": "Basic " + base64.b64encode(b"nocolon").decode()},
        {"Authorization": "Basic " + base64.b64encode(b"\xff:\xfe").decode()},
    ],
)
def test_post_token_rejects_bad_credentials(
    client: TestClient, redis_url: str, headers: dict[str, str]
) -> None:
    before = snapshot(redis_url)
    r = client.post(f"{API}/token", headers=headers)
    assert r.status_code == 401
    assert r.text == pretty({"ok": False})
    assert r.headers["www-authenticate"] == REALM
    # Nothing written but the failed-login counts (tests/test_login.py), each with a TTL.
    after = snapshot(redis_url)
    counts = [k for k in after if k.startswith(b"vmpool:login-failures:")]
    assert {k: v for k, v in after.items() if k not in counts} == before
    assert all(0 < redis.Redis.from_url(redis_url).ttl(k) <= 300 for k in counts)


def test_token_routes_without_auth_are_404(redis_url: str, redis_client: redis.Redis) -> None:
    c, _ = make_client(spec_config(), redis_url)
    assert c.post(f"{API}/token", headers=basic("jdoe", PASSWORD)).text == pretty({"ok": False})
    assert c.delete(f"{API}/token/abc").status_code == 404


def test_delete_token(client: TestClient) -> None:
    token = mint(client)
    other = mint(client, "alice")
    # Only the owner's credentials revoke a token.
    assert (
        client.delete(f"{API}/token/{token}", headers=basic("alice", PASSWORD)).status_code == 404
    )
    assert client.delete(f"{API}/token/{token}").status_code == 401
    r = client.delete(f"{API}/token/{token}", headers=basic("jdoe", PASSWORD))
    assert (r.status_code, r.text) == (200, pretty({"ok": True}))
    r = client.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": token})
    assert r.status_code == 401
    assert (
        client.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": other}).status_code == 201
    )


def test_a_token_deletes_only_its_own_users_requests(
    client: TestClient, redis_url: str, redis_client: redis.Redis
) -> None:
    jdoe, alice = mint(client), mint(client, "alice")
    rid = client.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": jdoe}).json()[
        "request_id"
    ]
    store = store_for(redis_client, spec_config(auth=True))
    version = store.get_request(rid).version  # type: ignore[union-attr]
    r = client.delete(f"{API}/ondemandvm/{rid}", headers={"X-AUTH-TOKEN": alice})
    assert r.status_code == 403
    body = r.json()
    assert list(body) == ["ok", "message"] and body["ok"] is False
    record = store.get_request(rid)
    assert record is not None and record.status == "pending" and record.version == version
    # A second token of the same user may delete it.
    jdoe2 = mint(client)
    r = client.delete(f"{API}/ondemandvm/{rid}", headers={"X-AUTH-TOKEN": jdoe2})
    assert (r.status_code, r.text) == (200, pretty({"ok": True}))


def test_rate_limit_429(redis_url: str, redis_client: redis.Redis) -> None:
    c, _ = make_client(spec_config(auth=True, rate_limit=3), redis_url)
    token = mint(c)
    h = {"X-AUTH-TOKEN": token}
    codes = [c.post(f"{API}/ondemandvm/pool1", headers=h).status_code for _ in range(3)]
    assert codes == [201, 201, 201]
    r = c.post(f"{API}/ondemandvm/pool1", headers=h)
    assert r.status_code == 429
    body = r.json()
    assert list(body) == ["ok", "error", "limit", "period", "retry_after"]
    assert body["ok"] is False and body["error"] == "Rate limit exceeded"
    assert body["limit"] == 3 and body["period"] == 60 and 1 <= body["retry_after"] <= 60
    assert r.headers["retry-after"] == str(body["retry_after"])
    # Another user has their own budget (a second token of jdoe does not:
    # tests/test_login.py); GET is not limited.
    other = mint(c, "alice")
    assert c.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": other}).status_code == 201
    assert c.get("/api/v3/status").status_code == 200


def test_dummy_provider_accepts_user_not_equal_password(
    redis_url: str, redis_client: redis.Redis
) -> None:
    cfg = parse_config(
        {"auth": {"provider": "dummy"}, "pools": [{"name": "p"}]}, source="t", env={}
    )
    c, _ = make_client(cfg, redis_url)
    assert c.post(f"{API}/token", headers=basic("joe", "joe")).status_code == 401
    assert c.post(f"{API}/token", headers=basic("joe", "other")).status_code == 200


def test_tokens_and_passwords_never_logged(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    token = mint(client)
    client.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": token})
    client.post(f"{API}/token", headers=basic("jdoe", "wrong-password"))
    assert token not in caplog.text
    assert PASSWORD not in caplog.text and "wrong-password" not in caplog.text


def test_cli_token_create_and_revoke(redis_url: str, redis_client: redis.Redis) -> None:
    from click.testing import CliRunner

    from vmpool.cli.main import cli

    runner = CliRunner()
    r = runner.invoke(cli, ["token", "create", "jdoe", "--redis-url", redis_url])
    assert r.exit_code == 0, r.output
    token = r.stdout.strip()
    assert len(token) == 32
    info = TokenStore(redis_client, Keys("vmpool")).lookup(token, touch=False)
    assert info is not None and info.user == "jdoe"
    c, _ = make_client(spec_config(auth=True), redis_url)
    assert c.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": token}).status_code == 201
    r = runner.invoke(cli, ["token", "revoke", token, "--redis-url", redis_url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["token", "revoke", token, "--redis-url", redis_url])
    assert r.exit_code == 1
    r = runner.invoke(cli, ["token", "create", "jdoe", "--redis-url", "redis://127.0.0.1:1/0"])
    assert r.exit_code == 1 and "Traceback" not in r.output


def test_a_user_name_vmpool_ids_refuses_gets_no_token(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a Basic user name that is not a valid user (vmpool.ids) is a failed login,
    even with the dummy provider that accepts any user whose password differs (before,
    'a\\nb' got a token owned by a name with a newline in it)."""
    cfg = parse_config(
        {"auth": {"provider": "dummy"}, "pools": [{"name": "p"}]}, source="t", env={}
    )
    c, _ = make_client(cfg, redis_url)
    for bad in ("a\nb", "a b", "x" * 200, "-lead"):
        r = c.post(f"{API}/token", headers=basic(bad, "other"))
        assert r.status_code == 401 and r.json() == {"ok": False}, bad
    assert not list(redis_client.scan_iter(match="*:token:*"))

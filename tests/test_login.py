"""Login and "auth never turns off by accident".

- POST /token does the same PBKDF2 work for an unknown user as for a known one;
- failed logins are limited per client address and per user, shared through Redis;
- the rate limit counts per user, not per token;
- tokens expire after ``token_ttl`` and a user's tokens are bounded;
- an ``:auth:`` section present but empty is a config error; auth off on a non-loopback
  address is a warning at start and in /status.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from vmpool.config import Config, ConfigError, load_config, parse_config
from vmpool.state.keys import Keys
from vmpool.state.tokens import TokenStore, token_sha256

from apihelp import API, PASSWORD, PASSWORD_HASH, make_app, make_client, spec_config


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def auth_config(**auth: Any) -> Config:
    section: dict[str, Any] = {
        "provider": "static",
        "users": {"jdoe": PASSWORD_HASH, "alice": PASSWORD_HASH},
        **auth,
    }
    return parse_config({"auth": section, "pools": [{"name": "pool1"}]}, source="t", env={})


class Pbkdf2Counter:
    """Wraps hashlib.pbkdf2_hmac: counts the calls and the iterations they ran."""

    def __init__(self) -> None:
        self.real = hashlib.pbkdf2_hmac
        self.calls = 0
        self.iterations = 0

    def __call__(self, name: str, password: bytes, salt: bytes, iterations: int, *a: Any) -> bytes:
        self.calls += 1
        self.iterations += iterations
        return self.real(name, password, salt, iterations, *a)


# -- the same cost for an unknown user -------------------------------------------------------


def test_unknown_user_runs_the_same_pbkdf2_as_a_known_one(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves a wrong user name costs what a wrong password does: one PBKDF2 with the
    users' iteration count (not time: the work done). Red before the fix: the unknown
    user ran no PBKDF2 at all (the dummy hash was a plain sha256)."""
    c, _ = make_client(auth_config(), redis_url)
    counter = Pbkdf2Counter()
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counter)
    assert c.post(f"{API}/token", headers=basic("jdoe", "wrong")).status_code == 401
    known = (counter.calls, counter.iterations)
    counter.calls = counter.iterations = 0
    assert c.post(f"{API}/token", headers=basic("nobody", "wrong")).status_code == 401
    unknown = (counter.calls, counter.iterations)
    assert known == (1, 1000)
    assert unknown == known


# -- failed logins, limited ------------------------------------------------------------------


def test_failed_logins_per_user_are_limited_and_shared_by_replicas(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Two app instances on one Redis share the per-user count: after the limit on one,
    the other answers 429 with Retry-After, even for the right password."""
    cfg = auth_config(max_failed_logins_per_user=3, max_failed_logins_per_address=100)
    one, _ = make_client(cfg, redis_url)
    two, _ = make_client(cfg, redis_url)
    for client in (one, two, one):
        assert client.post(f"{API}/token", headers=basic("jdoe", "bad")).status_code == 401
    r = two.post(f"{API}/token", headers=basic("jdoe", PASSWORD))
    assert r.status_code == 429
    body = r.json()
    assert body["ok"] is False and body["error"] == "Too many failed logins"
    assert 1 <= int(r.headers["retry-after"]) <= 300
    assert body["retry_after"] == int(r.headers["retry-after"])
    # Another user from the same address is not limited by jdoe's failures.
    assert one.post(f"{API}/token", headers=basic("alice", PASSWORD)).status_code == 200


def test_failed_logins_per_address_are_limited(redis_url: str, redis_client: redis.Redis) -> None:
    """One address guessing many user names is stopped: the per-address count."""
    cfg = auth_config(max_failed_logins_per_user=100, max_failed_logins_per_address=4)
    one, _ = make_client(cfg, redis_url)
    two, _ = make_client(cfg, redis_url)
    for i in range(4):
        client = (one, two)[i % 2]
        assert client.post(f"{API}/token", headers=basic(f"u{i}", "x")).status_code == 401
    r = one.post(f"{API}/token", headers=basic("alice", PASSWORD))
    assert r.status_code == 429 and "retry-after" in r.headers
    # The counters expire: nothing kept for ever.
    for key in redis_client.scan_iter(match="vmpool:login-failures:*"):
        assert 0 < redis_client.ttl(key) <= 300


def test_login_limit_defaults(redis_url: str, redis_client: redis.Redis) -> None:
    cfg = auth_config()
    assert cfg.auth is not None
    assert cfg.auth.max_failed_logins_per_user == 10
    assert cfg.auth.max_failed_logins_per_address == 50
    assert cfg.auth.failed_login_window_s == 300
    assert cfg.auth.token_ttl_s is None and cfg.auth.max_tokens_per_user == 100


# -- the rate limit counts per user ----------------------------------------------------------


def test_rate_limit_is_per_user_not_per_token(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves a user cannot multiply the limit by minting tokens. Red before the fix:
    the count was kept per token, so the second token of jdoe was allowed."""
    c, _ = make_client(spec_config(auth=True, rate_limit=3), redis_url)
    first = c.post(f"{API}/token", headers=basic("jdoe", PASSWORD)).json()["token"]
    second = c.post(f"{API}/token", headers=basic("jdoe", PASSWORD)).json()["token"]
    for _ in range(3):
        assert c.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": first}).status_code == 201
    r = c.post(f"{API}/ondemandvm/pool1", headers={"X-AUTH-TOKEN": second})
    assert r.status_code == 429
    assert r.headers["retry-after"] == str(r.json()["retry_after"])


# -- token expiry and the bound on a user's tokens -------------------------------------------


def test_token_ttl_is_stored_and_reported(redis_url: str, redis_client: redis.Redis) -> None:
    c, _ = make_client(auth_config(token_ttl=2), redis_url)
    token = c.post(f"{API}/token", headers=basic("jdoe", PASSWORD)).json()["token"]
    ttl = redis_client.ttl(Keys("vmpool").token(token_sha256(token)))
    assert 2 * 3600 - 60 <= ttl <= 2 * 3600
    # No token_ttl: no expiry.
    store = TokenStore(redis_client, Keys("vmpool"))
    forever = store.mint("jdoe")
    assert forever.expires is None
    assert redis_client.ttl(Keys("vmpool").token(token_sha256(forever.token))) == -1


def test_a_users_tokens_are_bounded_the_oldest_dropped(
    redis_url: str, redis_client: redis.Redis
) -> None:
    store = TokenStore(redis_client, Keys("vmpool"))
    tokens = [store.mint("jdoe", max_tokens=3).token for _ in range(5)]
    alive = [t for t in tokens if store.lookup(t, touch=False) is not None]
    assert alive == tokens[2:]
    # A revoked or expired token frees its place (the index is pruned).
    assert store.revoke(tokens[4])
    newest = store.mint("jdoe", max_tokens=3).token
    assert [t for t in [*tokens, newest] if store.lookup(t, touch=False)] == [
        tokens[2],
        tokens[3],
        newest,
    ]
    # Another user's tokens are their own.
    assert store.lookup(store.mint("alice", max_tokens=3).token, touch=False) is not None
    assert store.lookup(tokens[2], touch=False) is not None


def test_cli_token_create_prints_the_expiry(
    tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> None:
    from vmpool.cli.main import cli

    path = tmp_path / "vmpool.yaml"
    path.write_text(f":auth:\n  users: {{jdoe: '{PASSWORD_HASH}'}}\n  token_ttl: 1\n")
    args = ["token", "create", "jdoe", "--config", str(path), "--redis-url", redis_url]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    token = r.stdout.splitlines()[0]
    assert len(token) == 32
    assert "expires" in r.output and "Z" in r.output
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count('"expires"') == 1


# -- auth never turns off by accident --------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [":auth:\n", ":auth: {}\n", ":auth:\n#  provider: static\n#  users: {}\n", "auth: null\n"],
)
def test_an_empty_auth_section_is_a_config_error(tmp_path: Path, text: str) -> None:
    """Proves an :auth: whose every line was commented out does not turn auth off. Red
    before the fix: it loaded with auth None (anyone may create and delete)."""
    path = tmp_path / "vmpool.yaml"
    path.write_text(":pools: [{name: p1}]\n" + text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: auth: ")
    assert "\n" not in message


def test_no_auth_section_is_still_auth_off(tmp_path: Path) -> None:
    path = tmp_path / "vmpool.yaml"
    path.write_text(":pools: [{name: p1}]\n")
    assert load_config(path, env={}).auth is None


def test_status_says_auth_is_off_on_an_exposed_address(
    redis_url: str, redis_client: redis.Redis
) -> None:
    cfg = spec_config()
    for host, warned in [("0.0.0.0", True), ("::", True), ("127.0.0.1", False), (None, False)]:
        app = make_app(cfg, redis_url, listen_host=host)
        body = TestClient(app).get(f"{API}/status").json()
        assert body["auth"] == "off"
        assert body["status"]["ok"] is True and "pools" in body  # vmpooler's keys stay
        assert ("warnings" in body) is warned
        if warned:
            assert "auth is off" in body["warnings"][0]
    on = make_app(spec_config(auth=True), redis_url, listen_host="::")
    body = TestClient(on).get(f"{API}/status").json()
    assert body["auth"] == "on" and "warnings" not in body


def test_vmpool_api_warns_at_start_when_auth_is_off_and_exposed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, redis_url: str
) -> None:
    import uvicorn

    from vmpool.cli.main import cli

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    caplog.set_level(logging.WARNING)
    r = CliRunner().invoke(cli, ["api", "--host", "0.0.0.0", "--redis-url", redis_url])
    assert r.exit_code == 0, r.output
    assert "auth is off" in caplog.text or "auth is off" in r.output
    caplog.clear()
    r = CliRunner().invoke(cli, ["api", "--host", "127.0.0.1", "--redis-url", redis_url])
    assert r.exit_code == 0 and "auth is off" not in caplog.text + r.output


def test_dummy_hash_matches_the_costliest_configured_hash() -> None:
    from vmpool.state.tokens import PBKDF2_ITERATIONS, dummy_hash, hash_password, verify_password

    mixed = [hash_password("a", iterations=10, salt="s"), hash_password("b", iterations=70)]
    assert dummy_hash(mixed).startswith("pbkdf2_sha256$70$")
    plain = "sha256$s$" + hashlib.sha256(b"spw").hexdigest()
    assert dummy_hash([plain]).startswith("sha256$")
    assert dummy_hash([]).startswith(f"pbkdf2_sha256${PBKDF2_ITERATIONS}$")
    for stored in (mixed, [plain]):
        assert not verify_password("", dummy_hash(stored))  # no password matches it


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("token_ttl: 0", "auth.token_ttl"),
        ("token_ttl: 1.0e+9", "auth.token_ttl"),
        ("max_tokens_per_user: 0", "auth.max_tokens_per_user"),
        ("max_failed_logins_per_user: -1", "auth.max_failed_logins_per_user"),
        ("max_failed_logins_per_address: x", "auth.max_failed_logins_per_address"),
        ("failed_login_window: 0", "auth.failed_login_window"),
    ],
)
def test_auth_limits_out_of_range_are_one_line_errors(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "vmpool.yaml"
    path.write_text(f":auth:\n  provider: dummy\n  {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"{path}: {key}: must be ")
    assert "\n" not in str(info.value)

"""LDAP authentication (vmpool/api/ldap_auth.py) against a real OpenLDAP server the
tests start (tests/ldaphelp.py: throwaway config, data and CA, loopback ports, stopped
by pid). The server refuses a simple bind without TLS, so every login that works here
went over TLS."""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from vmpool.api import deps
from vmpool.api.ldap_auth import DirectoryUnavailable, ldap_login
from vmpool.config import ConfigError, LdapConfig, parse_config
from vmpool.config.public import public_form

from apihelp import make_client
from ldaphelp import SERVICE_DN, SERVICE_PW, SUFFIX, Slapd, cleanup, ldap_section, slapd_or_skip
from processhelp import Output
from storehelp import wait_until

V = "/api/v3"


@pytest.fixture(scope="module")
def slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slapd]:
    slapd_or_skip()
    root = tmp_path_factory.mktemp("slapd")
    server = Slapd(root)
    server.prepare()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        cleanup(root)


def ldap_of(auth: dict[str, Any]) -> LdapConfig:
    cfg = parse_config({":auth": auth}, source="test", env={})
    assert cfg.auth is not None and cfg.auth.ldap is not None
    return cfg.auth.ldap


def test_direct_bind_over_each_base_and_user_object(slapd: Slapd) -> None:
    """Proves: alice (uid under ou=people) and bob (cn under ou=staff) both log in with
    one config listing both bases and both user objects; a wrong password or an
    unknown user does not."""
    cfg = ldap_of(ldap_section(slapd))
    assert ldap_login(cfg, "alice", "alice-pw")
    assert ldap_login(cfg, "bob", "bob-pw")
    assert not ldap_login(cfg, "alice", "bob-pw")
    assert not ldap_login(cfg, "nobody", "alice-pw")
    assert not ldap_login(cfg, "alice", "")


def test_search_and_bind_with_a_service_account(slapd: Slapd) -> None:
    """Proves: with service_account_hash the user is found by a search under each base
    and bound as; a bad service account password is the directory's problem (503), not
    the user's; the published config never carries the service account's password."""
    account = {":user_dn": SERVICE_DN, ":password": SERVICE_PW}
    cfg = ldap_of(ldap_section(slapd, base=SUFFIX, service_account_hash=account))
    assert ldap_login(cfg, "alice", "alice-pw")
    assert ldap_login(cfg, "bob", "bob-pw")
    assert not ldap_login(cfg, "alice", "wrong")
    assert not ldap_login(cfg, "nobody", "x")
    published = json.dumps(
        public_form(
            parse_config(
                {":auth": ldap_section(slapd, base=SUFFIX, service_account_hash=account)},
                source="test",
                env={},
            )
        )
    )
    assert SERVICE_PW not in published and SERVICE_DN in published  # fmt: skip
    bad = ldap_of(ldap_section(slapd, base=SUFFIX,
                               service_account_hash={**account, ":password": "no"}))  # fmt: skip
    with pytest.raises(DirectoryUnavailable):
        ldap_login(bad, "alice", "alice-pw")


def test_simple_tls_with_a_ca_file(slapd: Slapd) -> None:
    """Proves: encryption simple_tls (LDAPS) with the CA file logs in."""
    enc = {":method": ":simple_tls", ":tls_options": {"ca_file": slapd.ca_file}}
    cfg = ldap_of(ldap_section(slapd, port=slapd.ldaps_port, encryption=enc))
    assert cfg.method == "simple_tls"
    assert ldap_login(cfg, "alice", "alice-pw")


def test_no_encryption_key_means_start_tls_never_clear(slapd: Slapd) -> None:
    """Proves: without `encryption` the connection is start_tls (the server's
    certificate checked against the system's CAs, which do not know the test CA: no
    login, a 503, and no password sent in clear); a plain method is a config error."""
    auth = ldap_section(slapd)
    assert isinstance(auth[":ldap"], dict)
    del auth[":ldap"]["encryption"]
    cfg = ldap_of(auth)
    assert (cfg.method, cfg.ca_file) == ("start_tls", None)
    with pytest.raises(DirectoryUnavailable):
        ldap_login(cfg, "alice", "alice-pw")
    with pytest.raises(ConfigError, match="start_tls or simple_tls"):
        ldap_of(ldap_section(slapd, encryption={":method": ":plain"}))


def test_an_empty_password_never_reaches_the_directory() -> None:
    """Proves: an empty password is refused before any connection (the port here is
    closed: asking would raise DirectoryUnavailable)."""
    cfg = LdapConfig("127.0.0.1", 1, ("dc=x",), ("uid",), "start_tls", None, None, None, 1.0, None)
    assert ldap_login(cfg, "alice", "") is False


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_post_token_down_and_back(
    slapd: Slapd,
    redis_url: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves through the API: a directory user's password mints a token, a wrong one is
    401 and costs a PBKDF2 (as a static user's failure), the directory down is 503 with
    a message (no login, no failed login counted), logins work again once it is back;
    no password is ever logged."""
    cfg = parse_config({":auth": ldap_section(slapd), ":pools": [{"name": "p"}]},
                       source="test", env={})  # fmt: skip
    client = make_client(cfg, redis_url)[0]
    checks: list[str] = []
    real = deps.verify_password
    monkeypatch.setattr(deps, "verify_password",
                        lambda pw, stored: checks.append(stored) or real(pw, stored))  # fmt: skip
    caplog.set_level(logging.DEBUG)
    r = client.post(f"{V}/token", headers=basic("alice", "alice-pw"))
    assert r.status_code == 200 and len(r.json()["token"]) == 32 and checks == []
    r = client.post(f"{V}/token", headers=basic("alice", "wrong-pw"))
    assert r.status_code == 401 and r.json() == {"ok": False}
    assert len(checks) == 1 and checks[0].startswith("pbkdf2_sha256$600000$")
    failures = redis_client.keys("*login-failures*")
    slapd.stop()
    try:
        r = client.post(f"{V}/token", headers=basic("alice", "alice-pw"))
        assert r.status_code == 503 and r.json()["ok"] is False
        assert "unavailable" in r.json()["message"]
        assert redis_client.keys("*login-failures*") == failures
    finally:
        slapd.start()
    r = client.post(f"{V}/token", headers=basic("bob", "bob-pw"))
    assert r.status_code == 200
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    for secret in ("alice-pw", "wrong-pw", "bob-pw"):
        assert secret not in logged


@pytest.mark.slow
def test_vmpool_up_with_ldap_auth(slapd: Slapd, tmp_path: Path) -> None:
    """Proves the acceptance case: `vmpool up` with vmpooler's LDAP :auth: against the
    test slapd mints a token for a directory user's password and answers 401 to a wrong
    one."""
    config = tmp_path / "vmpool.yaml"
    config.write_text(yaml.safe_dump({":auth": ldap_section(slapd), ":pools": [{"name": "p"}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("VMPOOL_REDIS_URL", "VMPOOL_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmpool.cli.main", "up", "--config", str(config),
         "--workers", "1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    out = Output(proc.stdout)
    try:
        wait_until(lambda: "vmpool is up" in out.text(), timeout=90, step=0.1)
        up = re.search(r"API (http://\S+)", out.text())
        assert up, out.text()
        req = urllib.request.Request(up.group(1) + f"{V}/token", method="POST",
                                     headers=basic("alice", "alice-pw"))  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200 and len(json.load(resp)["token"]) == 32
        req = urllib.request.Request(up.group(1) + f"{V}/token", method="POST",
                                     headers=basic("alice", "nope"))  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, out.text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_an_ldap_config_round_trips_through_the_published_form(tmp_path: Path) -> None:
    """Proves: the fleet's published config (what CLI commands follow) carries the LDAP
    settings, with the service account's password masked."""
    from vmpool.config.public import config_from_form

    account = {":user_dn": SERVICE_DN, ":password": SERVICE_PW}
    auth = {"provider": "ldap", "admins": ["ops", "alice"],
            ":ldap": {"host": "h", "base": SUFFIX, "user_object": "uid",
                      "service_account_hash": account}}  # fmt: skip
    cfg = parse_config({":auth": auth}, source="test", env={})
    back = config_from_form(json.loads(json.dumps(public_form(cfg))))
    assert back.auth is not None and cfg.auth is not None and back.auth.ldap is not None
    assert back.auth.admins == ("alice", "ops") == cfg.auth.admins
    assert back.auth.ldap.service_password == "***"
    assert back.auth.ldap.bases == (SUFFIX,) and back.auth.ldap.service_user_dn == SERVICE_DN

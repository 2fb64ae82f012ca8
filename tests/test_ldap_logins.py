"""LDAP logins as one user per person, a busy directory never a failed login, and
vmpooler's `ssl_version` pinning the TLS version: against a real OpenLDAP server
(tests/ldaphelp.py) whose binds pass first through slapd's sock overlay, so the test
makes the directory itself answer busy (51) or unavailable (52)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from vmpool.api import ldap_auth
from vmpool.api.ldap_auth import DirectoryUnavailable, ldap_login
from vmpool.config import ConfigError, LdapConfig, parse_config

from apihelp import make_client
from ldaphelp import BindAnswers, Slapd, cleanup, ldap_section, slapd_or_skip

V = "/api/v3"


@pytest.fixture(scope="module")
def answers() -> Iterator[BindAnswers]:
    answers = BindAnswers()
    try:
        yield answers
    finally:
        answers.close()


@pytest.fixture(scope="module")
def slapd(tmp_path_factory: pytest.TempPathFactory, answers: BindAnswers) -> Iterator[Slapd]:
    slapd_or_skip()
    root = tmp_path_factory.mktemp("slapd-sock")
    server = Slapd(root, bind_socket=answers.path)
    server.prepare()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        cleanup(root)


@pytest.fixture(autouse=True)
def lets_binds_through(answers: BindAnswers) -> None:
    answers.code = None


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def ldap_of(auth: dict[str, Any]) -> LdapConfig:
    cfg = parse_config({":auth": auth}, source="test", env={})
    assert cfg.auth is not None and cfg.auth.ldap is not None
    return cfg.auth.ldap


def api(slapd: Slapd, redis_url: str, **auth: Any) -> Any:
    data = {":auth": {**ldap_section(slapd), **auth}, ":pools": [{"name": "p"}]}
    return make_client(parse_config(data, source="test", env={}), redis_url)[0]


@pytest.mark.parametrize("code", [51, 52])
def test_a_busy_or_unavailable_directory_is_503_and_spends_no_budget(
    slapd: Slapd, answers: BindAnswers, redis_url: str, redis_client: redis.Redis, code: int
) -> None:
    """The directory answers the bind busy (51) or unavailable (52): that is no answer
    about the password, so 503 and no failed login counted (it was a 401 that spent the
    user's lockout budget: a busy directory locked users out)."""
    client = api(slapd, redis_url, max_failed_logins_per_user=1)
    answers.code = code
    asked = answers.asked
    for _ in range(3):
        r = client.post(f"{V}/token", headers=basic("alice", "alice-pw"))
        assert r.status_code == 503 and r.json()["ok"] is False, r.text
    assert answers.asked > asked  # the directory was asked, and said it cannot tell
    assert redis_client.keys("*login-failures*") == []
    with pytest.raises(DirectoryUnavailable):
        ldap_login(ldap_of(ldap_section(slapd)), "alice", "alice-pw")
    answers.code = None
    assert client.post(f"{V}/token", headers=basic("alice", "alice-pw")).status_code == 200


@pytest.mark.slow  # each failed login costs a PBKDF2, as a wrong static password does
def test_alice_ALICE_and_Alice_are_one_user(
    slapd: Slapd, redis_url: str, redis_client: redis.Redis
) -> None:
    """The directory matches user names case-insensitively: every spelling logs in as
    the one user alice (one token owner, one lockout budget). They were three users."""
    client = api(slapd, redis_url, max_failed_logins_per_user=2)
    tokens = []
    for spelling in ("alice", "ALICE", "Alice"):
        r = client.post(f"{V}/token", headers=basic(spelling, "alice-pw"))
        assert r.status_code == 200, r.text
        tokens.append(r.json()["token"])
    for token in tokens:
        assert client.get(f"{V}/token/{token}").json()[token]["user"] == "alice"
    for spelling in ("Alice", "ALICE"):  # two failures: alice's budget of 2 is spent
        assert client.post(f"{V}/token", headers=basic(spelling, "wrong")).status_code == 401
    r = client.post(f"{V}/token", headers=basic("alice", "alice-pw"))
    assert r.status_code == 429 and r.json()["error"] == "Too many failed logins"


def test_ssl_version_pins_the_tls_version(slapd: Slapd) -> None:
    """vmpooler's encryption.tls_options.ssl_version: TLSv1_2 makes the connection TLS
    1.2 where the directory would negotiate 1.3; without it, the best both speak."""

    def negotiated(**tls: Any) -> str:
        enc = {":method": ":start_tls", ":tls_options": {"ca_file": slapd.ca_file, **tls}}
        cfg = ldap_of(ldap_section(slapd, encryption=enc))
        assert ldap_login(cfg, "alice", "alice-pw")
        conn = ldap_auth._connect(cfg, "", "")
        try:
            return str(conn.socket.version())
        finally:
            conn.unbind()

    assert negotiated() == "TLSv1.3"
    assert negotiated(ssl_version="TLSv1_2") == "TLSv1.2"
    assert negotiated(ssl_version=":TLSv1_3") == "TLSv1.3"


def test_an_obsolete_ssl_version_is_a_warning_and_a_bad_one_an_error(slapd: Slapd) -> None:
    enc = {":method": ":start_tls", ":tls_options": {":ssl_version": "TLSv1"}}
    cfg = parse_config({":auth": ldap_section(slapd, encryption=enc)}, source="t", env={})
    assert cfg.auth is not None and cfg.auth.ldap is not None
    assert cfg.auth.ldap.tls_version is None
    assert any("ssl_version 'TLSv1' is obsolete" in w for w in cfg.warnings), cfg.warnings
    bad = {":method": ":start_tls", ":tls_options": {"ssl_version": "SSLv3"}}
    with pytest.raises(ConfigError, match="ssl_version 'SSLv3': use one of"):
        parse_config({":auth": ldap_section(slapd, encryption=bad)}, source="t", env={})


def test_an_ldap_form_published_before_ssl_version_reads_back() -> None:
    """A fleet whose vmpool predates ssl_version published LDAP settings without it: the
    CLI following that fleet reads them (negotiate, as that vmpool did)."""
    from vmpool.config.public import config_from_form, public_form

    auth = {"provider": "ldap", ":ldap": {"host": "h", "base": "dc=x", "user_object": "uid"}}
    form = public_form(parse_config({":auth": auth}, source="t", env={}))
    del form["auth"]["ldap"]["tls_version"]
    back = config_from_form(form)
    assert back.auth is not None and back.auth.ldap is not None
    assert back.auth.ldap.tls_version is None and back.auth.ldap.host == "h"

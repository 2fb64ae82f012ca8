"""Where Redis is: the redis+sentinel:// URL form, the ``:redis: sentinel`` section, the
connection settings and their bounds, and what rq-dashboard is given.

What this proves: a Sentinel group given either way (URL or config section) reaches
every process as one URL that parses back to the same target; no password is shown in
an error or a masked URL; bad settings are one clear line; the connection factory
applies the timeouts, keepalive and health check to every client it makes."""

from __future__ import annotations

import re
import socket

import pytest

from vmpool.config import ConfigError, default_redis_options, mask_url_password, parse_config
from vmpool.config.redis_url import validate_redis_url
from vmpool.local.dashboard import dashboard_redis_env
from vmpool.state.connection import KEEPALIVE, connect
from vmpool.state.redis_target import SentinelTarget, parse_sentinel_url


def load(redis: dict[str, object], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_config({":redis": redis, ":pools": []}, source="t.yaml", env=env or {})


def test_a_sentinel_section_becomes_one_url_that_parses_back() -> None:
    config = load(
        {
            "sentinel": {
                "master": "mymaster",
                "hosts": ["s1:26379", "s2", "[::1]:26380"],
                "password": "p@ss:w/rd",
                "sentinel_password": "s3cr&t",
            },
            "db": 3,
        }
    )
    assert config.redis_url is not None
    assert config.redis_url.startswith("redis+sentinel://")
    assert parse_sentinel_url(config.redis_url) == SentinelTarget(
        master="mymaster",
        hosts=(("s1", 26379), ("s2", 26379), ("::1", 26380)),
        db=3,
        password="p@ss:w/rd",
        sentinel_password="s3cr&t",
    )
    shown = mask_url_password(config.redis_url)
    assert "p@ss" not in shown and "s3cr" not in shown and shown.count("***") == 2


def test_the_url_form_is_taken_from_the_environment_over_the_section() -> None:
    url = "redis+sentinel://:pw@h1:26379,h2:26379/grp/1"
    config = load({"sentinel": {"master": "x", "hosts": ["a:1"]}}, env={"VMPOOL_REDIS_URL": url})
    assert config.redis_url == url
    assert parse_sentinel_url(url).hosts == (("h1", 26379), ("h2", 26379))


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("redis+sentinel://h1:26379", "names no master"),
        ("redis+sentinel://h1:99999/m", "not 1-65535"),
        ("redis+sentinel://:secret@h1:1/m/x", "non-negative integer"),
        ("redis+sentinel://h1:1/m/0/extra", "more than MASTER/db"),
        ("redis+sentinel://h1:1/m?sentinel_pasword=x", "unknown option"),
        ("redis+sentinel://,h1/m", "empty sentinel address"),
        ("http://h/0", "must be a redis://"),
    ],
)
def test_a_bad_url_is_one_line_without_its_password(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as caught:
        validate_redis_url(url)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("redis", "words"),
    [
        ({"socket_timeout": 0}, "from 0.1 to 300"),
        ({"durability": "always"}, "one of auto, none, replicas"),
        ({"durability_replicas": 0}, "from 1 to 16"),
        ({"health_check_interval": -1}, "from 0 (never) to 3600"),
        ({"sentinel": {"master": "m", "hosts": []}}, "list of 'host:port' sentinels"),
        ({"sentinel": {"master": "m", "hosts": ["h:0"]}}, "port from 1 to 65535"),
        ({"sentinel": {"hosts": ["h:1"]}}, "master"),
        ({"socket_timeout": 2, "durability_timeout": 2}, "must exceed redis.durability_timeout"),
    ],
)
def test_bad_redis_settings_are_one_clear_line(redis: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        load(redis)
    assert "\n" not in str(caught.value)


def test_sentinel_names_the_servers_so_server_and_port_are_ignored_with_a_warning() -> None:
    config = load({"server": "old", "port": 7000, "sentinel": {"master": "m", "hosts": "h:1"}})
    assert config.redis_url == "redis+sentinel://h:1/m/0"
    assert any("redis.sentinel: set, so server, port ignored" in w for w in config.warnings)


def test_the_factory_sets_timeouts_keepalive_and_health_checks() -> None:
    options = default_redis_options()
    client = connect("redis://127.0.0.1:1/0", options, decode_responses=True)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == options.socket_timeout_s == 5.0
    assert kwargs["socket_connect_timeout"] == options.connect_timeout_s == 2.0
    assert kwargs["health_check_interval"] == options.health_check_interval_s == 5.0
    assert kwargs["socket_keepalive"] is True
    assert kwargs["socket_keepalive_options"] == KEEPALIVE
    assert KEEPALIVE.get(getattr(socket, "TCP_KEEPIDLE", -1), 10) == 10
    client.close()


def test_rq_dashboard_gets_the_url_it_reads_and_the_sentinel_password_apart() -> None:
    url = "redis+sentinel://:pw@h1:26379,h2:26379/grp/2?sentinel_password=sp"
    env = dashboard_redis_env(url)
    assert env == {
        "RQ_DASHBOARD_REDIS_URL": "redis+sentinel://:pw@h1:26379,h2:26379/grp/2",
        "RQ_DASHBOARD_REDIS_SENTINEL_PASSWORD": "sp",
    }
    from redis_sentinel_url import parse_sentinel_url as theirs  # rq-dashboard's parser

    parsed = theirs(env["RQ_DASHBOARD_REDIS_URL"])
    assert parsed.hosts == [("h1", 26379), ("h2", 26379)]
    assert parsed.default_client.service == "grp"
    assert parsed.client_options == {"password": "pw", "db": 2}
    assert dashboard_redis_env("redis://h:1/0") == {"RQ_DASHBOARD_REDIS_URL": "redis://h:1/0"}


@pytest.mark.slow
def test_a_frozen_connection_is_left_within_the_socket_timeout(redis_url: str) -> None:
    """Every connection open now (three in the pool) freezes for good (a node gone
    without a word) while new ones work: the client's next command gives up on its
    frozen connection after the socket timeout and is retried once on a new one, so it
    succeeds, late by about one timeout, without an error reaching the caller; and the
    idle frozen connections were closed with it: the commands after it are not late
    (without the close, each would wait out its own timeout, one after the other)."""
    import dataclasses
    import time
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlsplit

    from sentinelhelp import FaultProxy

    proxy = FaultProxy(urlsplit(redis_url).port or 6379).start()
    options = dataclasses.replace(default_redis_options(), socket_timeout_s=1.0,
                                  health_check_interval_s=0.0)  # fmt: skip
    client = connect(f"redis://127.0.0.1:{proxy.port}/0", options, decode_responses=True)
    try:
        client.set("frozen:a", "1")
        pool = client.connection_pool
        held = [pool.get_connection() for _ in range(3)]
        for conn in held:
            conn.connect()
            pool.release(conn)
        assert proxy.freeze() == 3
        started = time.monotonic()
        assert client.get("frozen:a") == "1"
        took = time.monotonic() - started
        assert 0.9 <= took < 3.0, took
        # three at once, as a worker's threads do: three connections from the pool
        started = time.monotonic()
        with ThreadPoolExecutor(3) as threads:
            replies = list(threads.map(lambda _: client.blpop(["frozen:none"], 0.3), range(3)))
        assert replies == [None] * 3
        assert time.monotonic() - started < 0.9
    finally:
        client.close()
        proxy.stop()

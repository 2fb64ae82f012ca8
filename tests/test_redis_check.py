"""Redis as the contract assumes: every process checks maxmemory-policy
(noeviction) and persistence (AOF) at start, warns or refuses with --strict; /status
and `vmpool audit` report it. Each case is a real redis-server started with the
setting under test (a managed Redis that hides CONFIG is modelled with
rename-command, as such services do)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.local.redis_server import RedisServer
from vmpool.state.redis_check import RedisMisconfigured, check_redis, startup_check

from apihelp import make_client, spec_config


class ConfiguredServer(RedisServer):
    """A redis-server with extra command-line settings."""

    def __init__(self, extra: list[str], *, appendonly: bool) -> None:
        super().__init__(appendonly=appendonly)
        self.extra = extra

    def command(self) -> list[str]:
        return super().command() + self.extra


def serve(extra: list[str], *, appendonly: bool) -> Iterator[str]:
    server = ConfiguredServer(extra, appendonly=appendonly).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def good_url() -> Iterator[str]:
    yield from serve([], appendonly=True)


@pytest.fixture(scope="module")
def bad_url() -> Iterator[str]:
    yield from serve(["--maxmemory-policy", "allkeys-lru"], appendonly=False)


@pytest.fixture(scope="module")
def no_config_url() -> Iterator[str]:
    yield from serve(["--rename-command", "CONFIG", ""], appendonly=True)


@pytest.fixture(scope="module")
def hidden_url() -> Iterator[str]:
    yield from serve(
        ["--rename-command", "CONFIG", "", "--rename-command", "INFO", ""], appendonly=True
    )


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def test_a_server_as_assumed_is_ok(good_url: str) -> None:
    got = check_redis(client(good_url))
    assert (got.status, got.maxmemory_policy, got.appendonly) == ("ok", "noeviction", "yes")
    assert got.problems() == []


def test_eviction_and_no_aof_are_two_problems(
    bad_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    got = check_redis(client(bad_url))
    assert (got.status, got.maxmemory_policy, got.appendonly) == (
        "misconfigured",
        "allkeys-lru",
        "no",
    )
    assert len(got.problems()) == 2
    with caplog.at_level(logging.WARNING):
        startup_check(client(bad_url), who="test")
    assert sum("allkeys-lru" in r.message or "appendonly" in r.message for r in caplog.records) == 2
    with pytest.raises(RedisMisconfigured, match="allkeys-lru"):
        startup_check(client(bad_url), who="test", strict=True)


def test_config_disabled_falls_back_to_info(no_config_url: str) -> None:
    got = check_redis(client(no_config_url))
    assert (got.status, got.maxmemory_policy, got.appendonly) == ("ok", "noeviction", "yes")


def test_nothing_readable_is_unknown_not_a_crash(
    hidden_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    got = check_redis(client(hidden_url))
    assert (got.status, got.maxmemory_policy, got.appendonly) == ("unknown", "unknown", "unknown")
    with caplog.at_level(logging.WARNING):
        startup_check(client(hidden_url), who="test", strict=True)  # unknown never refuses
    assert any("could not read" in r.message for r in caplog.records)


@pytest.mark.parametrize("command", [["scheduler", "--burst"], ["worker", "--burst"]])
def test_strict_refuses_to_start_in_one_line(bad_url: str, command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--strict", "--redis-url", bad_url])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--strict" in lines[0] and "allkeys-lru" in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_without_strict_a_worker_warns_and_runs(
    bad_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="vmpool.state.redis_check"):
        result = CliRunner().invoke(cli, ["worker", "--burst", "--redis-url", bad_url])
    assert result.exit_code == 0, result.output
    assert any("vmpool worker" in r.message and "allkeys-lru" in r.message for r in caplog.records)


def test_api_and_up_refuse_with_strict(bad_url: str) -> None:
    for command in (["api", "--port", "0"], ["up", "--workers", "1"]):
        result = CliRunner().invoke(cli, [*command, "--strict", "--redis-url", bad_url])
        assert result.exit_code == 1, (command, result.output)
        assert "--strict" in result.stderr


def test_status_reports_the_settings(bad_url: str, hidden_url: str) -> None:
    c, _ = make_client(spec_config(), bad_url)
    body = c.get("/api/v3/status").json()
    assert body["redis"]["status"] == "misconfigured"
    assert body["redis"]["maxmemory_policy"] == "allkeys-lru"
    c, _ = make_client(spec_config(), hidden_url)
    r = c.get("/api/v3/status")
    assert r.status_code == 200 and r.json()["redis"]["status"] == "unknown"


def test_audit_reports_the_settings(bad_url: str) -> None:
    client(bad_url).flushdb()
    result = CliRunner().invoke(cli, ["audit", "--json", "--redis-url", bad_url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["redis"]["appendonly"] == "no"
    text = CliRunner().invoke(cli, ["audit", "--redis-url", bad_url])
    assert "redis: misconfigured" in text.stderr

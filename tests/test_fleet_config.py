"""The running fleet publishes its config to Redis; a command given only the Redis URL
works on the fleet's pools; a config file that disagrees with the fleet's is a warning;
no secret is ever published.

The commands run as a user runs them (click's runner, the real Redis of the tests); the
fleet's side is what `vmpool up`, `api`, `worker` and `scheduler` call at start
(tests/test_up.py runs it as processes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.config import Config, demo_config, load_config
from vmpool.config.public import config_from_form, public_form
from vmpool.config.published import publish_config, read_published
from vmpool.config.settings import AuthSection, ConfigSection, PoolSection, RedisSection
from vmpool.state.keys import Keys

FLEET = """\
:providers:
  simulated: {boot_seconds: 0, seed: 2}
  aws:
    provider_class: ec2
    region: us-east-1
    access_key_id: AKIDSECRETID
    secret_access_key: very-secret-key
:redis:
  key_prefix: ci
  url: redis://:redis-password@127.0.0.1:1/0
:auth:
  provider: static
  users:
    jdoe: sha256$salt$0000000000000000000000000000000000000000000000000000000000000000
:config:
  vm_lifetime: 3
  backend_weight: {fleetpool: 2}
:pools:
  - {name: fleetpool, alias: [fp, both], domain: example.com, size: 0}
  - {name: cloudpool, alias: [both], provider: aws, amisize: t3.micro}
"""


def _load(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Config:
    path = tmp_path / name
    path.write_text(text)
    return load_config(path, env={})


def run(*args: str) -> Result:
    return CliRunner().invoke(
        cli, list(args), env={"VMPOOL_CONFIG": None, "VMPOOL_REDIS_URL": None}
    )


def _unsecret(config: Config) -> Config:
    auth = config.auth and dataclasses.replace(
        config.auth, users=dict.fromkeys(config.auth.users, "")
    )
    return dataclasses.replace(config, redis_url=None, auth=auth)


@pytest.mark.parametrize("which", ["demo", "fleet"])
def test_the_public_form_gives_back_the_config_but_its_secrets(which: str, tmp_path: Path) -> None:
    config = demo_config() if which == "demo" else _load(tmp_path, FLEET)
    back = config_from_form(json.loads(json.dumps(public_form(config))))
    expected = _unsecret(config)
    if which == "fleet":  # the cloud's secrets are masked: everything else is the same
        aws = expected.providers["aws"]
        masked = {**aws.options, "access_key_id": "***", "secret_access_key": "***"}
        providers = {**expected.providers, "aws": dataclasses.replace(aws, options=masked)}
        expected = dataclasses.replace(expected, providers=providers)
    assert back == expected


def test_no_secret_is_published(redis_client: redis.Redis, tmp_path: Path) -> None:
    config = _load(tmp_path, FLEET)
    assert publish_config(redis_client, config, publisher="test") is None
    stored = json.dumps(redis_client.hgetall(Keys("ci").fleet_config))
    for secret in ("AKIDSECRETID", "very-secret-key", "redis-password", "sha256$salt"):
        assert secret not in stored
    published = read_published(redis_client, Keys("ci"))
    assert published is not None and published.masked_secrets() == ["aws"]


def test_a_command_given_only_the_redis_url_works_on_the_fleets_pools(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    config = _load(tmp_path, FLEET.replace("provider: aws", "provider: simulated"))
    publish_config(redis_client, config, publisher="vmpool worker on test (pid 1)")
    pools = run("pools", "--json", "--redis-url", redis_url)
    assert pools.exit_code == 0, pools.output
    assert [row["pool"] for row in json.loads(pools.stdout)] == ["fleetpool", "cloudpool"]
    made = run("request", "create", "fp=1", "--redis-url", redis_url)
    assert made.exit_code == 0, made.output
    rid = made.stdout.strip()
    assert redis_client.exists(Keys("ci").request(rid))  # under the fleet's key prefix
    shown = run("config", "show", "--json", "--redis-url", redis_url)
    assert "published by vmpool worker on test (pid 1)" in json.loads(shown.stdout)["source"]
    unknown = run("request", "create", "debian=1", "--redis-url", redis_url)
    assert unknown.exit_code == 2 and "debian" in unknown.stderr  # the demo's pool: not here


def test_a_config_file_that_is_not_the_fleets_is_a_warning(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    fleet_text = FLEET.replace("url: redis://:redis-password@127.0.0.1:1/0", "data_ttl: 2")
    publish_config(redis_client, _load(tmp_path, fleet_text), publisher="test")
    same = tmp_path / "same.yaml"
    same.write_text(fleet_text)
    agrees = run("pools", "--config", str(same), "--redis-url", redis_url)
    assert agrees.exit_code == 0 and "warning" not in agrees.stderr, agrees.output
    other = tmp_path / "other.yaml"
    other.write_text(fleet_text.replace("vm_lifetime: 3", "vm_lifetime: 4"))
    differs = run("pools", "--config", str(other), "--redis-url", redis_url)
    assert differs.exit_code == 0, differs.output
    assert differs.stderr.startswith(f"warning: {other} differs from the running fleet's config")
    assert "in: vm_lifetime_auth_s, vm_lifetime_s;" in differs.stderr
    assert f"this command uses {other}" in differs.stderr


def test_two_fleets_and_no_default_prefix_ask_for_the_config(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    for prefix in ("fleet-a", "fleet-b"):
        text = f":redis: {{key_prefix: {prefix}}}\n:pools:\n  - {{name: p}}\n"
        publish_config(redis_client, _load(tmp_path, text, f"{prefix}.yaml"), publisher="t")
    result = run("pools", "--redis-url", redis_url)
    assert result.exit_code == 2
    assert "several fleets publish their config in this Redis database" in result.stderr
    assert "fleet-a, fleet-b" in result.stderr and "pass --config" in result.stderr


def test_audit_of_a_fleet_whose_provider_needs_its_secrets_asks_for_the_file(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    publish_config(redis_client, _load(tmp_path, FLEET), publisher="test")
    result = run("audit", "--redis-url", redis_url)
    assert result.exit_code == 2
    assert "provider aws needs them" in result.stderr and "pass --config" in result.stderr


def test_nothing_published_is_the_demo_config_and_says_so(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a Redis URL that reaches a Redis with no fleet on it runs the command with
    the demo config, and a warning on stderr says so (it was silent: the demo's pools
    passed for the fleet's)."""
    result = run("pools", "--json", "--redis-url", redis_url)
    assert result.exit_code == 0, result.output
    assert [row["pool"] for row in json.loads(result.stdout)] == list(demo_config().pools)
    assert result.stderr.startswith("warning: no fleet has published its config at redis://")
    assert "uses the built-in demo config; pass --config FILE" in result.stderr


def test_a_setting_the_publisher_predates_reads_as_its_default(tmp_path: Path) -> None:
    """Proves: a published form without a setting (its publisher predates the setting)
    reads back with the settings model's default for it: at the top, in a pool, in auth
    and in the Redis options. The config published sets each one to another value, so a
    value carried over from it would show."""
    text = FLEET.replace(
        "  vm_lifetime: 3\n",
        "  vm_lifetime: 3\n  experimental_features: true\n  provider_quota_wait: 45\n",
    )
    text = text.replace("domain: example.com, size: 0}", "domain: example.com, size: 0,"
                        " ondemand_from_ready: false}")  # fmt: skip
    text = text.replace("  provider: static\n", "  provider: static\n  max_tokens_per_user: 5\n")
    text = text.replace("  key_prefix: ci\n", "  key_prefix: ci\n  durability_timeout: 3\n")
    form = json.loads(json.dumps(public_form(_load(tmp_path, text))))
    assert form["experimental_features"] is True and form["provider_quota_wait_s"] == 45
    assert form["pools"][0]["ondemand_from_ready"] is False
    assert form["auth"]["max_tokens_per_user"] == 5
    assert form["redis_options"]["durability_timeout_s"] == 3
    for section, key in (
        (form, "experimental_features"),
        (form, "provider_quota_wait_s"),
        (form["pools"][0], "ondemand_from_ready"),
        (form["auth"], "max_tokens_per_user"),
        (form["redis_options"], "durability_timeout_s"),
    ):
        del section[key]
    back = config_from_form(form)
    assert back.experimental_features is ConfigSection().experimental_features is False
    assert back.provider_quota_wait_s == ConfigSection().provider_quota_wait == 30
    assert back.pools["fleetpool"].ondemand_from_ready is PoolSection(name="p").ondemand_from_ready
    assert back.auth is not None
    assert back.auth.max_tokens_per_user == AuthSection().max_tokens_per_user == 100
    assert back.redis_options.durability.timeout_s == RedisSection().durability_timeout == 2


def test_a_form_of_another_layout_is_refused_in_one_line(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves: a config published by a vmpool whose form has another layout (its format
    number) is not misread: the command says so in one line and asks for the file."""
    redis_client.hset(
        Keys("vmpool").fleet_config, mapping={"format": 1, "config": json.dumps({"pools": {}})}
    )
    result = run("pools", "--redis-url", redis_url)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert "format '1', not 2" in result.stderr and "pass --config" in result.stderr

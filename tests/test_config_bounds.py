"""Bounds on every duration and count of the config.

A value out of range is a one-line config error naming the file, the key and the range,
never a value that loads and breaks at run time: before the bounds a data_ttl of 1e300
hours loaded, and the request's delete then failed inside its script, after the status
was written (PEXPIRE refuses a time that large); a TTL of 1e-9 minutes loaded too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.config import ConfigError, json_schema, parse_config
from vmpool.lifecycle.plan import RequestRejected, plan_slots
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store

from apihelp import make_client

# (section, key, too small, too large): each is the edge of its range, one step out.
BOUNDS: list[tuple[str, str, Any, Any]] = [
    ("config", "ondemand_request_ttl", 1e-9, 1e300),  # minutes
    ("config", "ondemand_request_grace", -1, 86401),  # seconds
    ("config", "vm_lifetime", 1e-9, 8761),  # hours
    ("config", "vm_lifetime_auth", 1e-9, 8761),
    ("config", "timeout", 0.001, 525601),  # minutes
    ("config", "ready_ttl", 0.001, 525601),
    ("config", "data_ttl", 1e-9, 1e300),  # hours
    ("config", "lock_expire", 0.5, 86401),  # seconds
    ("config", "reconcile_grace", -1, 86401),
    ("config", "ondemand_clone_limit", 0, 10**7),
    ("config", "max_vm_retries", -1, 101),
    ("config", "max_ondemand_instances_per_request", 0, 10**9),
    ("config", "max_ondemand_instances_total", 0, 10**9),
    ("redis", "data_ttl", 1e-9, 1e300),
    ("schedule", "sweep_expired", 1e-9, 86401),
    ("schedule", "provision_sweep", 0.05, 1e12),
    ("schedule", "check_pending_sweep", 0.05, 1e12),
    ("schedule", "reap_running", 0.05, 1e12),
    ("schedule", "destroy_sweep", 0.05, 1e12),
    ("schedule", "reconcile", 0.05, 1e12),
    ("pools[0]", "size", -1, 10**9),
    ("pools[0]", "timeout", 1e-9, 1e300),
    ("pools[0]", "ready_ttl", 1e-9, 1e300),
]


def _data(section: str, key: str, value: Any) -> dict[str, Any]:
    if section == "pools[0]":
        return {"pools": [{"name": "p1", key: value}]}
    return {section: {key: value}}


@pytest.mark.parametrize(("section", "key", "low", "high"), BOUNDS)
def test_out_of_range_is_one_line_naming_file_key_and_range(
    section: str, key: str, low: Any, high: Any
) -> None:
    for value in (low, high):
        with pytest.raises(ConfigError) as info:
            parse_config(_data(section, key, value), source="f.yaml", env={})
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"f.yaml: {section}.{key}: must be "), message
        assert " to " in message, message  # the range is named


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("config", "ondemand_request_ttl", 525600),  # a year, in minutes
        ("config", "data_ttl", 8760),  # a year, in hours
        ("config", "vm_lifetime", 1 / 3600),  # a second, in hours
        ("config", "lock_expire", 1),
        ("schedule", "sweep_expired", 0.1),
        ("schedule", "reconcile", 86400),
        ("config", "ondemand_clone_limit", 1_000_000),
        ("config", "max_vm_retries", 0),
        ("pools[0]", "size", 0),
    ],
)
def test_the_edges_themselves_load(section: str, key: str, value: Any) -> None:
    parse_config(_data(section, key, value), source="f.yaml", env={})


def test_environment_overrides_are_bounded_too() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({}, source="f.yaml", env={"ONDEMAND_REQUEST_TTL": "1e300"})
    assert "ONDEMAND_REQUEST_TTL" in str(info.value) or "ondemand_request_ttl" in str(info.value)


def test_the_largest_data_ttl_works_in_the_scripts(redis_client: redis.Redis) -> None:
    """The upper bound is one Redis takes: a request closed under the largest data_ttl
    and lifetime the config allows gets its tombstone TTL (before the bound, 1e300 hours
    made the delete fail inside the script, after the status was written)."""
    config = parse_config(
        {"config": {"data_ttl": 8760, "vm_lifetime": 8760}}, source="f.yaml", env={}
    )
    store = Store(redis_client, Keys("vmpool"))
    settings = RequestSettings.from_config(config)
    assert store.create_request("r1", [Slot("p", "p", 1)], settings, actor="t").ok
    assert store.delete_request("r1", actor="t").ok
    ttl_ms = int(redis_client.pttl(store.keys.request("r1")))
    assert 0 < ttl_ms <= 8760 * 3600 * 1000


def test_schema_documents_every_range() -> None:
    schema = json_schema()
    defs = schema["$defs"]
    for section, key, _, _ in BOUNDS:
        model = (
            "PoolSection"
            if section.startswith("pools")
            else {"config": "ConfigSection", "redis": "RedisSection", "schedule": "Schedule"}[
                section
            ]
        )
        prop = defs[model]["properties"][key]
        options = prop.get("anyOf", [prop])
        bounded = [o for o in options if "maximum" in o]
        assert bounded, (section, key, prop)
        assert "Range:" in prop["description"], (section, key, prop["description"])


# -- the total of one request ------------------------------------------------------------

TWO_POOLS = {
    "config": {"max_ondemand_instances_per_request": 5, "max_ondemand_instances_total": 6},
    "pools": [{"name": "a"}, {"name": "b"}],
}


def test_total_over_all_pools_is_bounded() -> None:
    """Each pool under its maximum, the sum over it: vmpooler's 403 wording with the
    total's maximum (before, only each count was checked: 5 + 5 was accepted)."""
    config = parse_config(TWO_POOLS, source="f.yaml", env={})
    rng = random.Random(1)
    assert len(plan_slots(config, {"a": 3, "b": 3}, rng)) == 2
    with pytest.raises(RequestRejected) as info:
        plan_slots(config, {"a": 5, "b": 5}, rng)
    assert info.value.maximum == 6
    assert str(info.value) == "requested amount of instances exceeds the maximum 6"


def test_total_defaults_to_per_request_maximum_times_pools() -> None:
    config = parse_config(
        {
            "config": {"max_ondemand_instances_per_request": 4},
            "pools": [{"name": "a"}, {"name": "b"}],
        },
        source="f.yaml",
        env={},
    )
    assert config.max_ondemand_instances_total == 8
    plan_slots(config, {"a": 4, "b": 4}, random.Random(1))


def _two_pools_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "vmpool.yaml"
    path.write_text(yaml.safe_dump(TWO_POOLS))
    return path


def test_api_answers_vmpoolers_403_for_the_total(redis_url: str, redis_client: redis.Redis) -> None:
    """Each count within its maximum (5), the sum (10) over the total (6): 403 with
    vmpooler's body, nothing written."""
    config = parse_config(TWO_POOLS, source="f.yaml", env={})
    client, _ = make_client(config, redis_url)
    response = client.post("/api/v3/ondemandvm", json={"a": 5, "b": 5})
    assert response.status_code == 403
    assert response.json() == {
        "ok": False,
        "message": "requested amount of instances exceeds the maximum 6",
    }
    assert client.post("/api/v3/ondemandvm/a+a+a+b+b+b+b").status_code == 403  # 7 by path
    assert client.post("/api/v3/ondemandvm", json={"a": 3, "b": 3}).status_code == 201


def test_cli_exits_2_for_the_total(redis_url: str, tmp_path: Path) -> None:
    path = _two_pools_yaml(tmp_path)
    result = CliRunner().invoke(
        cli, ["request", "create", "a=5", "b=5", "--config", str(path), "--redis-url", redis_url]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "exceeds the maximum 6" in lines[0], result.output


def test_backend_weights_are_bounded() -> None:
    """Two weights of 1e308 loaded, and then every request of the alias over both pools
    raised inside the plan (their sum is not finite: ValueError, an API 500) instead of a
    config error."""
    data: dict[str, Any] = {
        "config": {"backend_weight": {"c1": 1e308, "c2": 1e308}},
        "pools": [
            {"name": "a", "alias": ["x"], "clone_target": "c1"},
            {"name": "b", "alias": ["x"], "clone_target": "c2"},
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="f.yaml", env={})
    assert str(info.value).startswith("f.yaml: config.backend_weight.c1: must be a number from 0")
    data["config"]["backend_weight"] = {"c1": 1_000_000, "c2": 0}
    config = parse_config(data, source="f.yaml", env={})
    assert [s.pool for s in plan_slots(config, {"x": 3}, random.Random(1))] == ["a"]

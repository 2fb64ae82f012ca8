"""vmpooler's `:config:` keys that vmpool honours where vmpooler reads them, or names
with a warning: the vSphere keys (`create_folders`, `create_linked_clones`,
`create_template_delta_disks`), the 3.8/3.9 rate-limit, circuit-breaker and
adaptive-timeout keys. Each was read and ignored without a word."""

from __future__ import annotations

from typing import Any

import pytest

from vmpool.config import Config, ConfigError, parse_config

VSPHERE = {"server": "vc.example", "username": "u", "password": "p"}


def load(config: dict[str, Any], env: dict[str, str] | None = None, **provider: Any) -> Config:
    data = {
        ":config": config,
        ":providers": {":vsphere": {**VSPHERE, **provider}},
        ":pools": [{"name": "deb", "provider": "vsphere", "folder": "vmpooler/deb"}],
    }
    return parse_config(data, source="vmpooler.yaml", env=env or {})


def test_the_vsphere_keys_in_config_are_the_providers_defaults() -> None:
    options = load({"create_folders": True, "create_linked_clones": True}).providers["vsphere"]
    assert options.options["create_folders"] is True
    assert options.options["create_linked_clones"] is True
    assert "create_template_delta_disks" not in options.options  # not given: the class's
    own = load({"create_folders": True}, create_folders=False).providers["vsphere"]
    assert own.options["create_folders"] is False  # the provider's own wins
    env = load({}, env={"CREATE_TEMPLATE_DELTA_DISKS": "true"}).providers["vsphere"]
    assert env.options["create_template_delta_disks"] is True  # vmpooler's variable


def test_a_vsphere_key_no_provider_reads_is_a_warning() -> None:
    data = {":config": {"create_folders": True}, ":pools": [{"name": "p"}]}
    config = parse_config(data, source="vmpooler.yaml", env={})
    assert (
        "vmpooler.yaml: config.create_folders: no provider here reads it (vsphere does);"
        " ignored" in config.warnings
    )


def test_the_circuit_breaker_keys_map_onto_vmpools_circuit() -> None:
    config = load({"circuit_breaker_failure_threshold": 3, "circuit_breaker_timeout": 45})
    assert (config.provider_circuit_failures, config.provider_circuit_cooldown_s) == (3, 45)
    assert not config.warnings
    ours = load({"circuit_breaker_failure_threshold": 3, "provider_circuit_failures": 8})
    assert ours.provider_circuit_failures == 8  # vmpool's own key wins, said
    assert any("circuit_breaker_failure_threshold: vmpooler 3.8/3.9's key ignored:"
               " provider_circuit_failures is given too" in w for w in ours.warnings)  # fmt: skip


def test_a_bad_circuit_breaker_value_names_the_key_written() -> None:
    with pytest.raises(ConfigError) as info:
        load({"circuit_breaker_failure_threshold": 0})
    assert str(info.value).startswith("vmpooler.yaml: config.circuit_breaker_failure_threshold:")


@pytest.mark.parametrize(
    ("given", "key", "fragment"),
    [
        ({"rate_limiting_enabled": True}, "rate_limiting_enabled", "rate_limit_per_minute"),
        ({"rate_limits": {"vm_creation": {"limit": 5}}}, "rate_limits", "per-address"),
        ({"circuit_breaker_enabled": False}, "circuit_breaker_enabled", "always on"),
        ({"circuit_breaker_half_open_attempts": 3}, "circuit_breaker_half_open_attempts",
         "first success after its cool-down (not after 3)"),
        ({"adaptive_timeout_enabled": True}, "adaptive_timeout_enabled", "adaptive timeout"),
        ({"connection_pool_timeout_max": 60}, "connection_pool_timeout_max", "adaptive"),
    ],
)  # fmt: skip
def test_a_key_whose_meaning_vmpool_has_not_is_a_warning(
    given: dict[str, Any], key: str, fragment: str
) -> None:
    warnings = [w for w in load(given).warnings if f"config.{key}: vmpooler 3.8/3.9's" in w]
    assert len(warnings) == 1 and fragment in warnings[0], load(given).warnings


def test_the_keys_that_change_nothing_are_silent() -> None:
    quiet = {
        "rate_limiting_enabled": False,
        "circuit_breaker_enabled": True,
        "circuit_breaker_half_open_attempts": 1,
        "adaptive_timeout_enabled": False,
    }
    assert not load(quiet).warnings

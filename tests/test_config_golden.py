"""The effective configuration is the same as the code before pydantic made it.

tests/golden/configs.jsonl holds, one per line, a config the test suite built (``data``:
the parsed YAML, ``source``, ``env``: the variables vmpool reads) and ``public``: its
``public_form()`` as the old hand-written parser produced it. tests/golden/demo.json
is the old ``vmpool config show --json`` of the built-in demo. Only the ``:schedule:``
keys differ: they took their periodic jobs' names (the alias table), with the same
values. Comparing JSON text, not dicts, also holds every number's type (``900.0``
stays ``900.0``, not ``900``), which ``vmpool config show`` prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.config import SCHEDULE_KEY_ALIASES, demo_config, parse_config, public_form
from vmpool.config.vmpooler_keys import ENVIRONMENT

GOLDEN = Path(__file__).parent / "golden"
RECORDED = [
    json.loads(line) for line in (GOLDEN / "configs.jsonl").read_text().splitlines() if line.strip()
]


# Defaults changed on purpose since the recording: key -> (recorded value, today's). The
# pending sweep's default is 0.25 s, recorded as 2 s (the demo's 1 s): the simulated
# provider lists, so a short interval is cheap (docs/benchmarks.md "Ready latency").
# A recorded config that sets the key itself keeps its value.
CHANGED_SCHEDULE: dict[str, dict[float, float]] = {"check_pending_sweep": {2.0: 0.25, 1.0: 0.25}}
# Provider classes implemented after the recording (it warned of their instances and left
# them out): their instances, and that warning, are not compared.
ADDED_PROVIDER_CLASSES = ("vsphere",)


def renamed(public: dict[str, Any], data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``public`` as recorded, its schedule keys spelt as today, and the defaults changed
    since (:data:`CHANGED_SCHEDULE`) as they are today unless ``data`` (the recorded
    config's YAML) set them."""
    schedule = {
        SCHEDULE_KEY_ALIASES.get(key, key): value for key, value in public["schedule"].items()
    }
    given = (data or {}).get(":schedule") or (data or {}).get("schedule") or {}
    explicit = {SCHEDULE_KEY_ALIASES.get(key, key) for key in given}
    for key, new in CHANGED_SCHEDULE.items():
        if key in schedule and key not in explicit:
            schedule[key] = new.get(schedule[key], schedule[key])
    warnings = [  # the recording's warning about a class it lacked, implemented since
        w
        for w in public.get("warnings", [])
        if not any(f"provider_class {c!r} is not implemented" in w for c in ADDED_PROVIDER_CLASSES)
    ]
    return {**public, "schedule": schedule, "warnings": warnings}


# Settings the recording does not hold (warm pools, pool keys for providers, the circuit,
# the experimental endpoints, auth's limits and LDAP): not compared.
ADDED_TOP = (
    "task_limit",
    "max_lifetime_upper_limit_s",
    "tagfilter",
    "batch_lanes",
    "provider_quota_wait_s",
    "redis_options",
    "provider_circuit_failures",
    "provider_circuit_cooldown_s",
    "experimental_features",
    "site_name",
    "allowed_tags",
    "quotas",
)
ADDED_POOL = ("ondemand_from_ready", "provider_options", "hold_failed_s")
ADDED_AUTH = (
    "token_ttl_s",
    "max_tokens_per_user",
    "max_failed_logins_per_user",
    "max_failed_logins_per_address",
    "failed_login_window_s",
    "admins",
    "checkout_requires_token",
    "ldap",
)
ADDED_SCHEDULE = ("top_up_pools", "check_ready", "record_history")
# Warnings the recording predates: a vmpooler pool key its provider class does not read,
# a vmpooler :config: key for providers that no provider reads, a vmpooler 3.8/3.9 key
# vmpool does not honour.
ADDED_WARNINGS = (
    "a vmpooler key provider class",
    "no provider here reads it",
    "vmpooler 3.8/3.9's",
)


def recorded_keys(public: dict[str, Any]) -> dict[str, Any]:
    """Today's ``public`` without the settings added since the recording."""
    out = {k: v for k, v in public.items() if k not in ADDED_TOP}
    out["pools"] = [{k: v for k, v in p.items() if k not in ADDED_POOL} for p in public["pools"]]
    out["schedule"] = {k: v for k, v in public["schedule"].items() if k not in ADDED_SCHEDULE}
    if public["auth"] is not None:
        out["auth"] = {k: v for k, v in public["auth"].items() if k not in ADDED_AUTH}
    out["providers"] = {
        name: provider
        for name, provider in public["providers"].items()
        if provider["provider_class"] not in ADDED_PROVIDER_CLASSES
    }
    out["warnings"] = [
        w for w in public["warnings"] if not any(added in w for added in ADDED_WARNINGS)
    ]
    return out


def as_text(public: dict[str, Any]) -> str:
    return json.dumps(public, sort_keys=True)


def test_the_recording_is_there() -> None:
    assert len(RECORDED) > 40
    assert {"data", "source", "env", "public"} <= set(RECORDED[0])


@pytest.mark.parametrize("case", RECORDED, ids=[case["source"][-40:] for case in RECORDED])
def test_recorded_config_parses_to_the_same_public_dict(case: dict[str, Any]) -> None:
    config = parse_config(case["data"], source=case["source"], env=case["env"])
    expected = renamed(case["public"], case["data"])
    assert as_text(recorded_keys(public_form(config))) == as_text(expected)


def test_demo_config_is_the_same() -> None:
    recorded = json.loads((GOLDEN / "demo.json").read_text())
    assert as_text(recorded_keys(public_form(demo_config()))) == as_text(renamed(recorded))


def test_config_show_json_of_the_demo_is_the_same() -> None:
    clean = {name: None for name, _, _ in ENVIRONMENT} | {"VMPOOL_CONFIG": None}
    result = CliRunner().invoke(cli, ["config", "show", "--json"], env=clean)
    assert result.exit_code == 0, result.output
    recorded = json.loads((GOLDEN / "demo.json").read_text())
    assert as_text(recorded_keys(json.loads(result.stdout))) == as_text(renamed(recorded))

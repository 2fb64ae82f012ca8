"""Helpers shared by the dashboard and timeline tests: a fleet of three warm pools (two
of them one group for vmpooler's running stats) and one whose template does not exist."""

from __future__ import annotations

from typing import Any

import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.lifecycle import Fleet

from apihelp import PASSWORD_HASH
from lifecyclehelp import SIM, make_fleet, run_dispatched

MISSING_TEMPLATE = "missing"  # the simulated cloud answers: template not found (permanent)


def three_pools_data(*, auth: bool = False, **config: Any) -> dict[str, Any]:
    """The config file's data: debian-12 (3), debian-11 (2), centos (1), broken (0)."""
    data: dict[str, Any] = {
        ":providers": {
            SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1,
                  "permanent_fail_templates": [MISSING_TEMPLATE]},
        },
        ":config": {"ondemand_request_ttl": 10, "timeout": 1, **config},
        ":pools": [
            {"name": "debian-12", "size": 3, "provider": SIM, "domain": "example.com"},
            {"name": "debian-11", "size": 2, "provider": SIM, "domain": "example.com"},
            {"name": "centos", "size": 1, "provider": SIM, "domain": "example.com"},
            {"name": "broken", "template": MISSING_TEMPLATE, "size": 0, "provider": SIM},
        ],
    }  # fmt: skip
    if auth:
        data[":auth"] = {"provider": "static", "users": {"jdoe": PASSWORD_HASH}}
    return data


def three_pools(*, auth: bool = False, **config: Any) -> Config:
    return parse_config(three_pools_data(auth=auth, **config), source="test", env={})


def filled(redis_client: redis.Redis, config: Config) -> Fleet:
    """A fleet in-process (recording dispatcher) whose warm pools are full."""
    fleet = make_fleet(redis_client, config)
    lifecycle.top_up_pools(fleet)
    run_dispatched(fleet)
    return fleet

"""A pool's placement keys for its cloud: read under vmpooler's names too, checked with
the provider's own (security groups need a subnet, on either), and a vmpooler pool key
the pool's provider does not honour is a warning naming it, never silence.
"""

from __future__ import annotations

from typing import Any

import pytest

from vmpool.config import ConfigError, parse_config

CLOUDS = {
    ":aws": {"provider_class": "ec2", "region": "us-east-1", "ABS_AWS_ACCESS_KEY": "AKID",
             "ABS_AWS_SECRET_KEY": "s", "amisize": "t3.small", "zone": "us-east-1a"},
    ":gcp": {"provider_class": "gce", "project": "p", "zone": "us-central1-a",
             "network_name": "ci-net"},
    ":os": {"provider_class": "openstack", "flavor": "m1.small"},
}  # fmt: skip


def config(*pools: dict[str, Any], **aws: Any) -> Any:
    providers = {**CLOUDS, ":aws": {**CLOUDS[":aws"], **aws}}
    data = {":providers": providers, ":pools": list(pools)}
    return parse_config(data, source="t.yaml", env={})


def test_vmpoolers_pool_keys_are_read_as_the_placement() -> None:
    cfg = config(
        {"name": "a", "provider": "aws", "amisize": "m5.large", "zone": "us-east-1b",
         "volume_size": "20", "subnet_id": "subnet-1", "security_group_ids": ["sg-1"]},
        {"name": "g", "provider": "gcp", "machine_type": "e2-medium", "zone": "europe-west1-b",
         "subnetwork_name": "ci", "disk_type": "pd-ssd"},
        {"name": "o", "provider": "os", "flavor": "m1.large", "availability_zone": "nova-2"},
    )  # fmt: skip
    assert dict(cfg.pools["a"].provider_options) == {
        "instance_type": "m5.large", "availability_zone": "us-east-1b", "volume_size": 20,
        "subnet_id": "subnet-1", "security_group_ids": ["sg-1"],
    }  # fmt: skip
    assert dict(cfg.pools["g"].provider_options) == {
        "machine_type": "e2-medium", "zone": "europe-west1-b", "subnetwork": "ci",
        "disk_type": "pd-ssd",
    }  # fmt: skip
    assert dict(cfg.pools["o"].provider_options) == {
        "flavor": "m1.large",
        "availability_zone": "nova-2",
    }
    # vmpooler's provider-level names (ABS_AWS_*, amisize, zone, network_name) are read too
    assert cfg.warnings == ()


def test_security_groups_need_a_subnet_on_the_pool_or_its_provider() -> None:
    with pytest.raises(ConfigError, match=r"pools\[0\]\.security_group_ids: needs a subnet_id"):
        config({"name": "a", "provider": "aws", "security_group_ids": ["sg-1"]})
    with pytest.raises(ConfigError, match=r"pools\[1\]\.security_group_ids: needs a subnet_id"):
        config({"name": "a", "provider": "aws", "subnet_id": "subnet-1"},
               {"name": "b", "provider": "aws"}, security_group_ids=["sg-1"])  # fmt: skip
    ok = config({"name": "a", "provider": "aws", "security_group_ids": ["sg-1"]},
                subnet_id="subnet-1")  # fmt: skip
    assert ok.pools["a"].provider_options["security_group_ids"] == ["sg-1"]


def test_bad_placement_values_name_the_pool_key() -> None:
    with pytest.raises(ConfigError, match=r"pools\[0\]\.volume_size: must be a size in GB"):
        config({"name": "a", "provider": "aws", "volume_size": "big"})
    with pytest.raises(ConfigError, match=r"pools\[0\]\.ready_check: must be ssh or state"):
        config({"name": "a", "provider": "aws", "ready_check": "ping"})


def test_a_vmpooler_key_nothing_honours_is_a_warning_naming_it() -> None:
    cfg = config(
        {"name": "sim", "zone": "us-east-1b", "subnetwork_name": "x", "amisize": "t3.large"},
        {"name": "g", "provider": "gcp", "project": "other-project", "folder": "f"},
        {"name": "a", "provider": "aws", "disk_type": "gp3"},
    )
    warned = sorted(w.split(": ", 1)[1] for w in cfg.warnings)
    assert warned == sorted(
        f"{key}: a vmpooler key provider class {cls!r} does not honour; ignored"
        for key, cls in (
            ("pools[0].zone", "simulated"), ("pools[0].subnetwork_name", "simulated"),
            ("pools[0].amisize", "simulated"), ("pools[1].project", "gce"),
            ("pools[1].folder", "gce"), ("pools[2].disk_type", "ec2"),
        )
    )  # fmt: skip
    assert cfg.pools["sim"].provider_options == {}

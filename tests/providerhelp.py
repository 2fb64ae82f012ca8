"""Helpers shared by the provider contract tests: a provider under test and the
libcloud providers over the in-memory clouds of tests/cloudfakes.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from vmpool.providers import Provider
from vmpool.providers.cloud import EC2Provider, GCEProvider, OpenStackProvider
from vmpool.providers.cloud.common import CloudProvider
from vmpool.state.keys import Keys

import cloudfakes

CLOUDS: dict[str, tuple[type[CloudProvider], dict[str, Any]]] = {
    "ec2": (EC2Provider, {}),
    "gce": (GCEProvider, {"project": "proj", "zone": "us-central1-a"}),
    "openstack": (OpenStackProvider, {"flavor": "m1.small"}),
}


@dataclass
class Subject:
    """A provider under test, with what the test needs to know of its cloud."""

    provider: Provider
    kind: str
    cloud: cloudfakes.FakeCloud | None = None
    slept: list[float] = field(default_factory=list)
    template: str = "img-1"  # an image the cloud has (moto validates them)


def mock_cloud(
    monkeypatch: pytest.MonkeyPatch, kind: str, fleet: str = "fleet-a", **options: Any
) -> Subject:
    cloud, driver = cloudfakes.install(monkeypatch, kind)
    cls, base = CLOUDS[kind]
    slept: list[float] = []
    options = {**base, "ready_check": "state", "fleet_id": fleet, **options}
    provider = cls(None, Keys("vmpool"), "cloud", options, driver=driver, sleep=slept.append)
    return Subject(provider, kind, cloud, slept)

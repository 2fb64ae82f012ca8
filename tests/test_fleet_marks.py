"""The fleet id a cloud provider tags its VMs with: the fleet's identity from Redis
unless its ``fleet_id`` option says otherwise, shown by ``GET /status`` and
``vmpool fleet-id``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from vmpool.cli.main import cli
from vmpool.config import load_config
from vmpool.providers import PermanentProviderError
from vmpool.providers.cloud import EC2Provider, GCEProvider
from vmpool.state.fleet_identity import fleet_identity
from vmpool.state.keys import Keys

from apihelp import make_app

CONFIG = """
:providers:
  :aws: {provider_class: ec2, region: us-east-1}
  :old: {provider_class: ec2, fleet_id: vmpool}
:pools:
  - {name: a, provider: aws, template: ami-1}
  - {name: b, provider: old, template: ami-1}
  - {name: c}
"""


def test_providers_mark_with_the_fleets_identity(redis_client: redis.Redis) -> None:
    keys = Keys("vmpool")
    aws = EC2Provider(redis_client, keys, "aws", {})
    gce = GCEProvider(redis_client, keys, "gcp", {"project": "p", "zone": "z"})
    assert aws.fleet_id == gce.fleet_id == fleet_identity(redis_client, keys)
    assert aws.tags("pool", "vm-1", "r")["vmpool-fleet"] == aws.fleet_id
    assert EC2Provider(redis_client, keys, "x", {"fleet_id": "mine"}).fleet_id == "mine"
    # Another Redis prefix is another install: another identity.
    assert EC2Provider(redis_client, Keys("other"), "aws", {}).fleet_id != aws.fleet_id
    with pytest.raises(PermanentProviderError, match="no fleet_id and no Redis"):
        _ = EC2Provider(None, keys, "aws", {}).fleet_id
    with pytest.raises(PermanentProviderError, match=r"providers\.aws\.fleet_id"):
        EC2Provider(None, keys, "aws", {"fleet_id": ""})


def test_status_and_cli_show_it(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    path = tmp_path / "vmpool.yaml"
    path.write_text(CONFIG)
    identity = fleet_identity(redis_client, Keys("vmpool"))
    with TestClient(make_app(load_config(path), redis_url)) as client:
        fleet = client.get("/api/v3/status").json()["fleet"]
    assert fleet == {"id": identity, "providers": {"aws": identity, "old": "vmpool"}}

    runner = CliRunner()
    out = runner.invoke(
        cli, ["fleet-id", "--json", "--config", str(path), "--redis-url", redis_url]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == fleet
    text = runner.invoke(cli, ["fleet-id", "--config", str(path), "--redis-url", redis_url])
    assert f"fleet identity: {identity}" in text.output
    assert "provider old: vmpool-fleet=vmpool  (its fleet_id option)" in text.output

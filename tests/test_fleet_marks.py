"""The fleet id a cloud provider tags its VMs with: the fleet's identity from Redis
unless its ``fleet_id`` option says otherwise, shown by ``GET /status`` and
``vmpool fleet-id``; the fleet's other marks: listed by every cloud provider, owned
only when adopted; an operator's ``--adopt`` and ``--forget``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from vmpool.cli.main import cli
from vmpool.config import load_config
from vmpool.providers import PermanentProviderError
from vmpool.providers.cloud import EC2Provider, GCEProvider
from vmpool.state.fleet_identity import FleetMarks, MarkRole, fleet_identity, read_marks
from vmpool.state.keys import Keys

import cloudfakes
from apihelp import make_app
from providerhelp import CLOUDS

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
    assert fleet == {"id": identity, "providers": {"aws": identity, "old": "vmpool"}, "marks": {}}

    runner = CliRunner()
    out = runner.invoke(
        cli, ["fleet-id", "--json", "--config", str(path), "--redis-url", redis_url]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == fleet
    text = runner.invoke(cli, ["fleet-id", "--config", str(path), "--redis-url", redis_url])
    assert f"fleet identity: {identity}" in text.output
    assert "provider old: vmpool-fleet=vmpool  (its fleet_id option)" in text.output


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, ["fleet-id", *args])


def test_adopt_and_forget(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> None:
    """``--adopt MARK`` gives MARK the role 'adopted' (the fleet owns its VMs), ``--forget``
    takes it away; the identity itself, a mark the fleet does not have and a malformed
    one are refused in one line, exit 2, changing nothing."""
    path = tmp_path / "vmpool.yaml"
    path.write_text(CONFIG)
    where = ["--config", str(path), "--redis-url", redis_url]
    keys = Keys("vmpool")
    identity = fleet_identity(redis_client, keys)

    out = invoke("--adopt", "vmpool-0123456789ab", *where)
    assert out.exit_code == 0, out.output
    assert "adopted vmpool-0123456789ab: every VM marked with it is the fleet's" in out.stderr
    assert "mark vmpool-0123456789ab: adopted" in out.stdout
    shown = json.loads(invoke("--json", *where).stdout)
    assert shown["marks"] == {"vmpool-0123456789ab": "adopted"} and shown["id"] == identity

    refused = {
        ("--adopt", identity): f"{identity} is the fleet's identity: nothing to adopt",
        ("--forget", identity): f"{identity} is the fleet's identity: nothing to forget",
        ("--forget", "vmpool-ffffffffffff"): "the fleet has no mark vmpool-ffffffffffff",
        ("--adopt", "no spaces"): "a mark is 1 to 63 letters, digits",
    }
    for args, words in refused.items():
        out = invoke(*args, *where)
        assert out.exit_code == 2, (args, out.output)
        assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    both = invoke("--adopt", "a", "--forget", "b", *where)
    assert both.exit_code == 2 and "one at a time" in both.stderr
    assert read_marks(redis_client, keys) == FleetMarks(
        identity, {"vmpool-0123456789ab": MarkRole.ADOPTED}
    )

    out = invoke("--forget", "vmpool-0123456789ab", *where)
    assert out.exit_code == 0 and "forgot vmpool-0123456789ab" in out.stderr
    assert read_marks(redis_client, keys) == FleetMarks(identity, {})


@pytest.mark.parametrize("kind", ["ec2", "gce", "openstack"])
def test_a_provider_lists_every_mark_and_owns_its_own_and_the_adopted(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis, kind: str
) -> None:
    """A cloud provider lists the VMs under its mark and under the fleet's other marks
    (the server-side filter of EC2 and GCE given every one), never another fleet's; the
    inventory says which it owns: its own and the adopted ones, not the legacy or lost
    ones (only the records say which of those are the fleet's)."""
    keys = Keys("vmpool")
    identity = fleet_identity(redis_client, keys)
    roles = {"vmpool": "legacy", "vmpool-lost00000000": "lost", "vmpool-adopted00000": "adopted"}
    redis_client.hset(keys.fleet_marks(), mapping=roles)
    cloud, driver = cloudfakes.install(monkeypatch, kind)
    cls, base = CLOUDS[kind]
    provider = cls(redis_client, keys, "cloud", {**base, "ready_check": "state"}, driver=driver)
    for n, mark in enumerate([identity, *roles, "someone-else"]):
        tags = {"vmpool-fleet": mark, "vmpool-vm": f"vm-{n}", "vmpool-pool": "p"}
        cloud.create(f"vm-{n}", "img-1", "small", tags)

    owned = {vm.name: vm.owned for vm in provider.inventory()}
    assert owned == {"vm-0": True, "vm-1": False, "vm-2": False, "vm-3": True}
    assert provider.fleet_id == identity
    pinned = cls(
        redis_client, keys, "c2", {**base, "fleet_id": "vmpool-lost00000000"}, driver=driver
    )
    marks = pinned.marks.now()  # a pinned mark recorded lost is owned only once adopted
    assert marks.create == "vmpool-lost00000000"
    assert marks.owned == {"vmpool-adopted00000"}

"""Two installs of vmpool with default settings share one EC2 account (moto's server, a
real process on loopback) and never touch each other's instances.

Each install has its own Redis (here: database 0 and database 1 of the test server,
which share no key) and the same default key prefix ``vmpool``. Their fleet identities
are generated in their own Redis, so their instances carry different ``vmpool-fleet``
tags; each reconciles several times with no grace at all (a VM nobody recorded is
destroyed at once) and the other's handed-out VM stays running and ready.

The negative control shows what the test guards against: with one fleet id for both
(the old default, the key prefix), the second install's first reconcile destroys the
first install's handed-out VM.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.local.redis_server import RedisServer
from vmpool.providers.identity import fleet_ids
from vmpool.state.fleet_identity import fleet_identity, read_marks, set_mark
from vmpool.state.names import NameGenerator
from vmpool.state.records import RequestSettings, Slot

from motohelp import MotoServer, boto_ec2

pytestmark = pytest.mark.slow


def install_config(moto: MotoServer, **provider: Any) -> Config:
    data = {
        ":providers": {"aws": {"provider_class": "ec2", **moto.options(), **provider}},
        ":config": {"ondemand_request_ttl": 10, "reconcile_grace": 0, "timeout": 5},
        ":pools": [{"name": "ubuntu", "template": "ami-12c6146b", "provider": "aws"}],
    }
    return parse_config(data, source="test", env={})


def settle(fleet: Fleet) -> None:
    """Run every dispatched job in-process until none is left."""
    dispatch = fleet.dispatch
    assert isinstance(dispatch, RecordingDispatcher)
    for _ in range(100):
        calls = dispatch.take()
        if not calls:
            return
        for job, subject in calls:
            getattr(lifecycle, job)(fleet, subject)
    raise AssertionError("dispatch did not settle")


def ready_request(fleet: Fleet, rid: str) -> str:
    """A request of one VM, run until ready; the VM's name."""
    settings = RequestSettings.from_config(fleet.config)
    assert fleet.store.create_request(rid, [Slot("ubuntu", "ubuntu", 1)], settings, actor="t").ok
    fleet.dispatch.send(Job.PROVISION_REQUEST, [rid])
    for _ in range(20):
        settle(fleet)
        record = fleet.store.get_request(rid)
        assert record is not None
        if record.status == "ready":
            (vm,) = fleet.store.request_vms(rid)
            return vm.name
        lifecycle.check_pending_sweep(fleet)
    raise AssertionError(f"request {rid} never turned ready")


def live_instances(moto: MotoServer) -> dict[str, dict[str, str]]:
    """Every instance moto holds that is not terminated: id -> tags."""
    found = {}
    for reservation in boto_ec2(moto).describe_instances()["Reservations"]:
        for i in reservation["Instances"]:
            if i["State"]["Name"] not in ("terminated", "shutting-down"):
                found[i["InstanceId"]] = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
    return found


@pytest.fixture
def second_redis(redis_url: str) -> Iterator[redis.Redis]:
    """Another install's Redis: database 1 of the test server (no key in common)."""
    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(path="/1"))
    client: redis.Redis = redis.Redis.from_url(url, decode_responses=True)
    assert client.connection_pool.connection_kwargs["db"] == 1
    client.flushdb()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def build(client: redis.Redis, config: Config, seed: int) -> Fleet:
    fleet = Fleet.build(client, config, RecordingDispatcher(), f"worker:{seed}")
    fleet.names = NameGenerator("", random.Random(seed))
    return fleet


def test_two_default_installs_share_an_account(
    moto: MotoServer, redis_client: redis.Redis, second_redis: redis.Redis
) -> None:
    moto.reset()
    config = install_config(moto)
    first, second = build(redis_client, config, 1), build(second_redis, config, 2)
    a_id, b_id = fleet_identity(redis_client, first.keys), fleet_identity(second_redis, second.keys)
    assert a_id != b_id and a_id.startswith("vmpool-")
    assert fleet_ids(redis_client, first.keys, config.providers) == {"aws": a_id}

    vm_a = ready_request(first, "r-first")
    vm_b = ready_request(second, "r-second")
    tags = {t["vmpool-vm"]: t["vmpool-fleet"] for t in live_instances(moto).values()}
    assert tags == {vm_a: a_id, vm_b: b_id}

    for _ in range(3):  # several reconcile rounds of each, no grace
        for fleet in (first, second):
            counts = lifecycle.reconcile(fleet)
            assert not any(k.endswith("_destroyed") for k in counts), counts
            settle(fleet)
    assert {t["vmpool-vm"] for t in live_instances(moto).values()} == {vm_a, vm_b}
    for fleet, rid in ((first, "r-first"), (second, "r-second")):
        record = fleet.store.get_request(rid)
        assert record is not None and record.status == "ready"
        assert [vm.name for vm in fleet.providers["aws"].inventory()] == [
            vm.name for vm in fleet.store.request_vms(rid)
        ]


def test_one_shared_fleet_id_is_what_destroyed_the_other_install(
    moto: MotoServer, redis_client: redis.Redis, second_redis: redis.Redis
) -> None:
    """The negative control: both installs given the same fleet id, the second's
    reconcile takes the first's handed-out VM for a leak and terminates it."""
    moto.reset()
    config = install_config(moto, fleet_id="vmpool")
    first, second = build(redis_client, config, 1), build(second_redis, config, 2)
    vm_a = ready_request(first, "r-first")
    counts = lifecycle.reconcile(second)
    assert counts.get("leaked_destroyed") == 1
    assert vm_a not in {t.get("vmpool-vm") for t in live_instances(moto).values()}


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, so that the test can lose its data for real."""
    server = RedisServer(appendonly=False).start()
    try:
        yield server
    finally:
        server.stop()


def lose_data(server: RedisServer) -> RedisServer:
    """Redis stopped and started again, empty, on the same port (a lost volume, a
    replica with no data promoted): the clients reconnect to a Redis that knows nothing."""
    port = server.port
    server.stop()
    return RedisServer(port=port, appendonly=False).start()


def test_redis_losing_its_data_under_a_running_fleet_destroys_no_vm(
    moto: MotoServer, own_redis: RedisServer
) -> None:
    """Redis loses its data while a worker runs and VMs of the fleet run in the cloud.

    The running fleet keeps creating (a request made after the loss), a process started
    after the loss joins it, and both reconcile with no grace and sweep the pending VMs
    several times: no instance is destroyed, the request made after the loss stays
    ready (not ended as vanished), nothing takes the key prefix as its mark, and the old
    identity is a lost mark until the operator adopts it (its VMs with no record are
    then destroyed). On the naive code the running worker's reconcile destroys every VM
    made before the loss (none has a record any more)."""
    moto.reset()
    client: redis.Redis = redis.Redis.from_url(own_redis.url, decode_responses=True)
    config = install_config(moto)
    running = build(client, config, 1)
    before = fleet_identity(client, running.keys)
    made_before = {ready_request(running, "r-1"), ready_request(running, "r-2")}

    own_redis = lose_data(own_redis)
    try:
        made_after = ready_request(running, "r-3")
        joined = build(client, config, 2)
        for _ in range(3):
            for fleet in (running, joined):
                counts = lifecycle.reconcile(fleet)
                assert not any(k.endswith("_destroyed") for k in counts), counts
                settle(fleet)
                lifecycle.check_pending_sweep(fleet)
                settle(fleet)
        live = {t["vmpool-vm"]: t["vmpool-fleet"] for t in live_instances(moto).values()}
        assert made_before | {made_after} <= set(live), live
        assert {live[name] for name in made_before} == {before}
        record = joined.store.get_request("r-3")
        assert record is not None and record.status == "ready"
        assert running.keys.prefix not in fleet_ids(client, joined.keys, config.providers).values()
        marks = read_marks(client, joined.keys)
        assert marks is not None and marks.lost == (before,)
        assert live[made_after] == marks.identity != before

        # The operator's word: the old mark is the fleet's again, its VMs with no record
        # are leaks; the one made after the loss has its record and stays.
        assert set_mark(client, running.keys, "adopt", before) == "adopted"
        assert lifecycle.reconcile(joined) == {"leaked_destroyed": 2}
        assert {t["vmpool-vm"] for t in live_instances(moto).values()} == {made_after}
    finally:
        own_redis.stop()


@pytest.mark.parametrize("kept", ["none", "prefix"])
def test_two_upgraded_installs_keep_apart(
    moto: MotoServer, redis_client: redis.Redis, second_redis: redis.Redis, kept: str
) -> None:
    """Two installs upgraded from a version that marked its VMs with the key prefix share
    an account: both have the default prefix, so all their VMs carry
    ``vmpool-fleet=vmpool``, and each Redis holds the records of its own. ``kept``: what
    the Redis holds as identity after the upgrade: none (the version before identities)
    or the prefix (what an upgrade rule of the next version wrote).

    After the upgrade each install keeps its own VMs (requests ready, their VMs not
    vanished) and neither destroys the other's, over several reconcile rounds with no
    grace; new VMs get a mark of their own. On the naive code both took the prefix as
    their identity and the first reconcile destroyed the other install's VM."""
    moto.reset()
    older = install_config(moto, fleet_id="vmpool")
    first, second = build(redis_client, older, 1), build(second_redis, older, 2)
    vm_a, vm_b = ready_request(first, "r-first"), ready_request(second, "r-second")
    for client in (redis_client, second_redis):
        if kept == "prefix":
            client.set(first.keys.fleet_identity(), first.keys.prefix)
        else:
            client.delete(first.keys.fleet_identity())

    config = install_config(moto)
    first, second = build(redis_client, config, 3), build(second_redis, config, 4)
    for _ in range(3):
        for fleet in (first, second):
            counts = lifecycle.reconcile(fleet)
            assert not any(k.endswith("_destroyed") for k in counts), counts
            settle(fleet)
            lifecycle.check_pending_sweep(fleet)
            settle(fleet)
    assert {t["vmpool-vm"] for t in live_instances(moto).values()} == {vm_a, vm_b}
    for fleet, rid in ((first, "r-first"), (second, "r-second")):
        record = fleet.store.get_request(rid)
        assert record is not None and record.status == "ready"
    vm_c = ready_request(first, "r-third")
    tags = {t["vmpool-vm"]: t["vmpool-fleet"] for t in live_instances(moto).values()}
    assert tags[vm_c] == fleet_identity(redis_client, first.keys) != first.keys.prefix

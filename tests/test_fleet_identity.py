"""The fleet id is generated once per Redis, kept there, and the same for every caller."""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import default_redis_options, load_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.providers import SimulatedProvider
from vmpool.state.connection import connect
from vmpool.state.durability import DurabilitySetting, WriteNotConfirmed
from vmpool.state.fleet_identity import fleet_identity
from vmpool.state.keys import Keys
from vmpool.state.records import Slot
from vmpool.state.store import Store

from lifecyclehelp import SIM, create_request, make_config, make_fleet, run_dispatched
from storehelp import make_request


def test_generated_once_and_kept(redis_client: redis.Redis) -> None:
    keys = Keys()
    first = fleet_identity(redis_client, keys)
    assert re.fullmatch(r"vmpool-[0-9a-f]{12}", first)
    assert fleet_identity(redis_client, keys) == first
    assert redis_client.get(keys.fleet_identity()) in (first, first.encode())


def test_another_redis_database_gets_another(redis_url: str, redis_client: redis.Redis) -> None:
    """Two installs (here: two prefixes in one database) never share an id by default."""
    assert fleet_identity(redis_client, Keys("a")) != fleet_identity(redis_client, Keys("b"))


def test_processes_starting_together_agree(redis_client: redis.Redis) -> None:
    keys = Keys()
    barrier = threading.Barrier(8)
    seen: list[str] = []

    def start() -> None:
        barrier.wait()
        seen.append(fleet_identity(redis_client, keys))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1


def test_an_upgraded_redis_keeps_the_prefix(redis_client: redis.Redis) -> None:
    """VM records and no identity: an older version made them and marked them with the
    prefix, so the identity is the prefix (the upgrade keeps seeing its VMs)."""
    keys = Keys()
    make_request(Store(redis_client, keys), "11111111-1111-4111-8111-111111111111", n=1)
    assert fleet_identity(redis_client, keys) == keys.prefix


def test_a_new_fleet_settles_its_identity_before_its_first_vm(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Fleet.build settles the identity, so the new fleet's own first VM record does not
    look like an older fleet's: without that, the identity made lazily at the first
    create would find that VM and take the prefix, the mark two installs would share."""
    path = tmp_path / "vmpool.yaml"
    path.write_text(
        ":providers:\n  :aws: {provider_class: ec2, region: us-east-1}\n"
        ":pools:\n  - {name: debian, provider: aws, template: ami-1}\n"
    )
    config = load_config(path)
    fleet = Fleet.build(redis_client, config, RecordingDispatcher(), "worker:test:1")
    make_request(fleet.store, "22222222-2222-4222-8222-222222222222", n=1)
    identity = fleet_identity(redis_client, fleet.keys)
    assert identity != fleet.keys.prefix and identity.startswith("vmpool-")


def lose_fleet_data(client: redis.Redis, keys: Keys) -> None:
    """Redis loses the fleet's data; the cloud keeps its VMs.

    Every key of the fleet goes but the simulated cloud's: its VMs stand for a real
    cloud's, which a lost Redis leaves running."""
    cloud = f"{keys.prefix}:sim:"
    for key in list(client.scan_iter(match=f"{keys.prefix}:*", count=1000)):
        if not str(key).startswith(cloud):
            client.delete(key)


def test_a_running_fleet_that_lost_its_redis_data_destroys_nothing(
    redis_client: redis.Redis,
) -> None:
    """Redis loses the fleet's data while a worker runs and its VMs run in the
    (simulated) cloud. The running worker's reconcile, with no grace and several times,
    destroys none of them: none has a record any more, and the fleet does not know
    whether a user still holds one. On the naive code it destroyed them all as leaks."""
    config = make_config(reconcile_grace_s=0)
    fleet = make_fleet(redis_client, config)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], config)
    fleet.dispatch.provision_request("r1")
    run_dispatched(fleet)
    sim = fleet.providers[SIM]
    assert isinstance(sim, SimulatedProvider) and sim.count() == 2
    record = fleet.store.get_request("r1")
    assert record is not None and record.status == "ready"

    lose_fleet_data(redis_client, fleet.keys)
    for _ in range(3):
        counts = lifecycle.reconcile(fleet)
        assert not any(k.endswith("_destroyed") for k in counts), counts
        run_dispatched(fleet)
    assert sim.count() == 2


def test_the_identity_is_written_only_once_confirmed(redis_url: str) -> None:
    """The identity's write goes through the durability confirmation: a client that
    waits for a replica the Redis does not have is told the write is not confirmed
    (and kept from using an identity a failover could take back). On the naive code a
    plain SET NX was acknowledged at once."""
    setting = DurabilitySetting(mode="replicas", replicas=1, timeout_s=0.2)
    options = dataclasses.replace(default_redis_options(), durability=setting)
    client = connect(redis_url, options, decode_responses=True)
    try:
        client.flushdb()
        with pytest.raises(WriteNotConfirmed):
            fleet_identity(client, Keys())
    finally:
        client.close()

"""The fleet id is generated once per Redis, kept there, and the same for every caller."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import redis

from vmpool.config import load_config
from vmpool.lifecycle import Fleet, RecordingDispatcher
from vmpool.state.fleet_identity import fleet_identity
from vmpool.state.keys import Keys
from vmpool.state.store import Store

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

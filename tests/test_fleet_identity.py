"""The fleet id is generated once per Redis, kept there, and the same for every caller."""

from __future__ import annotations

import re
import threading

import redis

from vmpool.state.fleet_identity import fleet_identity
from vmpool.state.keys import Keys


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

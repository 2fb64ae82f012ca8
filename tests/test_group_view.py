"""Which replicas a write through Sentinel waits for, from what the sentinels report.

What this proves: a replica that every sentinel shows as ``disconnected`` but that still
answers is waited for. That is the replica a sentinel is promoting: it kills the
replica's clients (the sentinels' links) as it sends ``REPLICAOF NO ONE``, while
the old primary still takes writes that only the other replica follows. Counted as
down, it made the count 1 and ``WAIT 1`` acknowledged writes the promotion lost (seen in
the chaos soak's planned switch: two acknowledged creates missing). A replica the
sentinels hold down, or one neither they nor the watch reach, is still not waited for.

The sentinel replies are given as redis-py parses ``SENTINEL REPLICAS`` (the flags as
``is_*`` fields), and whether the watch reaches a server as a function: the decision is
tested, not a Redis.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from vmpool.config import default_redis_options
from vmpool.state import connection
from vmpool.state.group_watch import Address, GroupView, replicas_seen
from vmpool.state.switchover import group_access

from sentinelhelp import sentinel_group
from storehelp import wait_until

PROMOTING: Address = ("127.0.0.1", 41213)
FOLLOWING: Address = ("127.0.0.1", 57445)


def seen(address: Address, *flags: str, priority: int = 100) -> dict[str, Any]:
    state: dict[str, Any] = {"ip": address[0], "port": address[1], "slave-priority": priority}
    state.update({f"is_{flag}": True for flag in flags})
    return state


def must_hold(answers: list[list[dict[str, Any]]], reachable: set[Address]) -> int:
    """The count a write waits for, the primary linked to FOLLOWING only."""
    replicas = replicas_seen(answers, lambda address: address in reachable)
    return GroupView(("127.0.0.1", 58027), replicas, frozenset({FOLLOWING})).must_hold()


def test_the_replica_being_promoted_is_waited_for() -> None:
    answers = [[seen(PROMOTING, "disconnected"), seen(FOLLOWING)] for _ in range(3)]
    assert must_hold(answers, reachable={PROMOTING, FOLLOWING}) == 2


def test_a_replica_gone_is_not_waited_for() -> None:
    # disconnected for every sentinel and for the watch: a server killed, not yet held down
    answers = [[seen(PROMOTING, "disconnected"), seen(FOLLOWING)] for _ in range(3)]
    assert must_hold(answers, reachable={FOLLOWING}) == 1
    # held down by a majority (the sentinels do not promote it), whatever the watch reaches
    answers = [[seen(PROMOTING, "sdown"), seen(FOLLOWING)] for _ in range(2)]
    answers.append([seen(PROMOTING, "disconnected"), seen(FOLLOWING)])
    assert must_hold(answers, reachable={PROMOTING, FOLLOWING}) == 1


def test_a_minority_of_sentinels_does_not_make_a_replica_down() -> None:
    answers = [[seen(PROMOTING, "sdown"), seen(FOLLOWING)]]
    answers += [[seen(PROMOTING), seen(FOLLOWING)] for _ in range(2)]
    assert must_hold(answers, reachable={FOLLOWING}) == 2


def test_a_replica_of_priority_0_is_not_waited_for() -> None:
    answers = [[seen(PROMOTING, priority=0), seen(FOLLOWING)] for _ in range(3)]
    assert must_hold(answers, reachable={PROMOTING, FOLLOWING}) == 1


@pytest.mark.slow
def test_a_planned_switch_never_lowers_the_count_while_the_old_primary_is_named(
    tmp_path: Path,
) -> None:
    """Through a real ``SENTINEL FAILOVER`` (two replicas, both alive throughout), every
    view that names the old primary waits for both replicas. With the disconnected
    replica counted as down, views read while the sentinel promotes it wait for one."""
    with sentinel_group(tmp_path, replicas=2, down_after_ms=5000) as group:
        access = group_access(group.url, default_redis_options())
        old = group.current_primary()
        counts: list[int] = []
        group.failover()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # as fast as views can be read, until moved
            view = access.view()
            if view.primary is not None and view.primary[1] != old.port:
                break
            if view.primary is not None:
                counts.append(view.must_hold())
        else:
            pytest.fail("the sentinels named no new primary within 30 s")
    assert counts and min(counts) == 2, Counter(counts)


def test_the_replication_reader_keeps_a_client_for_the_addresses_asked_last(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A server asked at a new address (a pod restarted elsewhere) gets a client of its
    own; beyond ``keep`` addresses the one asked longest ago is closed. Red when every
    client was kept open: two connections named here stay on the server."""
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    reader = connection._ReplicationReader({"client_name": "reader-test"}, keep=1)
    assert reader(("127.0.0.1", port))["role"] == "master"
    assert reader(("localhost", port))["role"] == "master"  # another address, same server

    def named() -> int:
        return sum(c.get("name") == "reader-test" for c in redis_client.client_list())

    wait_until(lambda: named() == 1)
    assert list(reader.clients) == [("localhost", port)]

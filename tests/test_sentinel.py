"""Redis through Sentinel: a failover followed without restarts, and no acknowledged
write lost across it (docs/invariants.md, invariant 9), against real servers: a primary, a
replica and three sentinels, ``valkey-server`` processes on loopback ports started
here and stopped by pid (tests/sentinelhelp.py).

What this proves:
- a client of the connection factory given a ``redis+sentinel://`` URL follows a
  failover by itself (no new client, no restart), and a client left on a primary that
  became a replica (READONLY) reconnects to the new primary;
- the primary killed under a writer and, once a replica is promoted, restarted on its
  own data (as in the issue: it is a primary again until the sentinels turn it into a
  replica): every create the store acknowledged is on the promoted primary, and the
  writer is served again within 15 s of the promotion (with one replica, the promoted
  primary confirms writes once the old one is back as its replica);
- a lagging replica (its replication link stalled through a proxy before the primary
  dies, so the primary holds writes the replica lacks): what the store acknowledged
  survives, while a client that does not wait for the replica (durability none) was
  told "done" for writes the failover lost: the loss WAIT prevents, made visible;
- the startup check says what the writes wait for through Sentinel, and names
  durability none as a risk;
- the primary is the server a majority of the sentinels name, not the first one's.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from vmpool.config import default_redis_options
from vmpool.local.redis_server import free_port
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.redis_check import check_redis
from vmpool.state.store import Store

from sentinelhelp import DATA_PASSWORD, Node, SentinelGroup, sentinel_group, wait_for

pytestmark = pytest.mark.slow

SETTINGS = RequestSettings(ttl_s=600, grace_s=0, max_vm_retries=1, vm_lifetime_s=3600,
                           data_ttl_s=3600)  # fmt: skip
SERVED_AGAIN_S = 15.0


def options(mode: str = "auto") -> RedisOptions:
    setting = DurabilitySetting(mode=mode, replicas=None, timeout_s=1.0)  # type: ignore[arg-type]
    return dataclasses.replace(default_redis_options(), durability=setting)


def store(url: str, mode: str = "auto") -> Store:
    return Store(connect(url, options(mode), decode_responses=True), Keys("t"))


class Creator(threading.Thread):
    """Creates requests one after another; keeps those the store acknowledged, with
    the time each was acknowledged."""

    def __init__(self, target: Store) -> None:
        super().__init__(daemon=True)
        self.store = target
        self.acked: list[tuple[float, str]] = []
        self.refused = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            rid = str(uuid.uuid4())
            try:
                outcome = self.store.create_request(rid, [Slot("p", "p", 1)], SETTINGS,
                                                    actor="test")  # fmt: skip
            except redis.RedisError:
                self.refused += 1
                time.sleep(0.05)
                continue
            assert outcome.ok, outcome
            self.acked.append((time.monotonic(), rid))

    def stop(self) -> None:
        self.halt.set()
        self.join(20)

    def served_after(self, since: float, what: str) -> float:
        """Seconds from ``since`` (monotonic) to the first create acknowledged after it,
        waiting for one up to ``SERVED_AGAIN_S`` + 15 s."""
        wait_for(lambda: any(t > since for t, _ in self.acked), SERVED_AGAIN_S + 15, what)
        return min(t for t, _ in self.acked if t > since) - since


def killed_under_writes(group: SentinelGroup, creator: Creator) -> tuple[Node, Node]:
    """Once ``creator`` has 20 creates acknowledged, the primary killed and the
    sentinels' failover done: (the old primary, the new)."""
    wait_for(lambda: len(creator.acked) >= 20, 20, "creates before the fault")
    old = group.current_primary()
    old.kill()
    return old, group.wait_failover(old)


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path) as started:
        yield started


def missing(group: SentinelGroup, rids: list[str]) -> list[str]:
    reader = store(group.url, "none")
    return [rid for rid in rids if reader.get_request(rid) is None]


def test_a_failover_with_the_old_primary_back_loses_no_acknowledged_create(
    group: SentinelGroup,
) -> None:
    creator = Creator(store(group.url))
    assert creator.store.redis.durability.replicas == 1  # auto, through Sentinel
    creator.start()
    try:
        old, new = killed_under_writes(group, creator)
        promoted = time.monotonic()
        old.start()  # back on its own data: a primary again until the sentinels see it
        served_after = creator.served_after(promoted, "a create acknowledged after the failover")
        group.wait_settled()
    finally:
        creator.stop()
    assert new is not old
    assert missing(group, [rid for _, rid in creator.acked]) == []
    assert served_after < SERVED_AGAIN_S, served_after


def test_a_failover_and_one_back_lose_no_acknowledged_create(group: SentinelGroup) -> None:
    """The primary is killed, restarted as the new one's replica; then the new primary
    freezes (SIGSTOP) past the sentinels' down-after, so they fail over back to the
    first. A loaded machine does this by itself (a pause of a second is enough), and the
    old primary never becomes a replica again: the test waits for the group to settle on
    whichever primary the sentinels name, not for one node's role. Every create
    acknowledged across both failovers is on the primary at the end."""
    creator = Creator(store(group.url))
    creator.start()
    try:
        first, second = killed_under_writes(group, creator)
        first.start()
        group.wait_settled()
        creator.served_after(time.monotonic(), "a create acknowledged on the second primary")
        second.pause()
        try:
            back = group.wait_failover(second)
        finally:
            second.resume()
        promoted = time.monotonic()
        assert group.wait_settled() is back
        creator.served_after(promoted, "a create acknowledged after the failover back")
    finally:
        creator.stop()
    assert back is first
    assert missing(group, [rid for _, rid in creator.acked]) == []


def test_a_client_left_on_a_demoted_primary_reconnects_to_the_new_one(
    group: SentinelGroup,
) -> None:
    """SENTINEL FAILOVER demotes the primary while the client holds pooled connections
    to it: the next write meets READONLY, and redis-py's Sentinel pool asks the
    sentinels again: the same client writes to the new primary, no restart."""
    target = store(group.url)
    rid = str(uuid.uuid4())
    assert target.create_request(rid, [Slot("p", "p", 1)], SETTINGS, actor="test").ok
    old = group.current_primary()
    with group.sentinels[0].client() as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", "vmpool-test")
    group.wait_failover(old)
    second = str(uuid.uuid4())

    def created() -> bool:
        try:
            return target.create_request(second, [Slot("p", "p", 1)], SETTINGS,
                                         actor="test").ok  # fmt: skip
        except redis.RedisError:
            return False

    wait_for(created, 30, "a write after the failover", step=0.2)
    assert missing(group, [rid, second]) == []
    check = check_redis(target.redis)
    assert check.via_sentinel and check.durability_text().startswith("WAIT 1")


def test_a_lagging_replica_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """The replica's replication link (through a proxy) stalls; then the primary dies.
    Writes made meanwhile were not confirmed by the replica: the store refused to
    acknowledge them (WriteNotConfirmed), a client without durability was told they
    were done. After the failover every acknowledged create is there; of the other
    client's writes, those of the stall are gone."""
    with sentinel_group(tmp_path, proxied_replication=True) as group:
        safe = Creator(store(group.url))
        unsafe = Creator(store(group.url, "none"))
        for creator in (safe, unsafe):
            creator.start()
        try:
            wait_for(lambda: len(safe.acked) >= 10 and len(unsafe.acked) >= 10, 20,
                     "creates before the stall")  # fmt: skip
            group.link_proxies[0].stall()
            stalled = time.monotonic()
            wait_for(lambda: safe.refused >= 1, 10, "a create refused as unconfirmed")
            old = group.current_primary()
            old.kill()
            group.link_proxies[0].resume()
            group.wait_failover(old)
        finally:
            safe.stop()
            unsafe.stop()
        assert missing(group, [rid for _, rid in safe.acked]) == []
        during = [rid for t, rid in unsafe.acked if t > stalled]
        assert during and missing(group, during), "nothing acknowledged in the stall was lost"


def test_durability_none_through_sentinel_is_named(group: SentinelGroup) -> None:
    check = check_redis(store(group.url, "none").redis)
    assert check.via_sentinel and check.role == "master" and check.replicas == 1
    assert any("failover loses the acknowledged writes" in p for p in check.problems())
    assert check_redis(store(group.url).redis).problems() == []


def test_the_primary_is_the_one_a_majority_of_the_sentinels_name(
    group: SentinelGroup, tmp_path: Path
) -> None:
    """One sentinel names another server (as a sentinel that has not heard of a
    failover names the old primary, back on its own data): redis-py's own discovery
    takes the first sentinel's word and writes there; vmpool's takes the majority's."""
    impostor_dir = tmp_path / "impostor"
    impostor_dir.mkdir()
    args = ["--save", "", "--requirepass", DATA_PASSWORD]
    impostor = Node("impostor", free_port(), impostor_dir, args, password=DATA_PASSWORD).start()
    try:
        with group.sentinels[0].client() as liar:
            liar.execute_command("SENTINEL", "REMOVE", "vmpool-test")
            liar.execute_command("SENTINEL", "MONITOR", "vmpool-test", "127.0.0.1",
                                 str(impostor.port), "2")  # fmt: skip
        assert group.url.split("@", 1)[1].startswith(f"127.0.0.1:{group.sentinels[0].port}")
        ours = connect(group.url, options("none"), decode_responses=True)
        ours.set("majority:key", "1")
        theirs = Sentinel([("127.0.0.1", s.port) for s in group.sentinels])
        theirs.master_for("vmpool-test", password=DATA_PASSWORD).set("first:key", "1")
        with impostor.client() as wrong, group.current_primary().client() as right:
            assert right.get("majority:key") == b"1" and wrong.get("majority:key") is None
            assert wrong.get("first:key") == b"1"  # what the test guards against
    finally:
        impostor.stop()

"""The audit trail's storage: a list of packed entries, bytes per entry.

A Redis stream would preallocate about 4 KB per request. The trail is a list of JSON
arrays. These tests prove the entries are complete (every field of
every transition, in order, versions contiguous), that the size is bytes per entry, and
that a trail an older release wrote as a stream (a request open across the upgrade)
is still read and still appended to.
"""

from __future__ import annotations

import redis

from vmpool.state.audit import check_trail
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from storehelp import ACTOR, make_request


def test_the_trail_is_a_compact_list_with_every_entry(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: each transition is one packed list entry with all its fields, and the
    whole trail of a request with two VMs made ready costs well under a kilobyte."""
    store = Store(redis_client, keys)
    names = make_request(store, "r1", 2)
    for name in names:  # make_request reserved and created them
        assert store.vm_ready(name, actor=ACTOR).ok
    key = keys.request_audit("r1")
    assert redis_client.type(key) == "list"
    trail = store.history("r1")
    assert [e.version for e in trail] == list(range(1, len(trail) + 1))
    assert (trail[0].entity, trail[0].src, trail[0].dst) == ("request", "none", "pending")
    assert (trail[-1].entity, trail[-1].dst) == ("request", "ready")
    assert all(e.actor == ACTOR and e.time > 0 for e in trail)
    assert check_trail("r1", trail) == []
    assert int(redis_client.memory_usage(key, samples=0) or 0) < 1024


def test_an_older_stream_trail_is_read_and_appended_to(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: a request whose trail an older release wrote as a stream keeps a complete,
    readable trail after the upgrade (the scripts append to the stream)."""
    store = Store(redis_client, keys)
    names = make_request(store, "old", 1, created=False)
    key = keys.request_audit("old")
    old = store.history("old")
    redis_client.delete(key)
    for e in old:  # as the older release wrote it
        redis_client.xadd(key, {"entity": e.entity, "from": e.src, "to": e.dst,
                                "version": e.version, "actor": e.actor, "reason": e.reason,
                                "time": e.time})  # fmt: skip
    assert store.vm_created(names[0], actor=ACTOR).ok
    assert redis_client.type(key) == "stream"
    trail = store.history("old")
    assert [e.version for e in trail] == list(range(1, len(old) + 2))
    assert (trail[-1].entity, trail[-1].dst) == (f"vm:{names[0]}", "pending")
    assert check_trail("old", trail) == []

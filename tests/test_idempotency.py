"""A mutating call whose reply is lost after its script ran changes the data once.

redis-py sends a command again when its connection fails (vmpool/state/connection.py:
one retry on a connection error or a timeout). A proxy between the client and a real
Redis forwards the call, lets the server run it, then drops the reply and closes the
connection (``FaultProxy.lose_replies``); the retry runs on a new connection. Each
mutating store call of the table runs twice on the same fresh state: once through a
healthy proxy (the control), once with its reply lost. Both must answer the same and
leave the same data: the retry is answered from the first run's record
(vmpool/state/ops.py, _once.lua) and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from vmpool.local.redis_server import RedisServer, free_port
from vmpool.state.connection import RedisOptions, connect, connect_async
from vmpool.state.durability import DurabilitySetting
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptPipeline
from vmpool.state.ops import new_op
from vmpool.state.overrides import clear_override, set_overrides
from vmpool.state.records import Outcome, Slot
from vmpool.state.semaphore import CloneSemaphore, SlotTerms
from vmpool.state.store import Store
from vmpool.state.tokens import MintedToken, TokenStore
from vmpool.state.vm_tasks import VMTask

from sentinelhelp import HOST, FaultProxy, Node, wait_for
from storehelp import ACTOR, make_ready, make_request, settings

POOL = "debian"
RID = "req-1"


def options(durability: str = "none", replicas: int = 0) -> RedisOptions:
    setting = DurabilitySetting(durability, replicas, 2.0)  # type: ignore[arg-type]
    return RedisOptions(5.0, 2.0, 0, setting)


@dataclass
class Parts:
    """The store, the token store and the plain client of one proxied connection."""

    store: Store
    tokens: TokenStore
    redis: redis.Redis

    @property
    def keys(self) -> Keys:
        return self.store.keys


def proxied(proxy: FaultProxy, db: int, opts: RedisOptions) -> Parts:
    client = connect(f"redis://{HOST}:{proxy.port}/{db}", opts, decode_responses=True)
    keys = Keys()
    return Parts(Store(client, keys), TokenStore(client, keys), client)


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    fault = FaultProxy(urlsplit(redis_url).port or 6379).start()
    try:
        yield fault
    finally:
        fault.stop()


def shape(r: redis.Redis) -> list[tuple[str, str, int, str | None]]:
    """What the data looks like: each key (token digests masked), its type, its size and
    a record's state. Operation records are left out: they are the mechanism."""
    sizes: dict[str, Callable[[str], Any]] = {
        "hash": r.hlen, "list": r.llen, "zset": r.zcard, "set": r.scard, "string": r.strlen,
    }  # fmt: skip
    out = []
    for key in sorted(str(k) for k in r.keys("*")):
        if ":op:" in key:
            continue
        kind = str(r.type(key))
        state = r.hget(key, "state") if kind == "hash" else None
        masked = re.sub("[0-9a-f]{64}", "SHA", key)
        out.append((masked, kind, int(sizes[kind](key)), None if state is None else str(state)))
    return out


def checked_out(p: Parts, n: int = 1) -> list[str]:
    names = make_ready(p.store, POOL, n)
    assert p.store.pools.checkout(
        {POOL: n}, owner="alice", owner_hash="", lifetime_s=3600, actor=ACTOR
    ).ok
    return names


def _minted(m: MintedToken) -> tuple[bool, int]:
    return (m.expires is None, m.dropped)


@dataclass(frozen=True)
class Case:
    """A mutating call: ``setup`` makes the state it acts on, ``call`` makes it."""

    setup: Callable[[Parts], Any]
    call: Callable[[Parts, Any], Any]
    marker: bytes = b"EVALSHA"


def _nothing(p: Parts) -> None:
    return None


def _task(p: Parts) -> VMTask:
    [name] = checked_out(p)
    task = VMTask(name, "snapshot", "s1")
    assert p.store.tasks.add_vm_task(task, "", actor=ACTOR).ok
    return task


def _running_request(p: Parts) -> str:
    [name] = make_request(p.store, RID, 1)
    assert p.store.vm_ready(name, actor=ACTOR).ok
    return name


def _holding_slot(p: Parts) -> list[str]:
    """A reserved VM holding the one clone slot, and a request waiting in line for it."""
    names = make_request(p.store, RID, 1, created=False)
    assert CloneSemaphore(p.redis, p.keys, 1, 60.0).acquire(names[0]) is not None
    p.redis.zadd(p.keys.clone_slot_line, {"req-waiting": 1.0})
    return names


def _ended(p: Parts) -> str:
    name = _running_request(p)
    assert p.store.end_vm_lifetime(name, actor=ACTOR, force=True).ok
    return name


CASES: dict[str, Case] = {
    "checkout": Case(
        lambda p: make_ready(p.store, POOL, 2),
        lambda p, _: p.store.pools.checkout(
            {POOL: 1}, owner="alice", owner_hash="", lifetime_s=3600, actor=ACTOR
        ),
    ),
    "give_back": Case(checked_out, lambda p, n: p.store.pools.give_back(n[0], actor=ACTOR)),
    "extend_vm": Case(checked_out, lambda p, n: p.store.pools.extend_vm(n[0], 2, actor=ACTOR)),
    "tag_vm": Case(
        checked_out, lambda p, n: p.store.pools.tag_vm(n[0], {"team": "a"}, actor=ACTOR)
    ),
    "add_vm_task": Case(
        checked_out,
        lambda p, n: p.store.tasks.add_vm_task(VMTask(n[0], "disk", "d1"), "8", actor=ACTOR),
    ),
    "finish_vm_task": Case(_task, lambda p, t: p.store.tasks.finish_vm_task(t, actor=ACTOR)),
    "reset_pool": Case(
        lambda p: make_ready(p.store, POOL, 2),
        lambda p, _: p.store.pools.reset_pool(POOL, actor=ACTOR),
    ),
    "recycle_vm": Case(
        lambda p: make_ready(p.store, POOL, 1),
        lambda p, n: p.store.pools.recycle_vm(n[0], "ready_ttl", actor=ACTOR),
    ),
    "reserve_pool_vm": Case(
        _nothing,
        lambda p, _: p.store.pools.reserve_pool_vm(
            "debian-r0",
            pool=POOL,
            template="t",
            provider="sim",
            domain=None,
            size=2,
            data_ttl_s=60,
            actor=ACTOR,
        ),
    ),
    "claim_for_request": Case(
        lambda p: (
            make_ready(p.store, POOL, 2),
            p.store.create_request(RID, [Slot("deb", POOL, 2)], settings(), actor=ACTOR),
        ),
        lambda p, _: p.store.pools.claim_for_request(RID, [POOL], actor=ACTOR),
    ),
    "create_request": Case(
        _nothing,
        lambda p, _: p.store.create_request(RID, [Slot("deb", POOL, 1)], settings(), actor=ACTOR),
    ),
    "reserve_vm": Case(
        lambda p: p.store.create_request(RID, [Slot("deb", POOL, 1)], settings(), actor=ACTOR),
        lambda p, _: p.store.reserve_vm(
            RID,
            name="vm-1",
            alias="deb",
            pool=POOL,
            template="t",
            provider="sim",
            domain=None,
            actor=ACTOR,
        ),
    ),
    "reserve_vm_slot": Case(
        lambda p: p.store.create_request(RID, [Slot("deb", POOL, 1)], settings(), actor=ACTOR),
        lambda p, _: p.store.reserve_vm(
            RID,
            name="vm-1",
            alias="deb",
            pool=POOL,
            template="t",
            provider="sim",
            domain=None,
            actor=ACTOR,
            slot=SlotTerms(1, 60.0, 1.0),
        ),
    ),
    "vm_created": Case(
        lambda p: make_request(p.store, RID, 1, created=False),
        lambda p, n: p.store.vm_created(n[0], actor=ACTOR),
    ),
    "vm_created_slot_back": Case(
        _holding_slot,
        lambda p, n: p.store.vm_created(n[0], actor=ACTOR, slot_limit=1),
    ),
    "vm_waiting": Case(
        lambda p: make_request(p.store, RID, 1, created=False),
        lambda p, n: p.store.vm_waiting(n[0], "quota", actor=ACTOR),
    ),
    "vm_ready": Case(
        lambda p: make_request(p.store, RID, 2),
        lambda p, n: p.store.vm_ready(n[0], actor=ACTOR),
    ),
    "vm_failed": Case(
        lambda p: make_request(p.store, RID, 1),
        lambda p, n: p.store.vm_failed(n[0], "boom", actor=ACTOR),
    ),
    "expire_request": Case(
        lambda p: make_request(p.store, RID, 1, ttl_s=0, reserve=False),
        lambda p, _: p.store.expire_request(RID, actor=ACTOR),
    ),
    "delete_request": Case(
        lambda p: make_request(p.store, RID, 1),
        lambda p, _: p.store.delete_request(RID, actor=ACTOR),
    ),
    "end_vm_lifetime": Case(
        _running_request, lambda p, n: p.store.end_vm_lifetime(n, actor=ACTOR, force=True)
    ),
    "vm_destroyed": Case(_ended, lambda p, n: p.store.vm_destroyed(n, actor=ACTOR)),
    "token_mint": Case(_nothing, lambda p, _: _minted(p.tokens.mint("alice", max_tokens=5))),
    "token_revoke": Case(lambda p: p.tokens.create("alice"), lambda p, t: p.tokens.revoke(t)),
    "token_revoke_own": Case(
        lambda p: p.tokens.create("alice"), lambda p, t: p.tokens.revoke(t, user="alice")
    ),
    "override_set": Case(
        _nothing,
        lambda p, _: set_overrides(p.redis, p.keys, "poolsize", {POOL: ("3", "1")}),
    ),
    "override_clear": Case(
        lambda p: set_overrides(p.redis, p.keys, "poolsize", {POOL: ("3", "1")}),
        lambda p, _: clear_override(p.redis, p.keys, "poolsize", POOL),
    ),
}


def _run(p: Parts, case: Case, proxy: FaultProxy | None) -> tuple[Any, Any]:
    p.redis.flushdb()
    ctx = case.setup(p)
    if proxy is not None:
        proxy.lose_replies(1, case.marker)
    return case.call(p, ctx), shape(p.redis)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lost_reply_changes_nothing_more(
    name: str, proxy: FaultProxy, redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves, for each mutating store call: when the server ran it and its reply was
    lost, redis-py's retry answers what the first run did and changes nothing more (the
    same reply and the same data as the call made once). Against a script without an
    operation id, the retry ran again: a checkout of 1 VM took 2, a give-back or a
    delete answered a refusal, an extension added its hours twice."""
    case = CASES[name]
    p = proxied(proxy, int(urlsplit(redis_url).path.strip("/") or 0), options())
    control = _run(p, case, None)  # also loads the scripts: the lost reply is the call's
    lost = _run(p, case, proxy)
    assert proxy.replies_lost == 1, "the call's reply was not the one lost"
    assert lost == control


def test_a_lost_checkout_reply_hands_out_one_vm(
    proxy: FaultProxy, redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves the acceptance case: a checkout of 1 VM whose reply was lost after the
    script ran gives exactly 1 VM, to exactly the one caller, named in its answer."""
    p = proxied(proxy, int(urlsplit(redis_url).path.strip("/") or 0), options())
    make_ready(p.store, POOL, 3)
    p.redis.script_load(p.store.scripts["checkout"].script)  # the reply lost is the run's
    proxy.lose_replies(1)
    out = p.store.pools.checkout(
        {POOL: 1}, owner="alice", owner_hash="", lifetime_s=3600, actor=ACTOR
    )
    assert proxy.replies_lost == 1
    running = p.store.pool_vms(POOL, "running")
    assert out.ok and [n for n, _ in out.vms] == running
    assert len(running) == 1
    assert [v.owner for v in p.store.get_vms(running)] == ["alice"]


@pytest.mark.slow
def test_a_lost_reply_of_a_confirmed_write_changes_nothing_more(tmp_path: Path) -> None:
    """Proves the same where every write waits for a replica (``WAIT 1`` in the
    script's round trip, vmpool/state/durability.py): the lost reply is the pipeline's
    (EVALSHA then WAIT), redis-py sends both again, and the repeat's confirmation covers
    the first run's change. One VM checked out, to the one caller, and the replica
    holds it."""
    primary = Node("primary", free_port(), tmp_path / "p", ["--save", ""])
    replica = Node("replica", free_port(), tmp_path / "r", ["--save", "", "--replicaof",
                   HOST, str(primary.port)])  # fmt: skip
    for node in (primary, replica):
        node.directory.mkdir()
    fault: FaultProxy | None = None
    try:
        primary.start()
        replica.start()
        with contextlib.closing(primary.client()) as c:
            online = lambda: c.info("replication").get("slave0", {}).get("state") == "online"  # noqa: E731
            wait_for(online, 15, "the replica")
        fault = FaultProxy(primary.port).start()
        p = proxied(fault, 0, options("replicas", 1))
        make_ready(p.store, POOL, 3)
        p.redis.script_load(p.store.scripts["checkout"].script)
        fault.lose_replies(1)
        out = p.store.pools.checkout(
            {POOL: 1}, owner="alice", owner_hash="", lifetime_s=3600, actor=ACTOR
        )
        assert fault.replies_lost == 1
        with contextlib.closing(replica.client(decode_responses=True)) as r:
            held = sorted(r.zrange(Keys().pool_state(POOL, "running"), 0, -1))
        assert out.ok and [n for n, _ in out.vms] == held and len(held) == 1
    finally:
        if fault is not None:
            fault.stop()
        replica.stop()
        primary.stop()


def test_a_full_redis_refuses_no_more_than_before(tmp_path: Path) -> None:
    """Proves the record costs no refusal when Redis is full (maxmemory reached under
    noeviction): Redis refuses a script only at its first write, and the record is
    written after the change. A give-back (its first write frees) is made and answered;
    sent again with its operation id, it answers the same; a refused checkout answers
    its refusal; a checkout whose first write takes memory is refused (OOM) and leaves
    nothing behind."""
    directory = tmp_path / "full"
    directory.mkdir()
    server = RedisServer(appendonly=False, directory=str(directory)).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        store = Store(client, Keys())
        held = make_ready(store, POOL, 2)[0]
        assert store.pools.checkout(
            {POOL: 1}, owner="alice", owner_hash="", lifetime_s=3600, actor=ACTOR
        ).vms == ((held, POOL),)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        op = new_op(60)
        out = store.pools.give_back(held, actor=ACTOR, op=op)
        assert out.ok and store.pools.give_back(held, actor=ACTOR, op=op) == out
        short = store.pools.checkout(
            {POOL: 2}, owner="bob", owner_hash="", lifetime_s=3600, actor=ACTOR
        )
        assert (short.ok, short.short) == (False, POOL)
        before = shape(client)
        with pytest.raises(redis.OutOfMemoryError):
            store.create_request(RID, [Slot("deb", POOL, 1)], settings(), actor=ACTOR)
        assert shape(client) == before
    finally:
        server.stop()


def test_a_lost_reply_of_a_pipelined_script_changes_nothing_more(
    proxy: FaultProxy, redis_url: str, redis_client: redis.Redis
) -> None:
    """Proves the same on the API's asyncio path (run_pipelined_async: POST
    /ondemandvm's create, one pipeline): the pipeline whose reply was lost is sent
    again by redis-py, and the create answers 'created' (its own record), not 'exists'
    (its first run found by its second)."""
    db = int(urlsplit(redis_url).path.strip("/") or 0)
    p = proxied(proxy, db, options())
    p.redis.script_load(p.store.scripts["create_request"].script)
    aio = connect_async(f"redis://{HOST}:{proxy.port}/{db}", options(), decode_responses=True)
    pipe = ScriptPipeline()
    p.store.create_request(RID, [Slot("deb", POOL, 1)], settings(), actor=ACTOR, pipeline=pipe)
    proxy.lose_replies(1)

    async def run() -> list[Any]:
        try:
            return await pipe.execute_async(aio)
        finally:
            await aio.aclose()

    [reply] = asyncio.run(run())
    assert proxy.replies_lost == 1
    assert Outcome.from_reply(reply) == Outcome(True, "created", 1)

"""Helpers shared by the store tests: drive a request through the real transitions, poll
with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

from vmpool.state.records import Outcome, RequestSettings, Slot
from vmpool.state.store import Store

ACTOR = "test"


def settings(ttl_s: float = 300, **kw: float) -> RequestSettings:
    return RequestSettings(ttl_s=ttl_s, **kw)  # type: ignore[arg-type]


def make_request(
    store: Store,
    rid: str,
    n: int = 2,
    *,
    pool: str = "debian",
    alias: str = "deb",
    ttl_s: float = 300,
    reserve: bool = True,
    created: bool = True,
    **kw: float,
) -> list[str]:
    """Create a request of ``n`` VMs; reserve and create them; return the VM names."""
    assert store.create_request(rid, [Slot(alias, pool, n)], settings(ttl_s, **kw), actor=ACTOR).ok
    names = []
    if reserve:
        for i in range(n):
            name = f"{rid.lower().replace('_', '-').replace('.', '-')}-vm{i}"
            out = store.reserve_vm(
                rid,
                name=name,
                alias=alias,
                pool=pool,
                template="t",
                provider="sim",
                domain="example.com",
                actor=ACTOR,
            )
            assert out.ok, out
            names.append(name)
            if created:
                assert store.vm_created(name, actor=ACTOR).code == "pending"
    return names


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, step: float = 0.01) -> None:
    """Poll ``pred`` until true. Fail the test at the deadline (no bare sleeps)."""
    if not poll(pred, timeout, step):
        raise AssertionError("condition not met before the deadline")


def refused(out: Outcome, code: str) -> bool:
    return (not out.ok) and out.code == code


def snapshot(client: object) -> dict[str, tuple[bytes | None, bool]]:
    """Every key's serialized value and whether it has a TTL: equal snapshots before
    and after a call prove the call changed nothing."""
    import redis

    assert isinstance(client, redis.Redis)
    out: dict[str, tuple[bytes | None, bool]] = {}
    raw = redis.Redis(connection_pool=client.connection_pool)
    for key in sorted(str(k) for k in client.keys("*")):
        dumped = raw.execute_command("DUMP", key, NEVER_DECODE=True)
        out[key] = (dumped, client.pttl(key) > 0)
    return out


def poll(predicate: Callable[[], bool], timeout_s: float = 5.0, every_s: float = 0.02) -> bool:
    """Poll ``predicate`` until true or the deadline; its last answer (the test asserts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()


def make_ready(store: Store, pool: str, n: int, *, prefix: str = "w") -> list[str]:
    """``n`` warm-pool VMs made ready in ``pool`` through the real transitions."""
    names = []
    for i in range(n):
        name = f"{pool}-{prefix}{i}"
        assert store.pools.reserve_pool_vm(
            name,
            pool=pool,
            template="t",
            provider="sim",
            domain="example.com",
            size=n,
            data_ttl_s=3600,
            actor=ACTOR,
        ).ok
        assert store.vm_created(name, actor=ACTOR).code == "pending"
        assert store.vm_ready(name, actor=ACTOR).code == "ready"
        names.append(name)
    return names

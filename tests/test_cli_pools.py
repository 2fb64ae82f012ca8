"""`vmpool pools --set-size / --unset-size / --reset` through click's runner against a
real Redis (the built-in demo config): the same store operations as the API's."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from clihelp import POOL, publish_demo, warm


def test_set_size_reset_and_bad_input(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: --set-size shows in the table (marked) and JSON (overrides), --reset
    recycles the ready VMs and leaves a checked-out one, --unset-size goes back to the
    configured size; bad input is one line, exit 2, and changes nothing."""
    runner = CliRunner()

    def run(*args: str) -> object:
        return runner.invoke(cli, [*args, "--redis-url", redis_url])

    publish_demo(redis_client)
    store = Store(redis_client, Keys())
    names = warm(store, 3)
    store.pools.checkout({POOL: 1}, owner="ops", owner_hash="", lifetime_s=60, actor="test")
    before = dict(redis_client.hgetall(Keys().pool_override("poolsize")))
    for bad in (("--set-size", f"{POOL}=x"), ("--set-size", "nosuch=3"), ("--reset", "nosuch")):
        out = run("pools", *bad)
        assert out.exit_code == 2, out.output  # type: ignore[attr-defined]
        assert out.output.count("\n") == 1 and "error" in out.output  # type: ignore[attr-defined]
    assert dict(redis_client.hgetall(Keys().pool_override("poolsize"))) == before
    out = run("pools", "--set-size", f"{POOL}=7")
    assert out.exit_code == 0, out.output  # type: ignore[attr-defined]
    assert f"{POOL}: size 7" in out.output and "7*" in out.output  # type: ignore[attr-defined]
    rows = json.loads(run("pools", "--json").output)  # type: ignore[attr-defined]
    row = next(r for r in rows if r["pool"] == POOL)
    assert row["size"] == 7 and row["overrides"] == {"size": 7}
    out = run("pools", "--reset", POOL)
    assert f"{POOL}: reset, 2 ready VMs replaced" in out.output  # type: ignore[attr-defined]
    assert store.pool_vms(POOL, "ready") == []
    assert len(store.pool_vms(POOL, "running")) == 1
    assert {store.get_vm(n).state for n in names} == {"completed", "running"}  # type: ignore[union-attr]
    out = run("pools", "--unset-size", POOL, "--json")
    rows = json.loads(out.output.split("\n", 1)[1])  # type: ignore[attr-defined]
    assert next(r for r in rows if r["pool"] == POOL)["overrides"] == {}

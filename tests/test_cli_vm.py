"""`vmpool vm get|list|show|extend|delete` through click's runner against a real Redis."""

from __future__ import annotations

import json
import re

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from clihelp import POOL, publish_demo, warm


@pytest.fixture
def run(redis_url: str, redis_client: redis.Redis) -> object:
    publish_demo(redis_client)
    runner = CliRunner()

    def invoke(*args: str) -> object:
        return runner.invoke(cli, [*args, "--redis-url", redis_url])

    return invoke


def test_vm_commands(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    """Proves: get checks out all or nothing (exit 1 and nothing taken when short),
    list/show read, extend sets the lifetime, delete gives the VM back; bad input is
    one line and exit 2."""
    store = Store(redis_client, Keys())
    warm(store, 2)
    short = run("vm", "get", "debian=3")
    assert short.exit_code == 1 and "nothing checked out" in short.output
    assert len(store.pool_vms(POOL, "ready")) == 2
    got = run("vm", "get", "debian", "--owner", "ops")
    assert got.exit_code == 0, got.output
    host = got.output.strip()
    name = host.split(".")[0]
    listed = run("vm", "list", "--json")
    rows = {r["name"]: r for r in json.loads(listed.output)}
    assert rows[name]["state"] == "running" and rows[name]["holder"] == "ops"
    assert run("vm", "extend", host, "5").exit_code == 0
    shown = json.loads(run("vm", "show", name, "--json").output)
    assert shown["trail"][-1]["reason"] == "lifetime set to 5h"
    assert run("vm", "delete", name).exit_code == 0
    again = run("vm", "delete", name)  # idempotent, as deleting a request twice
    assert again.exit_code == 0, again.output
    assert again.stdout == f"{name}: already given back: it is being destroyed\n"
    assert json.loads(run("vm", "delete", name, "--json").stdout)["result"] == (
        "already_given_back"
    )
    unknown = run("vm", "delete", "no-such-vm")
    assert unknown.exit_code == 1 and unknown.stderr == (
        "vmpool: error: no-such-vm: not given back: no such VM\n"
    )
    ready = next(iter(store.pool_vms(POOL, "ready")))
    not_held = run("vm", "delete", ready)
    assert not_held.exit_code == 1 and "not held: it is ready in its pool" in not_held.stderr
    bad = run("vm", "show", "Not_A_Name!")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert run("vm", "get", "nosuch").exit_code == 2


def test_vm_list_and_show_read_as_tables_and_times(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    """Proves: `vm list` has a header and says the lifetime left as "in N h"; its JSON
    has null, not "-", where there is nothing; `vm show` prints ISO times, not epochs."""
    store = Store(redis_client, Keys())
    warm(store, 2)
    host = run("vm", "get", "debian", "--owner", "ops").stdout.strip()
    name = host.split(".")[0]
    listed = run("vm", "list").stdout.splitlines()
    assert listed[0].split() == ["NAME", "POOL", "STATE", "ENDS", "HOLDER"]
    held = next(line for line in listed if line.startswith(name))
    assert held.split()[1:6] == [POOL, "running", "in", "12.0", "h"] and held.endswith("ops")
    idle = next(line for line in listed[1:] if not line.startswith(name))
    assert idle.split()[2:] == ["ready", "-", "-"]
    rows = {r["name"]: r for r in json.loads(run("vm", "list", "--json").stdout)}
    ready_row = next(r for n, r in rows.items() if n != name)
    assert ready_row["holder"] is None and ready_row["remaining_s"] is None
    assert 11.9 * 3600 < rows[name]["remaining_s"] <= 12 * 3600
    shown = run("vm", "show", name).stdout
    assert re.search(
        r"^lifetime_end: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in 12\.0 h\)$", shown, re.MULTILINE
    ), shown
    assert re.search(r"^checkout_at: \S+Z \(\d+ s ago\)$", shown, re.MULTILINE), shown

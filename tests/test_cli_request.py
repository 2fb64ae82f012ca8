"""`vmpool request ...`, `vmpool pools` through click's runner against a real Redis."""

from __future__ import annotations

import re
import threading

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from clihelp import publish_demo
from storehelp import ACTOR, wait_until

POOL = "debian-12-x86_64"  # from the built-in demo config, alias "debian"


@pytest.fixture
def run(redis_url: str, redis_client: redis.Redis) -> object:
    runner = CliRunner()

    def invoke(*args: str) -> object:
        return runner.invoke(cli, [*args, "--redis-url", redis_url])

    return invoke


def test_create_prints_id_and_enqueues_provisioning(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    publish_demo(redis_client)
    result = run("request", "create", "debian=2", f"{POOL}=1")
    assert result.exit_code == 0, result.output
    rid = result.output.strip()
    rec = Store(redis_client, Keys()).get_request(rid)
    assert rec is not None and rec.status == "pending" and rec.need == 3
    assert {(s.alias, s.want) for s in rec.slots} == {("debian", 2), (POOL, 1)}
    jobs = redis_client.lrange("rq:queue:vmpool-requests", 0, -1)
    assert any(rid in j for j in jobs)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["nosuchpool=1"], "unknown pool or alias: nosuchpool"),
        (["debian=x"], "positive integer"),
        (["debian=0"], "positive integer"),
        (["debian=11"], "exceeds the maximum 10"),
        (["=3"], "expected POOL=N"),
    ],
)
def test_create_bad_input_is_one_line_exit_2(run, redis_client: redis.Redis, args, needle) -> None:  # type: ignore[no-untyped-def]
    result = run("request", "create", *args)
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output
    assert redis_client.dbsize() == 0


def test_create_duplicate_id(run) -> None:  # type: ignore[no-untyped-def]
    assert run("request", "create", "debian=1", "--request-id", "abc-1").exit_code == 0
    again = run("request", "create", "debian=1", "--request-id", "abc-1")
    assert again.exit_code == 2 and "already been created" in again.output
    bad = run("request", "create", "debian=1", "--request-id", "a/b")
    assert bad.exit_code == 2


def test_create_wait_prints_hostnames(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    store = Store(redis_client, Keys())

    def fake_worker() -> None:
        """Plays the fleet's part through the store's own transitions."""
        wait_until(lambda: bool(store.open_requests()), timeout=10)
        rid = store.open_requests()[0]
        for i in range(2):
            name = f"wait-vm{i}"
            store.reserve_vm(
                rid,
                name=name,
                alias="debian",
                pool=POOL,
                template="t",
                provider="simulated",
                domain="example.com",
                actor=ACTOR,
            )
            store.vm_created(name, actor=ACTOR)
            store.vm_ready(name, actor=ACTOR)

    worker = threading.Thread(target=fake_worker)
    worker.start()
    result = run("request", "create", "debian=2", "--wait", "--timeout", "20")
    worker.join(10)
    assert result.exit_code == 0, result.output
    # a table of the hostnames, each with the name it was asked by
    assert result.stdout.splitlines() == [
        "POOL    HOSTNAME",
        "debian  wait-vm0.example.com",
        "debian  wait-vm1.example.com",
    ]


def test_create_wait_on_failure_exits_1(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    store = Store(redis_client, Keys())

    def fail_it() -> None:
        wait_until(lambda: bool(store.open_requests()), timeout=10)
        rid = store.open_requests()[0]
        store.reserve_vm(
            rid,
            name="doomed-vm",
            alias="debian",
            pool=POOL,
            template="t",
            provider="simulated",
            domain=None,
            actor=ACTOR,
        )
        store.vm_failed("doomed-vm", "template t not found", permanent=True, actor=ACTOR)

    worker = threading.Thread(target=fail_it)
    worker.start()
    result = run("request", "create", "debian=1", "--wait", "--timeout", "20")
    worker.join(10)
    assert result.exit_code == 1
    assert "failed: Configuration error" in result.output


def test_get_delete_history(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    publish_demo(redis_client)
    rid = run("request", "create", "debian=1").output.strip()
    got = run("request", "get", rid)
    assert got.exit_code == 0 and "pending" in got.output and "0/1 ready" in got.output
    as_json = run("request", "get", rid, "--json")
    assert '"status": "pending"' in as_json.output
    assert re.search(r"^  created: \S+Z \(\d+ s ago\)$", got.stdout, re.MULTILINE), got.stdout
    assert re.search(
        r"^  fails:   \S+Z \(in \d+ (s|min)\) unless ready by then$", got.stdout, re.MULTILINE
    ), got.stdout
    deleted = run("request", "delete", rid)
    assert deleted.exit_code == 0 and "deleted" in deleted.output
    again = run("request", "delete", rid)
    assert again.exit_code == 0 and "already been deleted" in again.output
    gone = run("request", "get", rid).stdout  # no "0/1 ready" for what was given back
    assert "debian: 1 asked, 0 were ready; given back, its VMs are destroyed" in gone
    assert "ready" not in gone.split("\n", 1)[1].replace("were ready", "")
    hist = run("request", "history", rid)
    assert hist.exit_code == 0
    lines = hist.stdout.splitlines()
    assert lines[0].split() == ["VERSION", "TIME", "ENTITY", "TRANSITION", "ACTOR", "REASON"]
    assert "none -> pending" in hist.output and "pending -> deleted" in hist.output
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", lines[1]), lines[1]
    assert run("request", "get", "no-such-id").exit_code == 1
    assert run("request", "get", "bad id!").exit_code == 2


def test_pools_table(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    run("request", "create", "debian=3")
    table = run("pools")
    assert table.exit_code == 0, table.output
    line = next(row for row in table.output.splitlines() if row.startswith(POOL))
    assert line.split()[-2:] == ["3", "-"]  # three VMs waiting on demand; creates not failing
    assert '"ondemand_queue": 3' in run("pools", "--json").output


def test_no_redis_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VMPOOL_REDIS_URL", raising=False)
    result = CliRunner().invoke(cli, ["request", "get", "abc"])
    assert result.exit_code == 2 and "no Redis to use" in result.output


def test_get_and_show_print_where_a_pending_request_stands(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    """`vmpool request get` (and `show`) print the priority and, while pending, the
    position and the ETA, as GET /ondemandvm/<id> gives them (`--json`: the same fields)."""
    publish_demo(redis_client)
    first = run("request", "create", "debian=1", "--priority", "3").output.strip()
    second = run("request", "create", "debian=1").output.strip()  # priority 2: ahead
    assert "  priority: 3" in run("request", "get", first).stdout
    assert "  place:   position 2 in line, ready in about" in run("request", "show", first).stdout
    assert "  place:   position 1 in line" in run("request", "get", second).stdout
    as_json = run("request", "show", second, "--json").stdout
    assert '"position": 1' in as_json and '"eta_s": ' in as_json and '"priority": 2' in as_json
    store = Store(redis_client, Keys("vmpool"))
    assert store.reserve_vm(second, name="vm-second", alias="debian", pool=POOL, template="t",
                            provider="simulated", domain=None, actor=ACTOR).ok  # fmt: skip
    assert "  place:   being provisioned, ready in about" in run("request", "get", second).stdout
    assert "position 1 in line" in run("request", "get", first).stdout
    bad = run("request", "create", "debian=1", "--priority", "4")
    assert bad.exit_code == 2

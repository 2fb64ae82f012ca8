"""Every write a client or an operator is told about goes through the one confirmation
path (vmpool/state/durability.py): a script (EVALSHA) confirmed by a ``WAIT`` for the
replicas before the call that made it answers: its own ``WAIT``, or its unit of work's
``PUBLISH`` + ``WAIT`` (which covers every connection's writes).

A real primary with a real replica; every write waits for it (``durability:
replicas``). MONITOR on the primary records every command while the API and the CLI
make every kind of change they offer: tokens minted and revoked, on-demand requests
created and deleted, checkouts, PUTs, give-backs, pool overrides set and cleared, pool
resets. The test then lists the writes sent outside a script and fails on any the
list below does not name with its reason, and fails on any script call not confirmed
before its call answered (the test marks each answer in the stream with an ``ECHO``).
A plain ``DEL`` for ``vmpool token revoke`` or a ``MULTI`` for ``DELETE
/config/poolsize/<pool>`` (what they were) fails it.
"""

from __future__ import annotations

import base64
import re
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import sha1
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.config import parse_config
from vmpool.local.redis_server import free_port
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from vmpool.state.tokens import hash_password
from workers.queues import RECLAIM_LUA, UNIQUE_ENQUEUE_SCRIPT

from apihelp import API, make_client
from sentinelhelp import HOST, Node, wait_for
from storehelp import make_ready

pytestmark = pytest.mark.slow

PASSWORD = "s3cret-pass"
POOL = "pool1"  # the API's
OTHER = "pool2"  # the CLI's

# Writes that are not a script, and why nobody is told of them (a loss in a failover
# misleads no client): (command, key pattern) -> reason.
UNCONFIRMED: dict[tuple[str, str], str] = {
    ("INCRBY", r"vmpool:ratelimit:"): "a rate-limit count: a lost count allows one more call",
    ("EXPIRE", r"vmpool:ratelimit:"): "the rate-limit count's window",
    ("HSET", r"vmpool:fleet:config$"): "a process's config, published again at each start",
    ("HSET", r"vmpool:fleets$"): "the same publication's index",
    ("HINCRBY", r"vmpool:metrics:"): "a counter of the metrics",
    ("HSET", r"vmpool:metrics:audit$"): "the last audit's count for /metrics: each run's own",
    ("SADD", r"rq:queues$"): "RQ's index of its queues (a job: below)",
    (
        "RPUSH",
        r"rq:queue:[^:]+:wake$",
    ): "a wake-up for blocked workers: one lost, a block's end finds the job",
    ("LTRIM", r"rq:queue:[^:]+:wake$"): "the same wake-up list kept to one token",
}
# Scripts whose writes are RQ's jobs, queued in a pipeline of their own: a job carries
# out a change that was confirmed, and a job lost in a failover is found again by the
# sweep of its kind (docs/architecture.md).
JOB_SCRIPTS: dict[str, str] = {
    sha1(UNIQUE_ENQUEUE_SCRIPT.encode()).hexdigest(): "RQ's unique enqueue",
    sha1(RECLAIM_LUA.encode()).hexdigest(): "a stale job taken back before a new one",
}
_LINE = re.compile(r'^\+(\S+) \[\d+ (\S+)\] "([^"]+)"(?: "((?:[^"\\]|\\.)*)")?')


@dataclass
class Monitor:
    """MONITOR on ``port`` from a thread of its own: (client, command, first argument)."""

    port: int
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    halt: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sock = socket.create_connection((HOST, self.port))
        self.sock.sendall(b"MONITOR\r\n")
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buffered = b""
        while not self.halt.is_set():
            if not select.select([self.sock], [], [], 0.05)[0]:
                continue
            data = self.sock.recv(1 << 16)
            if not data:
                return
            buffered += data
            *lines, buffered = buffered.split(b"\r\n")
            for raw in lines:
                match = _LINE.match(raw.decode("utf-8", "replace"))
                if match:
                    _, client, command, first = match.groups()
                    self.seen.append((client, command.upper(), first or ""))

    def stop(self) -> list[tuple[str, str, str]]:
        self.halt.set()
        self.thread.join(5)
        self.sock.close()
        return self.seen


def config_data() -> dict[str, Any]:
    return {
        ":config": {"experimental_features": True, "site_name": "t"},
        ":redis": {"durability": "replicas", "durability_replicas": 1, "durability_timeout": 2},
        ":providers": {"sim": {"provider_class": "simulated", "boot_seconds": 0}},
        ":pools": [
            {"name": p, "template": p, "size": 0, "provider": "sim", "domain": "example.com"}
            for p in (POOL, OTHER)
        ],
        ":auth": {
            "provider": "static",
            "users": {"jdoe": hash_password(PASSWORD, iterations=1000, salt="s")},
            "admins": ["jdoe"],
            "rate_limit_per_minute": 1000,
        },
    }


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[Node]:
    nodes: list[Node] = []
    try:
        for name in ("primary", "replica"):
            (tmp_path / name).mkdir()
            extra = ["--replicaof", HOST, str(nodes[0].port)] if nodes else []
            nodes.append(Node(name, free_port(), tmp_path / name, ["--save", "", *extra]).start())
        link = lambda: nodes[1].client().info("replication")["master_link_status"] == "up"  # noqa: E731
        wait_for(link, 20, "the replica to sync")
        yield nodes[0]
    finally:
        for node in reversed(nodes):
            node.stop()


# Sent by the test after each answer it got: a script call before it must be confirmed.
ANSWERED = "vmpool-test-answered"


def mark_answers(url: str) -> Any:
    """A hook that puts an ``ECHO`` of :data:`ANSWERED` in the stream (an answer came)."""
    marker = redis.Redis.from_url(url)

    def answered(*_: Any) -> None:
        marker.echo(ANSWERED)

    return answered


def api_session(url: str) -> None:
    """Every change the API offers, through its endpoints (auth on, an admin)."""
    config = parse_config(config_data(), source="test", env={})
    c, _ = make_client(config, url)
    c.event_hooks["response"].append(mark_answers(url))
    basic = {"Authorization": "Basic " + base64.b64encode(f"jdoe:{PASSWORD}".encode()).decode()}
    token = c.post(f"{API}/token", headers=basic).json()["token"]
    auth = {"X-AUTH-TOKEN": token}
    rid = c.post(f"{API}/ondemandvm", json={OTHER: 1}, headers=auth).json()["request_id"]
    assert c.delete(f"{API}/ondemandvm/{rid}", headers=auth).status_code == 200
    host = c.post(f"{API}/vm/{POOL}", headers=auth).json()[POOL]["hostname"]
    put = c.put(f"{API}/vm/{host}", json={"lifetime": 3, "tags": {"a": "b"}}, headers=auth)
    assert put.status_code == 200, put.text
    assert c.delete(f"{API}/vm/{host}", headers=auth).status_code == 200
    for path, body in (("poolsize", {POOL: 3}), ("pooltemplate", {POOL: "other"})):
        assert c.post(f"{API}/config/{path}", json=body, headers=auth).status_code == 201
        assert c.delete(f"{API}/config/{path}/{POOL}", headers=auth).status_code == 201
    assert c.post(f"{API}/poolreset", json={POOL: "1"}, headers=auth).status_code == 201
    assert c.delete(f"{API}/token/{token}", headers=basic).status_code == 200


def cli_session(url: str, config_path: Path) -> None:
    """Every change the CLI offers an operator (and `audit --metrics`' record)."""
    runner = CliRunner()
    answered = mark_answers(url)

    def run(*args: str) -> str:
        result = runner.invoke(cli, [*args, "--config", str(config_path), "--redis-url", url])
        answered()
        assert result.exit_code == 0, result.output
        return str(result.stdout)

    token = run("token", "create", "jdoe").splitlines()[0]
    run("token", "revoke", token)
    host = run("vm", "get", OTHER).split()[0]
    run("vm", "extend", host.split(".")[0], "2")
    run("vm", "delete", host.split(".")[0])
    run("pools", "--set-size", f"{OTHER}=2")
    run("pools", "--unset-size", OTHER, "--reset", OTHER)
    run("request", "create", f"{OTHER}=1", "--request-id", "cli-1")
    run("request", "delete", "cli-1")
    runner.invoke(cli, ["audit", "--metrics", "--config", str(config_path), "--redis-url", url])


def writes(port: int) -> set[str]:
    """The commands the server flags as writes."""
    with redis.Redis(host=HOST, port=port) as r:
        return {name.upper() for name, info in r.command().items() if "write" in info["flags"]}


def unconfirmed(seen: list[tuple[str, str, str]], write: set[str]) -> list[str]:
    """What went outside the path: a write not a script's and not listed, or a script
    call (EVALSHA) not confirmed before the next answer (:data:`ANSWERED`). A WAIT
    confirms its own client's script calls; a PUBLISH + WAIT every client's."""
    problems = []
    owed: dict[str, bool] = {}  # client -> a script call still to be confirmed
    last: dict[str, str] = {}  # client -> its previous command
    for client, command, first in seen:
        if client == "lua":
            continue
        if command in ("EVALSHA", "EVAL"):
            owed[client] = owed.get(client, False) or first not in JOB_SCRIPTS
        elif command == "WAIT":
            if last.get(client) == "PUBLISH":
                owed.clear()
            owed.pop(client, None)
        elif command == "ECHO" and first == ANSWERED:
            problems += [f"{c}: a script call not confirmed before its answer"
                         for c, left in owed.items() if left]  # fmt: skip
            owed.clear()
        last[client] = command
        if command in write and not any(
            c == command and re.match(p, first) for c, p in UNCONFIRMED
        ):
            problems.append(f"{client}: {command} {first} outside a script")
    problems += [f"{c}: a script call never confirmed" for c, left in owed.items() if left]
    return problems


def test_every_told_write_is_a_confirmed_script(primary: Node, tmp_path: Path) -> None:
    """Proves: an API session and a CLI session making every kind of change they offer
    send no write outside a script but the listed ones (each with its reason), and
    every script call is confirmed by a WAIT before its call answers."""
    url = f"redis://{HOST}:{primary.port}/0"
    with primary.client(decode_responses=True) as r:
        make_ready(Store(r, Keys()), POOL, 2)
        make_ready(Store(r, Keys()), OTHER, 2)
    config_path = tmp_path / "vmpool.yaml"
    config_path.write_text(yaml.safe_dump(config_data()))
    monitor = Monitor(primary.port)
    try:
        api_session(url)
        cli_session(url, config_path)
    finally:
        seen = monitor.stop()
    assert any(cmd == "WAIT" for _, cmd, _ in seen), "nothing was confirmed: no replica?"
    problems = unconfirmed(seen, writes(primary.port))
    assert problems == [], "\n".join(problems)


def test_the_check_sees_a_plain_write() -> None:
    """Proves the check can fail: a plain DEL (what `vmpool token revoke` sent), a
    MULTI'd HDEL (DELETE /config/poolsize/<pool>), a script call answered before any
    WAIT, and one whose WAIT (no PUBLISH first) came on another client are each named;
    a unit's PUBLISH + WAIT on one client confirms another client's script call."""
    seen = [
        ("c:1", "DEL", "vmpool:token:ab"),
        ("c:1", "MULTI", ""),
        ("c:1", "HDEL", "vmpool:config:poolsize"),
        ("c:1", "EXEC", ""),
        ("c:2", "EVALSHA", "f00"),
        ("lua", "SET", "x"),
        ("c:2", "GET", "y"),
        ("t:1", "ECHO", ANSWERED),
        ("c:3", "EVALSHA", "f00"),
        ("c:3", "WAIT", "1"),
        ("c:3", "INCRBY", "vmpool:ratelimit:user:x:1"),
        ("t:1", "ECHO", ANSWERED),
        ("c:4", "EVALSHA", "f00"),
        ("c:5", "PUBLISH", "vmpool:confirm"),
        ("c:5", "WAIT", "1"),
        ("t:1", "ECHO", ANSWERED),
        ("c:6", "EVALSHA", "f00"),
        ("c:7", "WAIT", "1"),
        ("t:1", "ECHO", ANSWERED),
    ]
    assert unconfirmed(seen, {"DEL", "HDEL", "SET", "INCRBY"}) == [
        "c:1: DEL vmpool:token:ab outside a script",
        "c:1: HDEL vmpool:config:poolsize outside a script",
        "c:2: a script call not confirmed before its answer",
        "c:6: a script call not confirmed before its answer",
    ]

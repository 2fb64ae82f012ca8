"""Durability of acknowledged writes (docs/invariants.md, invariant 9), against real servers.

What this proves:
- a power cut (the append-only file cut back to its last fsync, exactly: the shim in
  tests/native/fsync_log.c records every fsync) loses no acknowledged write under
  ``appendfsync always``, and loses some under ``everysec`` (the control);
- a write whose confirmation does not come (its replica stalled) is refused, and the
  API answers 503 naming the request id it tried; the request may exist; a retry with
  that id never makes a second one (409 with the id once the first is durable);
- the startup check and ``vmpool audit --strict`` name ``appendfsync everysec``, and
  say what the writes wait for;
- a plain ``redis://`` URL to a primary that has a replica, with the default durability
  (which waits for none there), is named at start (a warning; ``--strict`` refuses)
  and by ``vmpool audit --strict``; so is ``min-replicas-to-write 0`` on that primary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.config import default_redis_options
from vmpool.local.redis_server import free_port
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.durability import DurabilitySetting, WriteNotConfirmed
from vmpool.state.redis_check import RedisMisconfigured, check_redis, startup_check

from aof_tail import NEEDS, build_shim, cut_to_fsynced, preload_env
from apihelp import API, make_client, spec_config
from sentinelhelp import HOST, Node, wait_for

pytestmark = pytest.mark.slow


def options(mode: str, timeout_s: float = 0.5) -> RedisOptions:
    setting = DurabilitySetting(mode=mode, replicas=1, timeout_s=timeout_s)  # type: ignore[arg-type]
    return dataclasses.replace(default_redis_options(), durability=setting)


def data_node(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None) -> Node:
    directory = tmp_path / name
    directory.mkdir()
    return Node(name, free_port(), directory, ["--save", "", *args], env=env).start()


def url_of(node: Node) -> str:
    return f"redis://{HOST}:{node.port}/0"


class Writer(threading.Thread):
    """Writes one new key after another through ``client``'s scripts; keeps the keys
    it was told were written."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        super().__init__(daemon=True)
        self.script = client.register_script("return redis.call('SET', KEYS[1], '1')")
        self.client = client
        self.prefix = prefix
        self.acked: list[str] = []
        self.refused = 0
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.is_set():
            key = f"{self.prefix}:{n}"
            n += 1
            try:
                self.script(keys=[key])
            except redis.RedisError:
                self.refused += 1
                continue
            self.acked.append(key)


def power_cut(tmp_path: Path, shim: Path, appendfsync: str) -> tuple[int, int]:
    """Write keys as fast as one client can for a second, SIGKILL the server, cut its
    AOF back to its last fsync, start it again: (acknowledged, lost)."""
    log = tmp_path / f"fsync-{appendfsync}.log"
    node = data_node(tmp_path, f"power-{appendfsync}", "--appendonly", "yes",
                     "--appendfsync", appendfsync, env=preload_env(shim, log))  # fmt: skip
    try:
        writer = Writer(connect(url_of(node), options("none"), decode_responses=True), "k")
        writer.start()
        wait_for(lambda: len(writer.acked) > 100, 20, "writes", step=0.05)
        time.sleep(1.0)
        node.kill()
        writer.halt.set()
        writer.join(10)
        cut_to_fsynced(node.directory, log)
        node.start()
        check = node.client(decode_responses=True)
        return len(writer.acked), sum(1 for k in writer.acked if not check.exists(k))
    finally:
        node.stop()


def test_a_power_cut_undoes_no_acknowledged_write_under_appendfsync_always(
    tmp_path: Path,
) -> None:
    """The server is SIGKILLed while a client writes, and its AOF is cut back to its
    last fsync (the worst a power cut does: tests/native/fsync_log.c records each).
    Under ``appendfsync always`` every acknowledged key is there after the restart;
    under ``everysec`` (the control, which shows the cut is real) some are gone: the
    loss the startup check names."""
    shim = build_shim(tmp_path)
    if shim is None:
        pytest.skip(f"needs {NEEDS}")
    acked, lost = power_cut(tmp_path, shim, "always")
    assert acked > 100 and lost == 0, (acked, lost)
    acked, lost = power_cut(tmp_path, shim, "everysec")
    assert lost > 0, f"nothing of {acked} lost under everysec: no power cut?"


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    primary = data_node(tmp_path, "primary", "--appendonly", "yes", "--appendfsync", "always")
    replica = data_node(tmp_path, "replica", "--replicaof", HOST, str(primary.port))
    try:
        wait_for(lambda: replica.client().info("replication")["master_link_status"] == "up",
                 20, "the replica to sync")  # fmt: skip
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def test_a_write_that_cannot_be_confirmed_is_a_503_naming_the_request_id(
    primary_and_replica: tuple[Node, Node],
) -> None:
    """Durability ``replicas``; the replica stops (SIGSTOP, a stalled link). A POST is
    written on the primary but not confirmed: 503, "could not be confirmed", with the
    id it tried. GET of that id is refused the same way (its state is not durable). Once
    the replica is back, the request is there (pending), and a POST of the same id
    is 409 with the id: still one request. A GET of an id that does not exist is 503
    too: a 404 from a primary that cannot confirm may be taken back by a failover."""
    primary, replica = primary_and_replica
    config = dataclasses.replace(spec_config(), redis_options=options("replicas", 0.5))
    c, _ = make_client(config, url_of(primary))
    assert c.post(f"{API}/ondemandvm", json={"pool3": 1}).status_code == 201
    rid = str(uuid.uuid4())
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        r = c.post(f"{API}/ondemandvm", json={"pool3": 1, "request_id": rid})
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["request_id"] == rid and body["redis"] == "not_confirmed"
        assert "could not be confirmed" in body["message"]
        assert c.get(f"{API}/ondemandvm/{rid}").status_code == 503
        # "not found" is a state shown too: a primary that cannot confirm does not say it
        assert c.get(f"{API}/ondemandvm/{uuid.uuid4()}").status_code == 503
        assert c.get("/readyz").json()["redis"] == "not_confirmed"
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_for(lambda: c.get("/readyz").status_code == 200, 15, "ready again")
    assert c.get(f"{API}/ondemandvm/{rid}").status_code == 202  # it was written
    again = c.post(f"{API}/ondemandvm", json={"pool3": 1, "request_id": rid})
    assert again.status_code == 409 and again.json()["request_id"] == rid
    raw = primary.client()
    assert len(list(raw.scan_iter(match="vmpool:request:{*}", count=1000))) == 2


def test_a_generated_id_that_exists_is_this_create_sent_again(
    redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py sends a command again after a lost connection; a create that ran once
    already then finds its own id. An id the API made up (uuid4) can exist only so:
    the answer is 201, not a 409 about an id the client never chose; an id the client
    chose that exists stays vmpooler's 409. Modelled by making the API's generator hand
    out the id of a request that exists."""
    import vmpool.api.routers.ondemand as ondemand

    c, _ = make_client(spec_config(), redis_url)
    rid = c.post(f"{API}/ondemandvm", json={"pool3": 1}).json()["request_id"]
    monkeypatch.setattr(ondemand, "new_request_id", lambda: rid)
    again = c.post(f"{API}/ondemandvm", json={"pool3": 1})
    assert (again.status_code, again.json()) == (201, {"ok": True, "request_id": rid})
    chosen = c.post(f"{API}/ondemandvm", json={"pool3": 1, "request_id": rid})
    assert chosen.status_code == 409 and chosen.json()["request_id"] == rid
    assert len(list(redis_client.scan_iter(match="vmpool:request:{*}"))) == 1


def test_everysec_is_named_at_start_and_by_audit_strict(tmp_path: Path) -> None:
    """The check reads appendfsync: everysec is a problem by name (``vmpool audit
    --strict``: exit 1 with the line), ``always`` is not; the durability the writes
    wait for is reported (through Sentinel: WAIT, tests/test_sentinel.py)."""
    everysec = data_node(tmp_path, "everysec", "--appendonly", "yes", "--appendfsync", "everysec")
    always = data_node(tmp_path, "always", "--appendonly", "yes", "--appendfsync", "always")
    try:
        runner = CliRunner()
        got = check_redis(connect(url_of(everysec), options("auto"), decode_responses=True))
        assert any("appendfsync is everysec" in p for p in got.problems()), got
        strict = runner.invoke(cli, ["audit", "--strict", "--redis-url", url_of(everysec)])
        assert strict.exit_code == 1, strict.output
        assert "appendfsync is everysec" in strict.stderr
        fine = runner.invoke(cli, ["audit", "--strict", "--json", "--redis-url", url_of(always)])
        assert fine.exit_code == 0, fine.output
        redis_part = json.loads(fine.stdout)["redis"]
        assert redis_part["appendfsync"] == "always" and redis_part["problems"] == []
        assert redis_part["durability"].startswith("none")
    finally:
        everysec.stop()
        always.stop()


def test_a_plain_url_to_a_primary_with_replicas_is_named(
    primary_and_replica: tuple[Node, Node], caplog: pytest.LogCaptureFixture
) -> None:
    """The default waits for no replica on a redis:// URL: with a replica connected, that
    is a problem by name at start and in ``vmpool audit --strict`` (exit 1). Waiting for
    the replica (durability replicas) and min-replicas-to-write 1 leave no problem."""
    primary, _ = primary_and_replica
    plain = "Redis has 1 replica(s) and durability waits for none"
    client = connect(url_of(primary), options("auto"), decode_responses=True)
    with caplog.at_level("WARNING"):
        startup_check(client, who="worker w1")
    assert any(plain in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(RedisMisconfigured, match=re.escape(plain)):
        startup_check(client, who="worker w1", strict=True)
    strict = CliRunner().invoke(cli, ["audit", "--strict", "--redis-url", url_of(primary)])
    assert strict.exit_code == 1, strict.output
    assert plain in strict.stderr and "min-replicas-to-write is 0" in strict.stderr
    primary.client().config_set("min-replicas-to-write", 1)
    waiting = check_redis(connect(url_of(primary), options("replicas"), decode_responses=True))
    assert waiting.problems() == [], waiting.problems()


def test_a_write_not_confirmed_in_time_raises(primary_and_replica: tuple[Node, Node]) -> None:
    """The store's writes wait for the replica: with it stopped, a script is refused
    after the timeout as WriteNotConfirmed (not a ConnectionError: redis-py must not
    run it again)."""
    primary, replica = primary_and_replica
    client = connect(url_of(primary), options("replicas", 0.3), decode_responses=True)
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    assert script(keys=["n"]) == 1
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(WriteNotConfirmed):
            script(keys=["n"])
        assert time.monotonic() - started < 2.0
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    assert not isinstance(WriteNotConfirmed("x"), redis.ConnectionError)

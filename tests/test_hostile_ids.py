"""Hostile names: one validator per kind of name (vmpool.ids), the same in the
API, the CLI, the store and the job ids; and a hostile id never stops the fleet.

The verified attack: ``POST /api/v3/ondemandvm`` with ``"request_id": "poison\\n"`` was
accepted (201), RQ refused the job id, and from then on every provision sweep raised
inside ``enqueue_many`` and queued nothing: with ``ondemand_clone_limit: 1`` ordinary
requests held back by the limit all failed at their TTL.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.config import Config, parse_config
from vmpool.ids import (
    REQUEST_ID_RE,
    VALIDATORS,
    InvalidIdentifier,
    validate,
    validate_request_id,
)
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers import queues as q
from workers.worker import build_worker

from apihelp import API, HOSTILE_IDS, make_client, snapshot
from clihelp import publish_demo

TEXT_IDS = [h for h in HOSTILE_IDS if isinstance(h, str)]


# -- the validators ---------------------------------------------------------------------
def test_the_old_dollar_anchor_let_a_final_newline_through() -> None:
    """Why the bug existed: a request id checked with ``re.match(r"^...$")`` accepts
    'poison\\n'. The validator, a full match of the same pattern, refuses it."""
    old = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    assert old.match("poison\n") is not None  # the bug
    assert REQUEST_ID_RE.fullmatch("poison\n") is None
    with pytest.raises(InvalidIdentifier):
        validate_request_id("poison\n")


@pytest.mark.parametrize("kind", sorted(VALIDATORS))
@pytest.mark.parametrize("suffix", ["\n", "\r\n", "\x00", " ", "\n\n"])
def test_every_kind_refuses_a_trailing_control_character(kind: str, suffix: str) -> None:
    good = {"request": "r-1", "vm": "vm-1", "pool": "pool1", "key_prefix": "vmpool",
            "token": "abc123", "user": "jdoe", "vm_task": "vm-1:snapshot:abc1"}[kind]  # fmt: skip
    assert validate(kind, good) == good
    with pytest.raises(InvalidIdentifier):
        validate(kind, good + suffix)


@pytest.mark.parametrize("kind", sorted(VALIDATORS))
def test_refusals_never_echo_unbounded_input(kind: str) -> None:
    huge = "a\n" + "x" * 100_000
    with pytest.raises(InvalidIdentifier) as exc:
        validate(kind, huge)
    assert len(str(exc.value)) < 300
    with pytest.raises(InvalidIdentifier) as secret:
        validate("token", "s3cret token")
    assert "s3cret" not in str(secret.value)  # a token, even a bad one, is never shown


# -- the API ----------------------------------------------------------------------------
def _config(**extra: Any) -> Config:
    data: dict[str, Any] = {
        ":providers": {"sim": {"provider_class": "simulated", "boot_seconds": 0, "seed": 3}},
        ":config": {"ondemand_request_ttl": 2, "ondemand_clone_limit": 1, "max_vm_retries": 3,
                    "timeout": 5, **extra},
        ":pools": [{"name": "deb", "alias": ["debian"], "template": "deb", "size": 0,
                    "provider": "sim", "domain": "example.com"}],
    }  # fmt: skip
    return parse_config(data, source="test", env={})


def _post_hostile_ids(redis_url: str, config: Config) -> None:
    """Every hostile id of the fuzz suite, in the body and in the path: 4xx JSON, and
    nothing written."""
    client, _ = make_client(config, redis_url)
    before = snapshot(redis_url)
    for rid in HOSTILE_IDS:
        r = client.post(f"{API}/ondemandvm", content=json.dumps({"deb": 1, "request_id": rid}))
        assert r.status_code == 400, (rid, r.status_code, r.text)
        assert r.json()["ok"] is False
    for rid in TEXT_IDS:
        for method in ("GET", "DELETE"):
            path = quote(rid, safe="", errors="surrogatepass")
            r = client.request(method, f"{API}/ondemandvm/{path}")
            assert 400 <= r.status_code < 500, (rid, method, r.status_code, r.text)
            assert r.json()["ok"] is False
    assert snapshot(redis_url) == before


def test_the_api_refuses_every_hostile_request_id(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """400 JSON for each, nothing written (at 7a3df28 'poison\\n' was a 201)."""
    _post_hostile_ids(redis_url, _config())


def test_a_hostile_token_header_is_401_without_a_lookup(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """X-AUTH-TOKEN text the token validator refuses is a 401 before Redis is asked
    (red before: every header value, whatever its size, was hashed and looked up)."""
    data = {":config": {}, ":auth": {"provider": "dummy"},
            ":pools": [{"name": "deb", "template": "deb", "size": 0}]}  # fmt: skip
    client, _ = make_client(parse_config(data, source="test", env={}), redis_url)
    for token in (b"x" * 5000, b"tok en", b"tok\xffen", b"a.b", b"{t}"):
        redis_client.config_resetstat()
        r = client.post(f"{API}/ondemandvm/deb", headers={"X-AUTH-TOKEN": token})
        assert r.status_code == 401 and r.json() == {"ok": False}, (token, r.text)
        stats = redis_client.info("commandstats")
        assert "cmdstat_hgetall" not in stats, (token, stats)


# -- the CLI ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["request", "create", "debian=1", "--request-id", "poison\n"],
        ["request", "create", "debian=1", "--request-id", "a b"],
        ["request", "get", "poison\n"],
        ["request", "delete", "poison\n"],
        ["request", "history", "poison\n"],
        ["token", "create", "jdoe\n"],
        ["token", "create", "j doe"],
        ["token", "create", "x" * 5000],
        ["token", "revoke", "tok\nen"],
    ],
)
def test_the_cli_refuses_hostile_names_with_exit_2(
    redis_url: str, redis_client: redis.Redis, args: list[str]
) -> None:
    """Exit 2, one line naming the problem, nothing written (red before for `token
    create`: any non-blank user, newline or 5000 characters included, got a token)."""
    publish_demo(redis_client)
    written = redis_client.dbsize()
    result = CliRunner().invoke(cli, [*args, "--redis-url", redis_url])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vmpool: error:"), result.output
    assert len(lines[0]) < 300 and "Traceback" not in result.output
    assert redis_client.dbsize() == written


# -- the acceptance: the fleet still provisions ---------------------------------------
def _all_ready(store: Store, rids: list[str]) -> bool:
    records = [store.get_request(rid) for rid in rids]
    assert all(r is not None and r.status in ("pending", "ready") for r in records), records
    return all(r is not None and r.status == "ready" for r in records)


@pytest.mark.slow
def test_hostile_ids_never_stop_the_clone_limited_sweep(
    redis_url: str, redis_client: redis.Redis, conn: redis.Redis, tmp_path: Path
) -> None:
    """The issue's acceptance. Every hostile id of the fuzz suite is posted (all refused);
    then, as a record an older release let in would be, 'poison\\n' (and friends) sit in
    the provision queue and a VM index, planted directly since the store refuses to write
    them. With ``ondemand_clone_limit: 1``, six ordinary requests of 2 VMs each, created
    without a provision job of their own, are held back by the limit and only the
    provision sweep finds them: all six become ready. Red on the old enqueue_many (every
    provision sweep raised ValueError on 'poison\\n' and queued nothing)."""
    config = _config()
    keys = Keys(config.key_prefix)
    _post_hostile_ids(redis_url, config)
    store = Store(redis_client, keys)
    settings = RequestSettings.from_config(config)
    rids = [f"ordinary-{i}" for i in range(6)]
    for rid in rids:  # in the provision queue only: the sweep alone finds them
        assert store.create_request(rid, [Slot("deb", "deb", 2)], settings, actor="test").ok
    planted = ["poison\n", "poison\r\n", "{poison}", "x" * 300]
    redis_client.zadd(keys.provision_queue, {rid: 0 for rid in planted})  # first in line
    redis_client.zadd(keys.pool_state("deb", "pending"), {"BAD\nvm": 0})
    worker = build_worker(redis_url, config, kind="simple")
    deadline = time.monotonic() + 60
    while not _all_ready(store, rids):
        assert time.monotonic() < deadline, [store.get_request(r) for r in rids]
        for job in ("provision_sweep", "check_pending_sweep"):
            q.enqueue(conn, keys, job)  # as the scheduler would, one run of each
        worker.work(burst=True)
    assert worker.failed_job_count == 0
    skipped = redis_client.hgetall(keys.metrics("skipped"))
    assert int(skipped["provision_request:bad_subject"]) >= len(planted)
    assert int(skipped["check_pending_vm:bad_subject"]) >= 1

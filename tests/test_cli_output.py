"""The commands read alike and say what a user needs: tables with a header (the pools'
aliases shown), aliases taken wherever a pool is named, a warning for a token of a user
the config does not know, exit 0 / 1 / 2 as the command line promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from clihelp import publish_demo
from storehelp import ACTOR

POOL = "debian-12-x86_64"  # the built-in demo config's, aliases debian and debian-12
HASH = "sha256$salt$" + "ab" * 32


@pytest.fixture
def run(redis_url: str, redis_client: redis.Redis) -> object:

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(
            cli, [*args, "--redis-url", redis_url], env={"VMPOOL_CONFIG": None}
        )

    return invoke


def test_the_pools_table_has_a_header_and_the_aliases(run) -> None:  # type: ignore[no-untyped-def]
    lines = run("pools").stdout.splitlines()
    assert lines[0].split() == [
        "POOL",
        "ALIAS",
        "SIZE",
        "READY",
        "PENDING",
        "RUNNING",
        "COMPLETED",
        "ON_HOLD",
        "ONDEMAND_QUEUE",
        "FAILING",
    ]
    assert lines[1].split()[:2] == [POOL, "debian,debian-12"]


def test_enqueue_takes_an_alias_for_its_pool(run, redis_client: redis.Redis) -> None:  # type: ignore[no-untyped-def]
    store = Store(redis_client, Keys())
    rid = run("request", "create", "debian=1").stdout.strip()
    store.reserve_vm(
        rid,
        name="booting-vm",
        alias="debian",
        pool=POOL,
        template="t",
        provider="simulated",
        domain=None,
        actor=ACTOR,
    )
    store.vm_created("booting-vm", actor=ACTOR)
    by_alias = run("enqueue", "check_pending_vm", "--pool", "debian", "--json")
    assert by_alias.exit_code == 0, by_alias.output
    assert [job["subject"] for job in json.loads(by_alias.stdout)["jobs"]] == ["booting-vm"]
    unknown = run("enqueue", "check_pending_vm", "--pool", "nosuch")
    assert unknown.exit_code == 2 and "no pool or alias named 'nosuch'" in unknown.stderr


def test_a_token_for_a_user_the_config_does_not_know_is_a_warning(
    run,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    config = tmp_path / "auth.yaml"
    config.write_text(f":auth:\n  users: {{jdoe: '{HASH}'}}\n:pools:\n  - {{name: p}}\n")
    known = run("token", "create", "jdoe", "--config", str(config))
    assert known.exit_code == 0 and known.stderr == "", known.output
    nobody = run("token", "create", "nobody", "--config", str(config))
    assert nobody.exit_code == 0, nobody.output
    assert len(nobody.stdout.strip()) == 32  # the token alone on stdout, for scripts
    assert nobody.stderr == (
        f"warning: 'nobody' is not one of the users under :auth: in {config}; the token"
        " works all the same (`vmpool token revoke TOKEN` ends it)\n"
    )
    open_api = run("token", "create", "jdoe")  # the demo config: no :auth: at all
    assert open_api.exit_code == 0 and "has no :auth: section" in open_api.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("request", "get", "no-such-request"), 1),  # a failed request
        (("request", "delete", "no-such-request"), 1),
        (("vm", "show", "no-such-vm"), 1),
        (("token", "revoke", "a" * 32), 1),
        (("request", "get", "not an id!"), 2),  # bad input
        (("request", "create", "nosuch=1"), 2),
        (("request", "create", "debian=x"), 2),
        (("vm", "get", "debian=0"), 2),
        (("enqueue", "provision_request"), 2),
        (("pools", "--no-such-option"), 2),
        (("pools",), 0),
        (("audit",), 0),
    ],
)
def test_exit_status_says_what_happened(
    run, redis_client: redis.Redis, args: tuple[str, ...], code: int
) -> None:  # type: ignore[no-untyped-def]
    publish_demo(redis_client)
    result = run(*args)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    if code:
        assert result.stderr.count("\n") == 1 or "Usage:" in result.stderr, result.stderr

"""Helpers shared by the CLI tests: click's runner with a clean environment, one-line
errors, warm VMs for the `vm` and `pools` commands."""

from __future__ import annotations

import redis
from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.config import demo_config
from vmpool.config.published import publish_config
from vmpool.state.store import Store

CLEAN_ENV = {
    "VMPOOL_CONFIG": None,
    "VMPOOL_REDIS_URL": None,
    "TIMEOUT": None,
    "VMPOOLER_CONFIG": None,
    "VMPOOLER_CONFIG_FILE": None,
    "EXTRA_CONFIG": None,
}


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**CLEAN_ENV, **(env or {})})


def publish_demo(client: redis.Redis) -> None:
    """The built-in demo config published, as a fleet running it does.

    A command given only the Redis URL then runs on it (on a Redis with no fleet it warns
    that it uses the demo)."""
    publish_config(client, demo_config(), publisher="tests")


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("vmpool: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


POOL = "debian-12-x86_64"  # from the built-in demo config, alias "debian"


def warm(store: Store, n: int) -> list[str]:
    names = []
    for i in range(n):
        name = f"cli-warm-{i}"
        assert store.pools.reserve_pool_vm(
            name,
            pool=POOL,
            template="t",
            provider="simulated",
            domain="example.com",
            size=n,
            data_ttl_s=60,
            actor="test",
        ).ok
        store.vm_created(name, actor="test")
        store.vm_ready(name, actor="test")
        names.append(name)
    return names

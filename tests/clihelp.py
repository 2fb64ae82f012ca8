"""Helpers shared by the CLI tests: click's runner with a clean environment, one-line
errors, warm VMs for the `vm` and `pools` commands."""

from __future__ import annotations

from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.state.store import Store

CLEAN_ENV = {"VMPOOL_CONFIG": None, "VMPOOL_REDIS_URL": None, "TIMEOUT": None}


def run(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env={**CLEAN_ENV, **(env or {})})


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

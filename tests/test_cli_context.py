"""The command line's frame: the shared options on every command, the context that
builds config and Redis on first use, and one line (never a traceback) for any error."""

from __future__ import annotations

import click
import pytest
import redis
from click.testing import CliRunner

import vmpool.cli.main
from vmpool.cli.context import CliContext, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.cli.main import cli, main


def test_context_redis_url_required_unless_a_fallback() -> None:
    with pytest.raises(CliError, match="no Redis to use"):
        _ = CliContext().redis_url
    assert CliContext(fallback_redis_url="redis://h:1/0").redis_url == "redis://h:1/0"
    given = CliContext(redis_url="redis://given:2/0", fallback_redis_url="redis://h:1/0")
    assert given.redis_url == "redis://given:2/0"


def test_context_unreachable_redis_is_exit_1() -> None:
    cli_ctx = CliContext(redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(CliFailure, match=r"^cannot reach Redis at redis://127\.0\.0\.1:1/0: "):
        _ = cli_ctx.redis
    cli_ctx.close()


def test_context_builds_once_and_closes(redis_url: str, redis_client: redis.Redis) -> None:
    # redis_client: a clean database (no fleet's published config left by another test)
    cli_ctx = CliContext(redis_url=redis_url)
    assert cli_ctx.store is cli_ctx.store
    assert cli_ctx.store.redis is cli_ctx.redis
    assert cli_ctx.keys.prefix == cli_ctx.config.key_prefix
    assert cli_ctx.rq_redis.ping()
    assert cli_ctx.check_redis() == redis_url
    cli_ctx.close()
    assert "redis" not in vars(cli_ctx) and "rq_redis" not in vars(cli_ctx)


def test_every_command_takes_the_shared_options() -> None:
    """--config and --redis-url on every command; --json on those that print data."""
    printing = {
        "config check",
        "config show",
        "config schema",
        "request create",
        "request get",
        "request show",
        "request delete",
        "request history",
        "pools",
        "audit",
        "token create",
        "token revoke",
        "enqueue",
        "vm get",
        "vm list",
        "vm show",
        "vm extend",
        "vm delete",
        "fleet-id",
        "redis switchover",
    }
    ctx = click.Context(cli)
    seen = set()
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        subs = command.commands if isinstance(command, click.Group) else {"": command}
        for sub_name, sub in subs.items():
            full = f"{name} {sub_name}".strip()
            seen.add(full)
            options = {opt for param in sub.params for opt in param.opts}
            assert {"--config", "--redis-url"} <= options, full
            assert ("--json" in options) == (full in printing), full
    assert printing <= seen and {"api", "worker", "scheduler", "up"} <= seen


def test_main_turns_unexpected_errors_into_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("redis went away\nsecond line")

    monkeypatch.delenv("VMPOOL_DEBUG", raising=False)
    monkeypatch.setattr(vmpool.cli.main.cli, "main", boom)
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 1
    assert capsys.readouterr().err == "vmpool: error: RuntimeError: redis went away second line\n"


def test_cli_failure_exits_1() -> None:
    @click.command()
    def failing() -> None:
        raise CliFailure("2 invariants broken")

    result = CliRunner().invoke(failing, [])
    assert result.exit_code == 1
    assert result.stderr == "vmpool: error: 2 invariants broken\n"


def test_a_command_gets_its_context_and_it_is_closed_after(redis_url: str) -> None:
    seen: list[CliContext] = []

    @click.command()
    @with_context(json=True)
    @click.argument("word")
    def probe(cli_ctx: CliContext, word: str) -> None:
        seen.append(cli_ctx)
        assert cli_ctx.store.redis.ping()
        click.echo(f"{word} {cli_ctx.as_json} {cli_ctx.config_path}")

    result = CliRunner().invoke(
        probe, ["hello", "--json", "--redis-url", redis_url], env={"VMPOOL_CONFIG": None}
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello True None\n"
    assert "redis" not in vars(seen[0])  # closed when the command returned
    help_text = CliRunner().invoke(probe, ["--help"]).stdout
    assert help_text.index("--config") < help_text.index("--redis-url") < help_text.index("--json")

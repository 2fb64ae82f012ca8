"""`vmpool config check|show|schema`: exit statuses, one-line errors, JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vmpool.cli.context import CliContext
from vmpool.cli.errors import CliError, CliFailure
from vmpool.config import DEMO_SOURCE

from clihelp import assert_one_line_error, run

GOOD = """\
:config:
  ondemand_request_ttl: 2
  tmeout: 3
:redis:
  url: redis://:hunter2@redis.example.com:6379/0
:auth:
  users:
    alice: 'sha256$salt$%s'
:pools:
  - name: p1
    alias: [one]
  - name: p2
""" % ("ab" * 32)

BAD = ":pools:\n  - name: p1\n    size: abc\n"


def write(tmp_path: Path, text: str, name: str = "vmpool.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_check_ok(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run("config", "check", "--config", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"OK: {path}: 2 pools, 1 provider (1 warning above)\n"
    assert result.stderr.splitlines() == [f"warning: {path}: config.tmeout: unknown key, ignored"]
    # as a terminal shows them: the warnings first, the verdict last
    assert result.output.splitlines() == [
        f"warning: {path}: config.tmeout: unknown key, ignored",
        f"OK: {path}: 2 pools, 1 provider (1 warning above)",
    ]


@pytest.mark.parametrize("pools", ["", ":pools: []\n", ":pools:\n"])
def test_check_flags_a_file_without_pools(tmp_path: Path, pools: str) -> None:
    path = write(tmp_path, ":config: {vm_lifetime: 2}\n" + pools)
    result = run("config", "check", "--config", str(path))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"warning: {path}: pools: no pools configured",
        f"OK: {path}: 0 pools, 0 providers (1 warning above)",
    ]


def test_check_demo_by_default() -> None:
    result = run("config", "check")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"OK: {DEMO_SOURCE}: 3 pools, 2 providers\n"
    assert result.stderr == ""


def test_check_takes_vmpool_config_env(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run("config", "check", env={"VMPOOL_CONFIG": str(path)})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"OK: {path}: ")


def test_check_json(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run("config", "check", "--config", str(path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == {
        "ok": True,
        "source": str(path),
        "pools": ["p1", "p2"],
        "providers": ["simulated"],
        "warnings": [f"{path}: config.tmeout: unknown key, ignored"],
    }


def test_check_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    result = run("config", "check", "--config", str(path))
    assert_one_line_error(result, str(path), "pools[0].size", "non-negative integer")
    assert result.stdout == ""


def test_check_bad_file_json(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    result = run("config", "check", "--config", str(path), "--json")
    assert_one_line_error(result, "pools[0].size")
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["source"] == str(path)
    assert "pools[0].size" in data["error"]


def test_check_yaml_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, ":config:\n  timeout: 5\n :pools: [\n")
    assert_one_line_error(run("config", "check", "--config", str(path)), "line 3")


def test_check_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert_one_line_error(run("config", "check", "--config", str(path)), f"{path}: no such file")


def test_check_bad_env_value() -> None:
    assert_one_line_error(run("config", "check", env={"TIMEOUT": "soon"}), "TIMEOUT")


def test_bad_redis_url_option() -> None:
    result = run("config", "check", "--redis-url", "localhost:6379")
    assert_one_line_error(result, "--redis-url", "redis://")


def test_unknown_option_is_usage_error() -> None:
    result = run("config", "check", "--nope")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_show_masks_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run("config", "show", "--config", str(path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["redis_url"] == "redis://:***@redis.example.com:6379/0"
    assert data["auth"]["users"] == ["alice"]
    assert "hunter2" not in result.output
    assert "sha256$" not in result.output
    assert [pool["name"] for pool in data["pools"]] == ["p1", "p2"]
    assert data["ondemand_request_ttl_s"] == 120


def test_show_text_and_redis_url_option(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = run(
        "config", "show", "--config", str(path), "--redis-url", "redis://:s3cret@other:6380/1"
    )
    assert result.exit_code == 0, result.output
    assert "redis_url: redis://:***@other:6380/1" in result.stdout
    assert "s3cret" not in result.output


def test_show_bad_file(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    assert_one_line_error(run("config", "show", "--config", str(path)), "pools[0].size")


def test_context_config(tmp_path: Path) -> None:
    config = CliContext(config_path=str(write(tmp_path, GOOD)), redis_url="redis://h:1/0").config
    assert config.redis_url == "redis://h:1/0"
    with pytest.raises(CliError) as info:
        _ = CliContext(config_path=str(write(tmp_path, BAD, "bad.yaml"))).config
    assert info.value.exit_code == 2
    assert CliFailure("x").exit_code == 1


def test_help_and_version() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "config" in result.stdout
    result = run("config", "check", "--help")
    assert "--config PATH" in result.stdout
    assert "--redis-url URL" in result.stdout
    assert "--json" in result.stdout
    assert run("--version").exit_code == 0


def _vmpool_command() -> list[str]:
    script = Path(sys.executable).parent / "vmpool"
    return [str(script)] if script.exists() else [sys.executable, "-m", "vmpool.cli.main"]


def test_console_script_bad_config(tmp_path: Path) -> None:
    path = write(tmp_path, BAD, "bad.yaml")
    proc = subprocess.run(
        [*_vmpool_command(), "config", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"vmpool: error: {path}: pools[0].size: ")
    assert "Traceback" not in proc.stderr


def test_schema_prints_the_json_schema(tmp_path: Path) -> None:
    from vmpool.config import json_schema

    result = run("config", "schema")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json_schema()
    # The same with --json, and a bad --config is not read.
    again = run("config", "schema", "--json", "--config", str(write(tmp_path, BAD)))
    assert again.exit_code == 0, again.output
    assert again.stdout == result.stdout

"""`vmpool probe worker`: the exec probe of the worker Deployment, without Redis.

Exit 0 while the alive file is fresher than --max-age, 1 (one line with its age) when
it is older, 2 (one line) on bad usage or a missing file. The worker's side (what
touches the file, and when) is in tests/test_worker_lifecycle.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from vmpool.cli.main import cli
from vmpool.cli.probe import ALIVE_FILE_ENV
from vmpool.local.redis_server import free_port


def probe(*args: str, env: dict[str, str | None] | None = None) -> Result:
    # A Redis URL nothing listens on: the probe must not need it.
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    base: dict[str, str | None] = {ALIVE_FILE_ENV: None, "VMPOOL_REDIS_URL": unreachable}
    return CliRunner().invoke(cli, ["probe", "worker", *args], env={**base, **(env or {})})


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def aged(path: Path, seconds: float) -> Path:
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_a_fresh_file_is_alive(tmp_path: Path) -> None:
    alive = aged(tmp_path / "alive", 5)
    result = probe("--alive-file", str(alive))
    assert result.exit_code == 0, result.output
    assert "alive" in one_line(result.stdout)


def test_the_path_comes_from_the_environment(tmp_path: Path) -> None:
    alive = aged(tmp_path / "alive", 1)
    assert probe("--max-age", "60", env={ALIVE_FILE_ENV: str(alive)}).exit_code == 0
    stale = probe("--max-age", "60", env={ALIVE_FILE_ENV: str(aged(alive, 61))})
    assert stale.exit_code == 1


def test_a_stale_file_is_one_line_naming_its_age(tmp_path: Path) -> None:
    alive = aged(tmp_path / "alive", 90)
    result = probe("--alive-file", str(alive), "--max-age", "60")
    assert result.exit_code == 1
    line = one_line(result.stderr)
    assert line.startswith("vmpool: error: worker loop stale"), line
    assert "90 s ago" in line and "max 60 s" in line, line


def test_max_age_defaults_to_60_seconds(tmp_path: Path) -> None:
    assert probe("--alive-file", str(aged(tmp_path / "a", 50))).exit_code == 0
    assert probe("--alive-file", str(aged(tmp_path / "b", 70))).exit_code == 1


def test_a_missing_file_is_exit_2(tmp_path: Path) -> None:
    result = probe("--alive-file", str(tmp_path / "nothing"))
    assert result.exit_code == 2
    assert "no alive file at" in one_line(result.stderr)


def test_no_path_at_all_is_exit_2() -> None:
    result = probe()
    assert result.exit_code == 2
    assert ALIVE_FILE_ENV in one_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [["--max-age", "abc"], ["--max-age", "0"], ["--max-age"], ["surplus"], ["--nope"]],
)
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    result = probe("--alive-file", str(aged(tmp_path / "alive", 1)), *args)
    assert result.exit_code == 2, result.output
    assert one_line(result.output).startswith("vmpool: error: worker:"), result.output


def test_an_unknown_probe_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(cli, ["probe", "nosuch"])
    assert result.exit_code == 2
    assert one_line(result.output).startswith("vmpool: error: probe:"), result.output


def test_the_worker_refuses_an_alive_file_it_cannot_write(tmp_path: Path) -> None:
    # Said at start, in one line, rather than a liveness probe that never passes.
    result = CliRunner().invoke(
        cli,
        ["worker", "--alive-file", str(tmp_path / "no-such-dir" / "alive")],
        env={ALIVE_FILE_ENV: None},
    )
    assert result.exit_code == 2, result.output
    assert one_line(result.output).startswith("vmpool: error: --alive-file: cannot write")

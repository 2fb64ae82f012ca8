"""The simulator's build cache (tests/vcsimhelp.py) under parallel workers: a build
waits for the one under way and takes its binary instead of compiling a second."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

import vcsimhelp


def test_a_build_waits_for_the_one_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: while another worker holds the cache's build lock, ``build`` neither
    compiles nor returns; once that worker's binary is in place, it returns that binary
    without compiling. Without the lock it compiles at once (the join below times out
    only while it waits)."""
    gocode = tmp_path / "gocode"
    (gocode / "src/github.com/vmware/govmomi/simulator").mkdir(parents=True)
    (gocode / "src/github.com/vmware/govmomi/simulator/model.go").write_text("package x\n")
    monkeypatch.setattr(vcsimhelp, "GOCODE", gocode)
    monkeypatch.setattr(vcsimhelp.shutil, "which", lambda name: "/bin/echo")  # "go version"
    compiled: list[Path] = []
    monkeypatch.setattr(vcsimhelp, "_compile", lambda go, cache, binary, t: compiled.append(binary))
    cache = tmp_path / "cache"
    cache.mkdir()
    built: list[Path | None] = []
    with (cache / "build.lock").open("a") as other_worker:
        fcntl.flock(other_worker, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: built.append(vcsimhelp.build(cache)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not compiled, "build did not wait for the lock"
        binary = vcsimhelp.binary_for(cache, "/bin/echo")  # the other worker's build
        binary.write_text("")
    waiter.join(timeout=10)
    assert built == [binary] and not compiled

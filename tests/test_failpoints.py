"""Failpoints are inert unless configured, and fire once per marker file."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmpool.lifecycle.failpoints import FailpointError, failpoint


def test_inert_without_configuration() -> None:
    failpoint("create_vm.before_commit", env={})
    failpoint("create_vm.before_commit", env={"VMPOOL_FAILPOINTS": "other.point=raise"})


def test_raise_and_fire_once(tmp_path: Path) -> None:
    env = {"VMPOOL_FAILPOINTS": f"a.b=sleep:0, c.d=raise@{tmp_path / 'once'}"}
    failpoint("a.b", env=env)
    with pytest.raises(FailpointError):
        failpoint("c.d", env=env)
    failpoint("c.d", env=env)  # the marker exists now: it does not fire again

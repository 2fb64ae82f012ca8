"""Each pytest-xdist worker's port range (tests/portrange.py), in a real ``-n 2`` run."""

from __future__ import annotations

from pathlib import Path

import portrange
import pytest

RECORD_RANGE = """
import os
import pytest

@pytest.mark.parametrize("i", range(8))
def test_record(i):
    with open("ranges.txt", "a") as out:
        out.write(os.environ["PYTEST_XDIST_WORKER"] + " " + os.environ["VMPOOL_PORT_RANGE"] + "\\n")
"""


def _ranges(pytester: pytest.Pytester, *args: str) -> dict[str, range]:
    """Each worker's VMPOOL_PORT_RANGE in a ``-n 2`` run of the plugin as it is."""
    pytester.makepyfile(portrange=Path(portrange.__file__).read_text())
    pytester.makeconftest('pytest_plugins = ("portrange",)')
    pytester.makepyfile(test_record=RECORD_RANGE)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    seen: dict[str, range] = {}
    for line in (pytester.path / "ranges.txt").read_text().splitlines():
        worker, bounds = line.split()
        low, high = (int(x) for x in bounds.split("-"))
        assert seen.setdefault(worker, range(low, high)) == range(low, high), line
    assert set(seen) == {"gw0", "gw1"}, seen
    return seen


@pytest.mark.slow  # a pytest run of its own, with two workers
def test_each_xdist_worker_has_a_port_range_of_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the workers of one run get disjoint ranges, below the ephemeral range
    (32768-), so no two workers' servers pick the same port. A worker inherits the
    controller's environment: a range the controller set for itself must not become
    every worker's (all four workers of ``make test`` shared 10000-14000, and a test's
    API server port was taken by another worker's ``vmpool api`` before it bound it)."""
    for name in ("VMPOOL_PORT_RANGE", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
    ranges = _ranges(pytester)
    first, second = ranges["gw0"], ranges["gw1"]
    assert not set(first) & set(second), ranges
    assert min(first.start, second.start) >= 1024 and max(first.stop, second.stop) <= 32768


@pytest.mark.slow  # a pytest run of its own, with two workers
def test_a_given_range_is_shared_out_among_the_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range given in the environment is the run's: each worker has half of it."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VMPOOL_PORT_RANGE", "20000-20100")
    assert _ranges(pytester) == {"gw0": range(20000, 20050), "gw1": range(20050, 20100)}


@pytest.mark.parametrize(
    ("bounds", "worker", "count", "expected"),
    [("10000-32000", 0, 1, "10000-32000"), ("10000-32000", 3, 4, "26500-32000")],
)
def test_worker_range_slices(bounds: str, worker: int, count: int, expected: str) -> None:
    assert portrange.worker_range(bounds, worker, count) == expected


@pytest.mark.parametrize("bounds", ["10000", "a-b", "10000-10001"])
def test_a_range_that_cannot_be_shared_is_a_usage_error(bounds: str) -> None:
    with pytest.raises(pytest.UsageError, match="VMPOOL_PORT_RANGE"):
        portrange.worker_range(bounds, 0, 2)

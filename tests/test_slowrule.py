"""The fast loop's rule (tests/slowrule.py): a test over the budget that is not marked
slow is reported, and fails a strict run (``make check``); marked, it passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import slowrule

SLOW_TEST = """
import time
import pytest

def test_quick():
    pass

{mark}
def test_lingers():
    time.sleep(0.3)
"""


def _run(pytester: pytest.Pytester, mark: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(slowrule=Path(slowrule.__file__).read_text())  # the plugin as it is
    pytester.makeconftest('pytest_plugins = ("slowrule",)')
    pytester.makeini("[pytest]\nmarkers =\n  slow: slow\n  chaos: chaos\n")
    pytester.makepyfile(test_fixture=SLOW_TEST.format(mark=mark))
    return pytester.runpytest("-p", "no:hypothesispytest", "--slow-budget", "0.2", *args)


def test_an_unmarked_slow_test_fails_a_strict_run(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "", "--slow-strict")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*tests over 0.2 s not marked slow (failing the run)*"])
    result.stdout.fnmatch_lines(["*test_lingers*"])
    assert "test_quick" not in result.stdout.str().split("not marked slow")[1]


def test_an_unmarked_slow_test_is_only_reported_otherwise(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*tests over 0.2 s not marked slow (reported)*", "*test_lingers*"])


@pytest.mark.parametrize("mark", ["@pytest.mark.slow", "@pytest.mark.chaos"])
def test_a_marked_slow_test_passes_a_strict_run(pytester: pytest.Pytester, mark: str) -> None:
    result = _run(pytester, mark, "--slow-strict")
    assert result.ret == pytest.ExitCode.OK
    assert "not marked slow" not in result.stdout.str()


def test_the_durations_file_has_every_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "", "--durations-file", "times.json")
    assert result.ret == pytest.ExitCode.OK
    times = json.loads((pytester.path / "times.json").read_text())
    assert set(times) == {"test_fixture.py::test_quick", "test_fixture.py::test_lingers"}
    assert times["test_fixture.py::test_lingers"] >= 0.3 > times["test_fixture.py::test_quick"]


@pytest.mark.slow  # starts two worker processes
@pytest.mark.parametrize("mark", ["", "@pytest.mark.slow"])
def test_the_rule_holds_across_xdist_workers(pytester: pytest.Pytester, mark: str) -> None:
    """Under pytest-xdist (``make test``) the controller judges the workers' reports: a
    marked test is not reported, an unmarked slow one is, and only the controller writes
    the durations file (every test in it)."""
    result = _run(pytester, mark, "-n", "2", "--slow-strict", "--durations-file", "times.json")
    times = json.loads((pytester.path / "times.json").read_text())
    assert set(times) == {"test_fixture.py::test_quick", "test_fixture.py::test_lingers"}
    if mark:
        assert result.ret == pytest.ExitCode.OK
        assert "not marked slow" not in result.stdout.str()
    else:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*not marked slow (failing the run)*", "*test_lingers*"])

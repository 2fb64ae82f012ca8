"""The rule that keeps the fast loop fast: a test that takes long is marked ``slow``.

``make check`` runs every test not marked ``slow`` (nor ``chaos``) and must stay under
two minutes on two cores. This plugin times each test (setup, call and teardown
together: a fixture that starts a process costs its test) and, at the end of the run,
lists every test not marked ``slow`` that took longer than the budget. With
``--slow-strict`` (``make check`` passes it) such a test fails the run, so a slow test
cannot enter the fast loop unnoticed; ``make test`` only reports them (a loaded CI
machine may stretch a fast test, and that is not a reason to fail the build).

Options: ``--slow-budget SECONDS`` (default :data:`DEFAULT_BUDGET_S`) and
``--slow-strict``. ``--durations-file PATH`` writes every test's time as JSON (what
``make durations`` reads to say which tests to mark).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

import pytest

DEFAULT_BUDGET_S: Final = 2.0
# Markers that take a test out of the fast loop.
OUT_OF_THE_LOOP: Final = frozenset({"slow", "chaos"})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("slowrule", "the fast loop's budget per test")
    group.addoption(
        "--slow-budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds a test not marked slow may take (default {DEFAULT_BUDGET_S:g})",
    )
    group.addoption(
        "--slow-strict",
        action="store_true",
        help="fail the run when a test not marked slow took longer than the budget",
    )
    group.addoption("--durations-file", default=None, help="write every test's seconds as JSON")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TestTimes(config), "slowrule-times")


class TestTimes:
    """Each test's seconds (setup, call and teardown), and which are out of the loop."""

    __test__ = False  # not a test class

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)
        self.marked: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A report's keywords hold its markers' names, also in a report pytest-xdist
        # brings from a worker to the controller (which collects no items itself).
        self.seconds[report.nodeid] += report.duration
        if OUT_OF_THE_LOOP & set(report.keywords):
            self.marked.add(report.nodeid)

    def too_slow(self) -> list[tuple[str, float]]:
        """The tests not marked slow that took longer than the budget, slowest first."""
        budget = self.config.getoption("slow_budget")
        late = [
            (nodeid, s)
            for nodeid, s in self.seconds.items()
            if s > budget and nodeid not in self.marked
        ]
        return sorted(late, key=lambda pair: -pair[1])

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput"):
            return  # a pytest-xdist worker: its controller has every report and writes
        path = self.config.getoption("durations_file")
        if path:
            Path(path).write_text(json.dumps(dict(self.seconds), indent=1, sort_keys=True))
        if self.too_slow() and self.config.getoption("slow_strict") and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        late = self.too_slow()
        if not late:
            return
        budget = self.config.getoption("slow_budget")
        verdict = "failing the run" if self.config.getoption("slow_strict") else "reported"
        terminalreporter.section(f"tests over {budget:g} s not marked slow ({verdict})")
        for nodeid, seconds in late:
            terminalreporter.write_line(f"{seconds:6.2f}s {nodeid}")
        terminalreporter.write_line("mark them @pytest.mark.slow (or make them fast)")

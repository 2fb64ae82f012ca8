"""The job table (workers/table.py) is the one home of the jobs: everything agrees with it.

What this proves: each job's one name is its RQ entry point in workers/jobs.py, its
lifecycle function, its ``:schedule:`` setting when periodic (and only then), its label
in the worker metrics, what ``vmpool enqueue`` accepts, and the row docs/architecture.md
shows; the old names still reach the same job.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import workers.jobs
from vmpool import lifecycle
from vmpool.config import Schedule
from vmpool.ids import Job
from workers.table import JOBS, PERIODIC, jobs_markdown, lookup

DOCS = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def test_each_job_is_one_name_in_workers_and_lifecycle() -> None:
    entry_points = {
        name
        for name, fn in inspect.getmembers(workers.jobs, inspect.isfunction)
        if fn.__module__ == "workers.jobs" and name != "noop"
    }
    assert entry_points == set(JOBS)
    for name, spec in JOBS.items():
        assert spec.func == f"workers.jobs.{name}"
        assert callable(getattr(lifecycle, name)), name


def test_the_table_has_one_row_per_job_name_in_its_order() -> None:
    """Job (vmpool.ids) names the jobs, the table holds the rest of their facts."""
    assert list(JOBS) == list(Job)
    assert all(type(spec.name) is Job for spec in JOBS.values())


def test_periodic_jobs_are_exactly_the_schedule_settings() -> None:
    fields = (
        set(Schedule.__dataclass_fields__)
        if hasattr(Schedule, "__dataclass_fields__")
        else set(Schedule.model_fields)
    )  # type: ignore[attr-defined]
    assert {spec.name for spec in PERIODIC} == fields
    assert all(spec.subject is None for spec in PERIODIC)
    assert [spec.name for spec in PERIODIC if spec.bounded] == ["sweep_expired"]


def test_old_names_reach_the_same_job() -> None:
    for spec in JOBS.values():
        assert lookup(spec.name) is spec
        for alias in spec.aliases:
            assert lookup(alias) is spec
    aliases = [a for spec in JOBS.values() for a in spec.aliases]
    assert len(aliases) == len(set(aliases)) and not set(aliases) & set(JOBS)


def test_the_docs_show_the_table_as_it_is() -> None:
    assert jobs_markdown() in DOCS.read_text(encoding="utf-8")

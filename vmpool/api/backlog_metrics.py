"""The workers' backlog, as an autoscaler sees it: the work sets and the busy workers.

Batch jobs keep the RQ queues short (one queued job drains a whole work set), so the
queue depth says little about how much work waits. What waits is in the work sets
(``keys.work_set(job)``, one sorted set per kind of batched work: requests to provision,
reserved VMs to create, booting VMs to check): ``vmpool_work_backlog{job}`` is each
set's ZCARD, subjects waiting or claimed by a running batch, which is exactly what
KEDA's ``redis`` scaler reads of a sorted set (components/keda triggers on the same
keys). A reserved VM holds a clone slot until its create is done, and is in the
``create_vm`` set until then: the two together tell "the clone limit is reached" from
"the creates wait for a worker".

``vmpool_workers_busy`` counts the fleet's live workers running a job: with
``vmpool_workers_alive``, how saturated the workers are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily, Metric

from vmpool.ids import Job
from vmpool.lifecycle.batch import BATCHED
from vmpool.state.keys import Keys

__all__ = ["BACKLOG_JOBS", "backlog_families", "busy_family", "read_backlog"]

# The per-subject jobs that have a work set, in the job table's order.
BACKLOG_JOBS: Final[tuple[Job, ...]] = tuple(BATCHED.values())


def read_backlog(keys: Keys, pipe: Any, add: Callable[[tuple[str, ...], Any], None]) -> None:
    """Queue the ZCARD of every work set on ``pipe``, named for :func:`backlog_families`."""
    for job in BACKLOG_JOBS:
        add(("backlog", job), pipe.zcard(keys.work_set(job)))


def backlog_families(reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
    backlog = GaugeMetricFamily(
        "vmpool_work_backlog",
        "Subjects in each work set (waiting, or claimed by a running batch job): what KEDA"
        " scales the workers on",
        labels=["job"],
    )
    for job in BACKLOG_JOBS:
        backlog.add_metric([job], int(reads["backlog", job]))
    yield backlog


def busy_family(busy: int) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "vmpool_workers_busy", "Live workers of the fleet running a job (RQ state busy)"
    )
    family.add_metric([], busy)
    return family

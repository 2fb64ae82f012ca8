"""The fleet's metrics, read from Redis at each scrape: the same on every API replica.

Every read is O(pools + queues + periodic jobs + workers), never O(requests or VMs): no
SCAN, no walk over records. One scrape is a few round trips: Redis server ``TIME``, one
pipeline of counts (ZCARD of the pool indexes and the open-request index, LLEN of the
fleet's RQ queues, ZSCORE of the schedule's templates, the counter and histogram hashes
of :mod:`vmpool.state.counters`), two pipelines over the fleet's RQ workers
(:mod:`vmpool.api.worker_metrics`), and one over the providers' circuit breakers.

Counters and the ready-time histogram are kept in Redis by the transitions themselves
(the store's scripts, the workers, ``vmpool audit --metrics``), so they only grow and
every replica reports the same totals: aggregate them over replicas with ``max``, not
``sum`` (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import redis
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from rq.registry import FailedJobRegistry

from vmpool.api.backlog_metrics import backlog_families, read_backlog
from vmpool.api.identity_metrics import identity_families
from vmpool.api.provider_metrics import circuit_families
from vmpool.api.redis_metrics import redis_health_families, unwritable_family
from vmpool.api.service_metrics import read_service, service_families
from vmpool.api.worker_metrics import worker_families
from vmpool.config import Config, Schedule
from vmpool.state.counters import (
    ERRORS_METRIC,
    FINISHED_OUTCOMES,
    JOBS_METRIC,
    SKIPPED_METRIC,
    cumulative_buckets,
)
from vmpool.state.keys import INDEXED_VM_STATES
from vmpool.state.store import Store
from workers.table import PERIODIC, QUEUES, template_id

__all__ = ["RedisStateCollector"]

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStateCollector(Collector):
    """Reads the fleet's state from Redis on every scrape.

    ``pools`` are the configured pools (the only ``pool`` label values). The clone limit
    and the schedule come from the config (:meth:`from_config`). Without them their
    gauges have no sample.
    """

    def __init__(
        self,
        store: Store,
        raw_redis: redis.Redis,
        pools: Iterable[str],
        *,
        clone_limit: int | None = None,
        schedule: Schedule | None = None,
        providers: Iterable[str] = (),
        quota_users: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.keys = store.keys
        self.raw = raw_redis
        self.pools = list(pools)
        self.clone_limit = clone_limit
        self.schedule = schedule
        self.providers = list(providers)
        self.quota_users = list(quota_users)  # the `user` label's values, besides "other"

    @classmethod
    def from_config(
        cls, store: Store, raw_redis: redis.Redis, config: Config
    ) -> RedisStateCollector:
        return cls(
            store,
            raw_redis,
            config.pools,
            clone_limit=config.ondemand_clone_limit,
            schedule=config.schedule,
            providers=config.providers,
            quota_users=config.quotas.users,
        )

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        # Read everything before yielding anything, so a scrape that loses Redis half
        # way reports redis_up 0 alone, not half a scrape.
        try:
            families = list(self._collect())
        except redis.RedisError as exc:
            log.warning("metrics: Redis unavailable during scrape: %s", exc)
            return [
                _gauge("vmpool_redis_up", "1 when Redis answered this scrape", 0),
                unwritable_family(),
            ]
        return [_gauge("vmpool_redis_up", "1 when Redis answered this scrape", 1), *families]

    def _collect(self) -> Iterator[Metric]:
        now = self.store.server_time()
        yield from redis_health_families(self.store.redis, self.keys)
        reads = self._read(now)
        yield from self._vms_and_requests(reads)
        yield from self._queues(reads)
        yield from backlog_families(reads)
        yield from service_families(reads, self.quota_users)
        yield from self._clone_slots(reads)
        yield from self._schedule(reads, now)
        yield from self._ready_times(reads)
        yield from self._counters(reads)
        yield from _skipped(reads)
        yield from self._audit(reads)
        yield from worker_families(self.raw, self.keys, now)
        yield from circuit_families(self.store.redis, self.keys, self.providers)
        yield from identity_families(self.store.redis, self.keys)

    def _read(self, now: float) -> dict[tuple[str, ...], Any]:
        """Every count the scrape reports, in one pipeline. Reply by name."""
        k = self.keys
        pipe = self.store.redis.pipeline(transaction=False)
        names: list[tuple[str, ...]] = []

        def add(name: tuple[str, ...], _queued: Any) -> None:
            names.append(name)  # the pipeline replies in the order commands were queued

        for pool in self.pools:
            for state in INDEXED_VM_STATES:
                add(("vms", pool, state), pipe.zcard(k.pool_state(pool, state)))
            add(("ready_time", pool), pipe.hgetall(k.time_to_ready(pool)))
            add(("create_failures", pool), pipe.hget(k.pool_failures(pool), "consecutive"))
        add(("open",), pipe.zcard(k.open_requests))
        add(("provisioning",), pipe.zcard(k.provision_queue))
        for short in QUEUES:
            add(("depth", k.queue(short)), pipe.llen(k.rq_queue(short)))
            failed = FailedJobRegistry(k.queue(short), connection=self.raw).key
            add(("failed", k.queue(short)), pipe.zcard(failed))
        # a lease is live until its score (expiry, server time)
        add(("clone_slots",), pipe.zcount(k.clone_slots, f"({now!r}", "+inf"))
        add(("clone_stats",), pipe.hgetall(k.clone_slot_stats))
        for spec in PERIODIC:
            add(("due", spec.name), pipe.zscore(k.schedule_due, template_id(k, spec.name)))
        add(("finished",), pipe.hgetall(k.requests_finished))
        add(("jobs",), pipe.hgetall(k.metrics(JOBS_METRIC)))
        add(("errors",), pipe.hgetall(k.metrics(ERRORS_METRIC)))
        add(("skipped",), pipe.hgetall(k.metrics(SKIPPED_METRIC)))
        add(("audit",), pipe.hgetall(k.audit_result))
        read_backlog(k, pipe, add)
        read_service(k, pipe, add)
        return dict(zip(names, pipe.execute(), strict=True))

    def _vms_and_requests(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        vms = GaugeMetricFamily(
            "vmpool_vms", "VMs by pool and state (the pool indexes)", labels=["pool", "state"]
        )
        for pool in self.pools:
            for state in INDEXED_VM_STATES:
                vms.add_metric([pool, state], int(reads["vms", pool, state]))
        yield vms
        failing = GaugeMetricFamily(
            "vmpool_pool_create_failures",
            "Creates of the pool that failed in a row (0 once one goes through)",
            labels=["pool"],
        )
        for pool in self.pools:
            failing.add_metric([pool], int(reads["create_failures", pool] or 0))
        yield failing
        yield _gauge(
            "vmpool_requests_open",
            "Requests pending (the open-request index)",
            int(reads[("open",)]),
        )
        yield _gauge(
            "vmpool_requests_provisioning",
            "Requests with VMs still to reserve",
            int(reads[("provisioning",)]),
        )

    def _queues(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "vmpool_queue_depth", "Jobs waiting in each of the fleet's RQ queues", labels=["queue"]
        )
        failed = GaugeMetricFamily(
            "vmpool_queue_failed_jobs", "Jobs in each RQ queue's failed registry", labels=["queue"]
        )
        for short in QUEUES:
            name = self.keys.queue(short)
            depth.add_metric([name], int(reads["depth", name]))
            failed.add_metric([name], int(reads["failed", name]))
        yield depth
        yield failed

    def _clone_slots(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        yield _gauge(
            "vmpool_clone_slots_in_use",
            "Live leases of the fleet-wide clone semaphore (clones in progress)",
            int(reads[("clone_slots",)]),
        )
        limit = GaugeMetricFamily(
            "vmpool_clone_slots_limit", "The fleet-wide clone limit (ondemand_clone_limit)"
        )
        if self.clone_limit is not None:
            limit.add_metric([], self.clone_limit)
        yield limit
        stats = _numbers(reads[("clone_stats",)])
        yield _gauge(
            "vmpool_clone_slots_peak",
            "The most clone-slot leases ever live at once (above the limit: it was exceeded)",
            stats.get("peak", 0),
        )
        overruns = CounterMetricFamily(
            "vmpool_clone_slot_overruns", "Creates that went on without a clone slot"
        )
        overruns.add_metric([], stats.get("overruns", 0))
        yield overruns

    def _schedule(self, reads: Mapping[tuple[str, ...], Any], now: float) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "vmpool_schedule_lag_seconds",
            "How far each periodic job's next due time is behind Redis server time"
            " (0 while not yet due; no sample before a scheduler wrote its template)",
            labels=["job"],
        )
        interval = GaugeMetricFamily(
            "vmpool_schedule_interval_seconds",
            "Each periodic job's interval (the :schedule: setting of its name)",
            labels=["job"],
        )
        for spec in PERIODIC:
            due = reads["due", spec.name]
            if due is not None:
                lag.add_metric([spec.name], max(0.0, now - float(due)))
            if self.schedule is not None:
                interval.add_metric([spec.name], float(getattr(self.schedule, spec.name)))
        yield lag
        yield interval

    def _ready_times(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        """One histogram under two names: vmpool's, and vmpooler's for its dashboards."""
        ours = HistogramMetricFamily(
            "vmpool_time_to_ready_seconds",
            "Seconds from a VM's reservation to its being ready, by pool",
            labels=["pool"],
        )
        theirs = HistogramMetricFamily(
            "vmpooler_time_to_ready_state",
            "vmpooler's name for vmpool_time_to_ready_seconds (same data)",
            labels=["pool"],
        )
        for pool in self.pools:
            buckets, total = cumulative_buckets(_numbers(reads["ready_time", pool]))
            ours.add_metric([pool], buckets, total)
            theirs.add_metric([pool], buckets, total)
        yield ours
        yield theirs

    def _counters(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        finished = CounterMetricFamily(
            "vmpool_requests_finished",
            "Requests that left pending, by outcome: ready, failed, deleted (before ready)",
            labels=["outcome"],
        )
        counts = _numbers(reads[("finished",)])
        for outcome in FINISHED_OUTCOMES:
            finished.add_metric([outcome], counts.get(outcome, 0.0))
        yield finished
        jobs = CounterMetricFamily(
            "vmpool_worker_jobs",
            "Jobs finished by the workers, by job and outcome",
            labels=["job", "outcome"],
        )
        for field, value in sorted(_numbers(reads[("jobs",)]).items()):
            job, _, outcome = field.rpartition(":")
            jobs.add_metric([job or field, outcome], value)
        yield jobs
        errors = CounterMetricFamily(
            "vmpooler_errors",
            "Errors by kind and pool (vmpooler_errors.<kind>.<pool>), configured pools only",
            labels=["type", "pool"],
        )
        for field, value in sorted(_numbers(reads[("errors",)]).items()):
            kind, _, pool = field.partition(":")
            if pool in self.pools:
                errors.add_metric([kind, pool], value)
        yield errors

    def _audit(self, reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
        result = _numbers(reads[("audit",)])
        violations = GaugeMetricFamily(
            "vmpool_audit_violations",
            "Violations found by the last `vmpool audit --metrics` (no sample before one)",
        )
        last_run = GaugeMetricFamily(
            "vmpool_audit_last_run_timestamp_seconds",
            "When the last `vmpool audit --metrics` ran (Unix time, Redis server clock)",
        )
        if "violations" in result and "time" in result:
            violations.add_metric([], result["violations"])
            last_run.add_metric([], result["time"])
        yield violations
        yield last_run


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _numbers(raw: Mapping[Any, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (raw or {}).items():
        try:
            out[_text(key)] = float(_text(value))
        except ValueError:
            continue
    return out


def _skipped(reads: Mapping[tuple[str, ...], Any]) -> Iterator[Metric]:
    """Items a batch skipped as invalid (vmpool.state.counters.record_skipped).

    The job names come from the job table and the reasons from the code, so the labels
    stay few."""
    skipped = CounterMetricFamily(
        "vmpool_skipped_items",
        "Subjects a batched enqueue skipped as invalid, by job and reason",
        labels=["job", "reason"],
    )
    for field, value in sorted(_numbers(reads[("skipped",)]).items()):
        job, _, reason = field.rpartition(":")
        skipped.add_metric([job or field, reason], value)
    yield skipped

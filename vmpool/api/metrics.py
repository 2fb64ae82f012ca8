"""Prometheus metrics of the API, and of the fleet as Redis shows it at scrape time.

Each app gets its own ``CollectorRegistry`` (no global registry, so several apps live in
one process, as the tests make them). Two kinds of metric:

* counters the API process keeps (``ApiMetrics``): vmpooler's on-demand names, with
  vmpooler's default Prometheus prefix ``vmpooler_`` and its dotted segments as labels;
* gauges and a histogram read from Redis on each scrape (``RedisStateCollector``), so any
  API replica reports the same fleet-wide numbers: VMs by pool and state, requests by
  status, RQ queue depths and workers, the time from reservation to ready per pool
  (vmpooler's ``time_to_ready_state``), and the workers' job counters.

Workers run each job in a forked child, so they do not keep Prometheus counters in
memory: they count in Redis (:mod:`vmpool.state.counters`), and every scrape reads
those hashes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from rq import Queue, Worker
from rq.worker import BaseWorker

from vmpool.state.counters import ERRORS_METRIC, JOBS_METRIC
from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.store import Store
from workers.queues import queue_names

__all__ = [
    "READY_BUCKETS",
    "ApiMetrics",
    "RedisStateCollector",
    "fleet_workers",
]

log = logging.getLogger(__name__)

# vmpooler's POOLER_READY_TIME_BUCKETS, with small ones added for fast clouds.
READY_BUCKETS: Sequence[float] = (
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    500.0,
    800.0,
    1200.0,
    1600.0,
)
SCAN_LIMIT = 50_000  # records read per scrape, at most (per kind)
REQUEST_STATUSES = ("pending", "ready", "failed", "deleted")


def fleet_workers(raw: redis.Redis, keys: Keys) -> list[BaseWorker]:
    """The RQ workers registered in this database that listen to one of the fleet's
    queues (another fleet's, under another key prefix, are not ours to report)."""
    ours = set(queue_names(keys))
    return [w for w in Worker.all(connection=raw) if ours.intersection(w.queue_names())]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ApiMetrics:
    """The counters one API app keeps in memory, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests_vm = Counter(
            "vmpooler_http_requests_vm",
            "API calls by vmpooler's method.subject.operation",
            ["method", "subject", "operation"],
            registry=r,
        )
        self.generate = Counter(
            "vmpooler_ondemandrequest_generate",
            "On-demand requests accepted (success) or refused as duplicates",
            ["type"],
            registry=r,
        )
        self.fail = Counter(
            "vmpooler_ondemandrequest_fail",
            "On-demand requests refused: toomanyrequests (by name asked for) or invalid",
            ["type", "pool"],
            registry=r,
        )
        self.enqueue_failures = Counter(
            "vmpool_api_enqueue_failures",
            "Provision jobs the API could not enqueue (the periodic sweep finds the request)",
            registry=r,
        )
        self.responses = Counter(
            "vmpool_http_responses",
            "HTTP responses by route template, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "vmpool_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["route", "method"],
            registry=r,
        )
        for kind in ("success", "duplicaterequests"):
            self.generate.labels(kind)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class RedisStateCollector(Collector):
    """Reads the fleet's state from Redis on every scrape."""

    def __init__(
        self,
        store: Store,
        raw_redis: redis.Redis,
        pools: Iterable[str],
        *,
        scan_limit: int = SCAN_LIMIT,
    ) -> None:
        self.store = store
        self.keys = store.keys
        self.raw = raw_redis
        self.pools = list(pools)
        self.scan_limit = scan_limit

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self._collect()
        except redis.RedisError as exc:
            log.warning("metrics: Redis unavailable during scrape: %s", exc)
            up = GaugeMetricFamily("vmpool_redis_up", "1 when Redis answered this scrape")
            up.add_metric([], 0)
            yield up

    def _collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("vmpool_redis_up", "1 when Redis answered this scrape")
        up.add_metric([], 1)
        yield up

        vms = GaugeMetricFamily("vmpool_vms", "VMs by pool and state", labels=["pool", "state"])
        for pool, counts in self.store.pool_counts(self.pools).items():
            for state in INDEXED_VM_STATES:
                vms.add_metric([pool, state], counts.get(state, 0))
        yield vms

        open_ = GaugeMetricFamily("vmpool_requests_open", "Requests pending (open-request index)")
        open_.add_metric([], int(self.store.redis.zcard(self.keys.open_requests)))
        yield open_
        prov = GaugeMetricFamily(
            "vmpool_requests_provisioning", "Requests with VMs still to reserve"
        )
        prov.add_metric([], int(self.store.redis.zcard(self.keys.provision_queue)))
        yield prov

        yield from self._requests_by_status()
        yield from self._ready_times()
        yield from self._rq()
        yield from self._worker_counters()

    def _scan(self, pattern: str) -> list[str]:
        found: list[str] = []
        for key in self.store.redis.scan_iter(match=pattern, count=1000):
            found.append(_text(key))
            if len(found) >= self.scan_limit:
                break
        return found

    def _requests_by_status(self) -> Iterator[Metric]:
        keys = self._scan(self.keys.request_pattern())
        pipe = self.store.redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "status")
        counts = dict.fromkeys(REQUEST_STATUSES, 0)
        for raw in pipe.execute() if keys else []:
            if raw is not None:
                status = _text(raw)
                counts[status] = counts.get(status, 0) + 1
        fam = GaugeMetricFamily(
            "vmpool_requests",
            "Request records in Redis by status (terminal ones until their data_ttl)",
            labels=["status"],
        )
        for status, n in counts.items():
            fam.add_metric([status], n)
        yield fam

    def _ready_times(self) -> Iterator[Metric]:
        """vmpooler's time_to_ready_state per pool: ready_at minus reserved_at of every
        VM record that reached running (tombstones included, until their data_ttl)."""
        names = [k for k in self._scan(self.keys.vm_pattern()) if not k.endswith(":fence")]
        pipe = self.store.redis.pipeline(transaction=False)
        for key in names:
            pipe.hmget(key, "pool", "reserved_at", "ready_at")
        per_pool: dict[str, list[float]] = {}
        for pool, reserved, ready in pipe.execute() if names else []:
            if pool is None or not reserved or not ready:
                continue
            try:
                seconds = float(_text(ready)) - float(_text(reserved))
            except ValueError:
                continue
            per_pool.setdefault(_text(pool), []).append(max(0.0, seconds))
        fam = HistogramMetricFamily(
            "vmpooler_time_to_ready_state",
            "Seconds from a VM's reservation to its being ready, by pool",
            labels=["pool"],
        )
        for pool in sorted(set(self.pools) | set(per_pool)):
            samples = per_pool.get(pool, [])
            buckets = [
                (_bucket_label(bound), sum(1 for s in samples if s <= bound))
                for bound in READY_BUCKETS
            ]
            buckets.append(("+Inf", len(samples)))
            fam.add_metric([pool], buckets, sum(samples))
        yield fam

    def _rq(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "vmpool_queue_depth", "Jobs waiting per RQ queue", labels=["queue"]
        )
        failed = GaugeMetricFamily(
            "vmpool_queue_failed_jobs", "Jobs in each RQ queue's failed registry", labels=["queue"]
        )
        workers = GaugeMetricFamily(
            "vmpool_workers", "RQ workers registered, by state", labels=["state"]
        )
        try:
            for name in queue_names(self.keys):
                queue = Queue(name, connection=self.raw)
                depth.add_metric([queue.name], queue.count)
                failed.add_metric([queue.name], queue.failed_job_registry.count)
            by_state: dict[str, int] = {}
            for worker in fleet_workers(self.raw, self.keys):
                state = _text(worker.get_state())
                by_state[state] = by_state.get(state, 0) + 1
            for state, n in sorted(by_state.items()):
                workers.add_metric([state], n)
        except redis.RedisError:
            raise
        except Exception as exc:  # an RQ version quirk must not break the scrape
            log.warning("metrics: could not read RQ state: %s", exc)
        yield depth
        yield failed
        yield workers

    def _worker_counters(self) -> Iterator[Metric]:
        jobs = CounterMetricFamily(
            "vmpool_worker_jobs",
            "Jobs finished by the workers, by job and outcome",
            labels=["job", "outcome"],
        )
        for field, value in sorted(self._hash(JOBS_METRIC).items()):
            job, _, outcome = field.rpartition(":")
            jobs.add_metric([job or field, outcome], value)
        yield jobs
        errors = CounterMetricFamily(
            "vmpooler_errors",
            "Errors by kind and pool (vmpooler_errors.<kind>.<pool>)",
            labels=["type", "pool"],
        )
        for field, value in sorted(self._hash(ERRORS_METRIC).items()):
            kind, _, pool = field.partition(":")
            errors.add_metric([kind, pool], value)
        yield errors

    def _hash(self, name: str) -> dict[str, float]:
        raw = self.store.redis.hgetall(self.keys.metrics(name)) or {}
        out: dict[str, float] = {}
        for k, v in raw.items():
            try:
                out[_text(k)] = float(_text(v))
            except ValueError:
                continue
        return out


def _bucket_label(bound: float) -> str:
    return repr(float(bound))

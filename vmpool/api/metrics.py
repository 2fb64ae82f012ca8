"""Prometheus metrics of the API (this module) and of the fleet (:mod:`.fleet_metrics`).

Each app gets its own ``CollectorRegistry`` (no global registry, so several apps live in
one process, as the tests make them). Two kinds of metric:

* counters the API process keeps (``ApiMetrics``, per replica: sum them over replicas):
  vmpooler's on-demand names, with vmpooler's default Prometheus prefix ``vmpooler_``
  and its dotted segments as labels, and the HTTP responses and latency
* the fleet's gauges, counters and histogram, read from Redis on each scrape
  (:class:`~vmpool.api.fleet_metrics.RedisStateCollector`), the same on every replica.

Every label set is bounded: routes are templates (``unmatched`` when none matched),
methods one of :data:`HTTP_METHODS` or ``other``, pools the configured ones.
docs/metrics.md lists every metric.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from vmpool.api.fleet_metrics import RedisStateCollector
from vmpool.api.worker_metrics import fleet_workers

__all__ = [
    "HTTP_METHODS",
    "ApiMetrics",
    "MethodBounded",
    "RedisStateCollector",
    "fleet_workers",
    "http_method",
]

# The methods a `method` label may carry. Any other string a client sends is "other",
# so a client cannot grow the label set (and the scrape) by inventing methods.
HTTP_METHODS: Final = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})
OTHER_METHOD: Final = "other"

M = TypeVar("M", Counter, Histogram)


def http_method(method: str) -> str:
    """The ``method`` label of an HTTP method: itself if known, else ``other``."""
    return method if method in HTTP_METHODS else OTHER_METHOD


class MethodBounded(Generic[M]):
    """A metric labelled (route, method, ...) whose method label is bounded.

    Callers keep calling ``.labels(route, method, ...)`` and get :func:`http_method`
    applied."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric

    def labels(self, route: str, method: str, *rest: str) -> M:
        child: M = self.metric.labels(route, http_method(method), *rest)
        return child


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
        self.checkout = _checkout_counter(r)
        self.enqueue_failures = Counter(
            "vmpool_api_enqueue_failures",
            "Provision jobs the API could not enqueue (the periodic sweep finds the request)",
            registry=r,
        )
        self.responses = MethodBounded(
            Counter(
                "vmpool_http_responses",
                "HTTP responses by route template, method and status",
                ["route", "method", "status"],
                registry=r,
            )
        )
        self.latency = MethodBounded(
            Histogram(
                "vmpool_http_request_duration_seconds",
                "HTTP request latency by route template and method",
                ["route", "method"],
                registry=r,
            )
        )
        for kind in ("success", "duplicaterequests"):
            self.generate.labels(kind)
        self.generated = self.generate.labels("success")  # every POST that creates
        # (route, method, status) -> its counter and histogram children: a response is
        # counted without the label lookups (the label sets are bounded, so is this).
        self._observed: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self._vm_calls: dict[tuple[str, str, str], Counter] = {}  # made on first use

    def count_vm_call(self, method: str, subject: str, operation: str) -> None:
        """One call as vmpooler's ``http_requests_vm_total`` counts it (a hot route's
        every call: the child is looked up once)."""
        key = (method, subject, operation)
        child = self._vm_calls.get(key)
        if child is None:
            child = self._vm_calls[key] = self.http_requests_vm.labels(*key)
        child.inc()

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """One response of ``route`` (a template, or ``unmatched``): counted, and timed."""
        key = (route, http_method(method), status)
        children = self._observed.get(key)
        if children is None:
            children = (
                self.responses.labels(route, method, str(status)),
                self.latency.labels(route, method),
            )
            self._observed[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def _checkout_counter(registry: CollectorRegistry) -> Counter:
    """vmpooler's ``checkout.<outcome>.<pool>`` as one counter labelled by both."""
    return Counter(
        "vmpooler_checkout",
        "Checkouts (POST /vm) by outcome, vmpooler's checkout.<outcome>.<pool>: success,"
        " empty (a pool short: nothing handed out), invalid (an unknown name), quota (the"
        " user's quota: nothing handed out)",
        ["type", "pool"],
        registry=registry,
    )

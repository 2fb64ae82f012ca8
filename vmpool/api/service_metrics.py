"""Request-level service figures, as a client of the fleet lives them: time from POST to
ready by where the VMs came from, the warm pools' hit ratio, the ETA's own error, and the
users' quotas (held now, requests that waited for one).

Read at each scrape from the hashes the store's scripts keep in the units of the
transitions (scripts/_quota.lua: ``observe_request_ready`` when a request turns ready,
``quota_move`` at each VM a user starts or stops holding, quota_park.lua at a request's
first wait), in the scrape's one pipeline: a few commands, whatever the number of
requests. The ``user`` label is bounded: the users the config names under ``:quotas:
users:``, and ``other`` for everyone else added up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from vmpool.state.counters import cumulative_buckets
from vmpool.state.keys import Keys

__all__ = ["OTHER_USER", "SOURCES", "read_service", "service_families"]

# Where a ready request's VMs came from: all from warm pools, or some cloned for it.
SOURCES: Final = ("warm", "fresh")
OTHER_USER: Final = "other"


def read_service(keys: Keys, pipe: Any, add: Callable[[tuple[str, ...], Any], None]) -> None:
    """Queue the service figures' reads on ``pipe``, named for :func:`service_families`."""
    for source in SOURCES:
        add(("request_ready", source), pipe.hgetall(keys.request_ready_metric(source)))
    add(("eta_error",), pipe.hgetall(keys.eta_error_metric))
    add(("quota_waits",), pipe.hgetall(keys.quota_waits_metric))
    add(("quota_vms",), pipe.hgetall(keys.quota_vms))
    add(("quota_parked",), pipe.hlen(keys.quota_parked))


def _numbers(raw: Mapping[Any, Any] | None) -> dict[str, float]:
    return {_text(k): float(_text(v)) for k, v in (raw or {}).items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _by_user(raw: Mapping[Any, Any] | None, users: Iterable[str]) -> dict[str, float]:
    """A hash user -> number, the users not named added up under ``other``."""
    named = {user: 0.0 for user in users}
    named[OTHER_USER] = 0.0
    for user, value in _numbers(raw).items():
        named[user if user in named and user != OTHER_USER else OTHER_USER] += value
    return named


def service_families(
    reads: Mapping[tuple[str, ...], Any], users: Iterable[str]
) -> Iterator[Metric]:
    """The families of the figures :func:`read_service` read; ``users``: the named ones."""
    ready = HistogramMetricFamily(
        "vmpool_request_ready_seconds",
        "Seconds from a request's POST to its being ready, by where its VMs came from:"
        " warm (all from warm pools) or fresh (some cloned for it)",
        labels=["source"],
    )
    served: dict[str, float] = {}
    for source in SOURCES:
        buckets, total = cumulative_buckets(_numbers(reads["request_ready", source]))
        ready.add_metric([source], buckets, total)
        served[source] = buckets[-1][1]
    yield ready
    all_served = sum(served.values())
    hit = GaugeMetricFamily(
        "vmpool_warm_hit_ratio",
        "Share of the requests served so far whose VMs all came from warm pools (0 before any)",
    )
    hit.add_metric([], served["warm"] / all_served if all_served else 0.0)
    yield hit
    eta = HistogramMetricFamily(
        "vmpool_eta_error_seconds",
        "How far a request's ready time was from the ETA it was created with (absolute)",
    )
    buckets, total = cumulative_buckets(_numbers(reads[("eta_error",)]))
    eta.add_metric([], buckets, total)
    yield eta
    yield from _quota_families(reads, list(users))


def _quota_families(reads: Mapping[tuple[str, ...], Any], users: list[str]) -> Iterator[Metric]:
    waits = CounterMetricFamily(
        "vmpool_quota_waits",
        "Requests that waited for their user's quota (each once), by user",
        labels=["user"],
    )
    for user, count in _by_user(reads[("quota_waits",)], users).items():
        waits.add_metric([user], count)
    yield waits
    held = GaugeMetricFamily(
        "vmpool_quota_held_vms",
        "VMs each user holds or has in the making (what max_vms counts), by user",
        labels=["user"],
    )
    for user, count in _by_user(reads[("quota_vms",)], users).items():
        held.add_metric([user], count)
    yield held
    parked = GaugeMetricFamily(
        "vmpool_requests_waiting_for_quota",
        "Pending requests waiting for their user's quota (parked)",
    )
    parked.add_metric([], int(reads[("quota_parked",)] or 0))
    yield parked

"""The providers' circuit breakers as metrics (vmpool/state/circuit.py).

One pipeline per scrape over the configured providers, whatever the number of VMs."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from vmpool.state.circuit import read_states
from vmpool.state.keys import Keys

__all__ = ["circuit_families"]


def circuit_families(client: redis.Redis, keys: Keys, providers: Iterable[str]) -> Iterator[Metric]:
    states = read_states(client, keys, providers)
    open_ = GaugeMetricFamily(
        "vmpool_provider_circuit_open",
        "1 while the provider's circuit breaker holds its pools' creates back, else 0",
        labels=["provider"],
    )
    failures = GaugeMetricFamily(
        "vmpool_provider_consecutive_failures",
        "Failed creates at the provider since its last successful one",
        labels=["provider"],
    )
    opened = CounterMetricFamily(
        "vmpool_provider_circuit_opened",
        "Times the provider's circuit breaker opened",
        labels=["provider"],
    )
    quota = GaugeMetricFamily(
        "vmpool_provider_quota_held",
        "1 while the provider's creates wait after its cloud answered quota, else 0",
        labels=["provider"],
    )
    held = CounterMetricFamily(
        "vmpool_provider_quota_holds",
        "Times a quota answer held the provider's creates back",
        labels=["provider"],
    )
    for state in states:
        open_.add_metric([state.provider], 1 if state.open else 0)
        failures.add_metric([state.provider], state.failures)
        opened.add_metric([state.provider], state.opened)
        quota.add_metric([state.provider], 1 if state.quota else 0)
        held.add_metric([state.provider], state.quota_held)
    yield open_
    yield failures
    yield opened
    yield quota
    yield held

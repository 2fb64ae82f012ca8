"""Redis's own health as metrics: memory against its limit, and whether it takes writes.

``vmpool_redis_memory_used_bytes`` / ``vmpool_redis_memory_max_bytes`` let an alert fire
before a full Redis refuses writes (``maxmemory`` under ``noeviction``).
``vmpool_redis_writable`` is 0 while it refuses them (out of memory, read-only, too few
replicas, writes not confirmed durable) or does not answer. Two round trips per scrape:
``INFO memory`` and one small write (:func:`vmpool.state.redis_health.probe`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import redis
from prometheus_client.core import GaugeMetricFamily, Metric

from vmpool.state.keys import Keys
from vmpool.state.redis_health import RedisCondition, memory, probe

__all__ = ["WRITABLE", "redis_health_families", "unwritable_family"]

WRITABLE: Final = "vmpool_redis_writable"
WRITABLE_HELP: Final = (
    "1 when Redis took this scrape's probe write (confirmed durable), 0 when it refused"
    " it (out of memory, read-only, too few replicas, unconfirmed) or did not answer"
)


def redis_health_families(client: redis.Redis, keys: Keys) -> Iterator[Metric]:
    used, limit = memory(client)
    yield _gauge("vmpool_redis_memory_used_bytes", "Redis's used_memory", used)
    yield _gauge("vmpool_redis_memory_max_bytes", "Redis's maxmemory (0: no limit)", limit)
    writable = probe(client, keys) is RedisCondition.OK
    yield _gauge(WRITABLE, WRITABLE_HELP, 1 if writable else 0)


def unwritable_family() -> Metric:
    """The writable gauge of a scrape that could not reach Redis."""
    return _gauge(WRITABLE, WRITABLE_HELP, 0)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family

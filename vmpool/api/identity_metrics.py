"""The fleet's marks as metrics (vmpool/state/fleet_identity.py): one read per scrape."""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client.core import GaugeMetricFamily, Metric

from vmpool.state.fleet_identity import MarkRole, read_marks
from vmpool.state.keys import Keys

__all__ = ["identity_families"]


def identity_families(client: redis.Redis, keys: Keys) -> Iterator[Metric]:
    marks = read_marks(client, keys)
    family = GaugeMetricFamily(
        "vmpool_fleet_marks",
        "The fleet's marks besides its identity, by role. lost > 0: Redis lost the fleet's"
        " data; no VM without a record is destroyed until `vmpool fleet-id --adopt` or"
        " `--forget` each lost mark",
        labels=["role"],
    )
    roles = list(marks.others.values()) if marks is not None else []
    for role in MarkRole:
        family.add_metric([role.value], roles.count(role))
    yield family

"""Fleet-wide counters kept in Redis, so every process adds to the same totals.

Workers may run each job in a forked child, and the API runs in several replicas, so no
process keeps these in memory: :func:`record_job` / :func:`record_error` HINCRBY a hash
under ``keys.metrics(...)``, and every scrape of ``/metrics`` (vmpool.api.metrics) reads
those hashes.
"""

from __future__ import annotations

from typing import Final

import redis

from vmpool.state.keys import Keys

__all__ = ["ERRORS_METRIC", "JOBS_METRIC", "record_error", "record_job"]

JOBS_METRIC: Final = "jobs"  # hash field "<job>:<outcome>" -> count
# hash field "<kind>:<pool>" -> count (vmpooler's vmpooler_errors.<kind>.<pool>)
ERRORS_METRIC: Final = "errors"


def record_job(redis_client: redis.Redis, keys: Keys, job: str, outcome: str) -> None:
    """Count one finished job (``outcome``: ok, failed, refused, ...), for /metrics."""
    redis_client.hincrby(keys.metrics(JOBS_METRIC), f"{job}:{outcome}", 1)


def record_error(redis_client: redis.Redis, keys: Keys, kind: str, pool: str) -> None:
    """Count one error of a pool (vmpooler's ``vmpooler_errors.<kind>.<pool>``)."""
    redis_client.hincrby(keys.metrics(ERRORS_METRIC), f"{kind}:{pool}", 1)

"""Fleet-wide counters kept in Redis, so every process adds to the same totals.

Workers may run each job in a forked child, and the API runs in several replicas. So no
process keeps these in memory. Three kinds of writer:

* The store's transition scripts, in the same atomic unit as the transition. They count
  requests finished by outcome (``keys.requests_finished``) and the ready-time
  histogram of each pool (``keys.time_to_ready(pool)``). :func:`lua_metrics` renders
  their keys and the histogram's bucket bounds into the scripts' prelude. The bounds
  are defined here once, so the scripts and the scrape cannot disagree.
* The workers. :func:`record_job` and :func:`record_error` HINCRBY a hash.
  :func:`record_skipped` counts the subjects a batch skipped as invalid.

The scripts also count each pool's VMs made (reserved -> booting) and destroyed at its
provider (``VMS_METRIC``): the dashboard's per-minute rates are differences of these
totals (vmpool.state.history).
* ``vmpool audit --metrics``: :func:`record_audit`.

Every scrape of ``/metrics`` (vmpool.api.fleet_metrics) reads those hashes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import redis

from vmpool.state.keys import Keys
from vmpool.state.pool_failures import streak_key_prefix

__all__ = [
    "ERRORS_METRIC",
    "FINISHED_OUTCOMES",
    "JOBS_METRIC",
    "READY_BUCKETS",
    "READY_OVERFLOW",
    "READY_SUM",
    "SKIPPED_METRIC",
    "VMS_METRIC",
    "bucket_field",
    "cumulative_buckets",
    "lua_metrics",
    "lua_quota_keys",
    "record_audit",
    "record_error",
    "record_job",
    "record_skipped",
    "vm_totals",
]

JOBS_METRIC: Final = "jobs"  # hash field "<job>:<outcome>" -> count
# hash field "<kind>:<pool>" -> count (vmpooler's vmpooler_errors.<kind>.<pool>)
ERRORS_METRIC: Final = "errors"
# hash field "<job>:<reason>" -> subjects a batch enqueue skipped (workers/queues.py)
SKIPPED_METRIC: Final = "skipped"
# hash field "<event>:<pool>" -> VMs of the pool created (or destroyed) at its provider
VMS_METRIC: Final = "vms"

# How a request leaves ``pending``, once each: fulfilled, failed, or deleted before it
# was ready (a ready request deleted later was already counted as ready, so the
# outcomes add up to the requests finished and a failure ratio means what it says).
FINISHED_OUTCOMES: Final[tuple[str, ...]] = ("ready", "failed", "deleted")

# Upper bounds (seconds) of the ready-time histogram: vmpooler's
# POOLER_READY_TIME_BUCKETS (30 to 1600 s), with small ones added for fast clouds.
# Changing them splits history: a bucket's past counts stay under its old bound.
READY_BUCKETS: Final[Sequence[float]] = (
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
READY_OVERFLOW: Final = "+Inf"  # the field of observations above the last bound
READY_SUM: Final = "sum"  # the field holding the sum of all observations (seconds)


def bucket_field(bound: float) -> str:
    """The hash field (and Prometheus ``le`` label) of a bucket: ``1.0``, ``2.5``..."""
    return repr(float(bound))


def lua_metrics(keys: Keys) -> str:
    """The metric keys of ``keys``' fleet and the ready-time buckets, as Lua source.

    The store prepends it to every script, before ``_prelude.lua``, which uses them. Each
    bucket holds only its own observations. :func:`cumulative_buckets` adds them up at
    scrape time, so one observation costs one HINCRBY, not one per bound.
    """
    bounds = ", ".join(repr(float(b)) for b in READY_BUCKETS)
    fields = ", ".join(repr(bucket_field(b)) for b in READY_BUCKETS)
    return (
        f"local METRIC_FINISHED = {keys.requests_finished!r}\n"
        f"local METRIC_READY_PREFIX = {keys.time_to_ready_prefix()!r}\n"
        f"local READY_BOUNDS = {{{bounds}}}\n"
        f"local READY_FIELDS = {{{fields}}}\n"
        f"local READY_OVERFLOW = {READY_OVERFLOW!r}\n"
        f"local READY_SUM = {READY_SUM!r}\n"
        # vmpooler's daily summary hashes, and the runtime pool settings the
        # reservation and ready scripts honour (vmpool/state/overrides.py)
        f"local SUMMARY_PREFIX = {keys.summary_prefix()!r}\n"
        f"local POOL_RESETS = {keys.pool_resets!r}\n"
        f"local TEMPLATE_OVERRIDES = {keys.pool_override('template')!r}\n"
        # each pool's VMs made and destroyed, and its run of failed creates (ended by a
        # create that went through: vmpool/state/pool_failures.py)
        f"local METRIC_VMS = {keys.metrics(VMS_METRIC)!r}\n"
        f"local POOL_FAILURES_PREFIX = {streak_key_prefix(keys)!r}\n" + lua_quota_keys(keys)
    )


def lua_quota_keys(keys: Keys) -> str:
    """The quotas', the line's and the request metrics' keys, as Lua (_quota.lua, _line.lua).

    Part of :func:`lua_metrics`; alone, the head of the line's read script
    (vmpool/state/quotas.py).
    """
    names = {
        "QUOTA_VMS": keys.quota_vms,
        "QUOTA_CORES": keys.quota_cores,
        "QUOTA_PEAK": keys.quota_peak,
        "QUOTA_PARKED": keys.quota_parked,
        "QUOTA_PARKED_LINE": keys.quota_parked_line,
        "QUOTA_PARKED_USERS": keys.quota_parked_users,
        "LINE_STATS": keys.line_stats,
        "CLONE_SLOTS": keys.clone_slots,
        "SLOT_HOLDERS": keys.clone_slot_holders,
        "SLOT_STATS": keys.clone_slot_stats,
        "SLOT_LINE": keys.clone_slot_line,
        "METRIC_REQUEST_READY_PREFIX": keys.request_ready_metric_prefix(),
        "METRIC_ETA_ERROR": keys.eta_error_metric,
        "METRIC_QUOTA_WAITS": keys.quota_waits_metric,
    }
    return "".join(f"local {name} = {value!r}\n" for name, value in names.items())


def cumulative_buckets(counts: Mapping[str, float]) -> tuple[list[tuple[str, float]], float]:
    """One pool's histogram hash as Prometheus wants it, and the sum.

    The hash's fields are numbers. Returns ``(le, count)`` pairs, each counting the
    observations at or below ``le``, ending with ``+Inf``. Then the sum of the
    observations.
    """
    out: list[tuple[str, float]] = []
    total = 0.0
    for bound in READY_BUCKETS:
        total += counts.get(bucket_field(bound), 0.0)
        out.append((bucket_field(bound), total))
    out.append((READY_OVERFLOW, total + counts.get(READY_OVERFLOW, 0.0)))
    return out, counts.get(READY_SUM, 0.0)


def record_job(redis_client: redis.Redis, keys: Keys, job: str, outcome: str) -> None:
    """Count one finished job (``outcome``: ok, failed, refused, ...), for /metrics."""
    redis_client.hincrby(keys.metrics(JOBS_METRIC), f"{job}:{outcome}", 1)


def record_error(redis_client: redis.Redis, keys: Keys, kind: str, pool: str) -> None:
    """Count one error of a pool (vmpooler's ``vmpooler_errors.<kind>.<pool>``)."""
    redis_client.hincrby(keys.metrics(ERRORS_METRIC), f"{kind}:{pool}", 1)


def vm_totals(raw: Mapping[str, str], pool: str) -> tuple[int, int]:
    """The pool's (created, destroyed) totals in the ``VMS_METRIC`` hash as read."""
    return int(raw.get(f"created:{pool}", 0)), int(raw.get(f"destroyed:{pool}", 0))


def record_skipped(
    redis_client: redis.Redis, keys: Keys, job: str, reason: str, count: int = 1
) -> None:
    """Count ``count`` subjects of ``job`` skipped by a batch for ``reason``.

    Say ``bad_subject``: a name its kind's validator refuses. A skipped item is then seen.
    """
    redis_client.hincrby(keys.metrics(SKIPPED_METRIC), f"{job}:{reason}", count)


def record_audit(redis_client: redis.Redis, keys: Keys, violations: int) -> float:
    """Record an audit run: its number of violations and when it ran. Returns that time.

    The time is Redis server time, so every replica's scrape agrees.
    """
    seconds, micros = redis_client.time()
    now = float(seconds) + float(micros) / 1e6
    redis_client.hset(keys.audit_result, mapping={"violations": int(violations), "time": repr(now)})
    return now

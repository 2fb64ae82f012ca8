"""Batch jobs: one RQ job runs the per-subject work of many subjects (issue 15).

A job that handles one VM pays RQ's whole price (dequeue, bookkeeping: tens of Redis
commands) for one VM. The dispatcher of a worker fleet (``workers.batching``) therefore
puts the subjects of ``provision_request``, ``create_vm`` and ``check_pending_vm`` into
the job's work set (:mod:`vmpool.state.workset`) and queues a batch job, which claims
them :data:`CLAIM_SIZE` at a time and runs the very same per-subject function for each
(:func:`vmpool.lifecycle.create_vm` etc., unchanged): each subject's change is still
its own checked transition under its own lock, the clone limit is still the
semaphore's, and a subject is still deduplicated (the set holds it once; its lock and
transitions refuse a second runner). A worker killed mid-batch loses nothing: its
claimed subjects stay in the set and are claimed again when the lease
(:func:`lease_s`) ends, and the periodic sweeps re-dispatch any work as before.

Each batch function loops until the set has nothing claimable, then returns the count
of each outcome.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from vmpool.lifecycle.fleet import Fleet
from vmpool.lifecycle.requests import provision_request
from vmpool.lifecycle.vms import check_pending_vm, create_vm
from vmpool.state.workset import WorkSet

__all__ = [
    "BATCHED",
    "CLAIM_SIZE",
    "check_pending_batch",
    "create_vm_batch",
    "lease_s",
    "provision_batch",
    "run_batch",
]

log = logging.getLogger(__name__)

# Subjects claimed per round trip; small enough that a slow provider call does not keep
# many subjects waiting behind it in one job while other workers idle.
CLAIM_SIZE = 20

# The per-subject job each batch job runs, by batch job name.
BATCHED: dict[str, str] = {
    "provision_batch": "provision_request",
    "create_vm_batch": "create_vm",
    "check_pending_batch": "check_pending_vm",
}


def lease_s(fleet: Fleet) -> float:
    """How long a claim is its job's alone: the lock expiry (so a dead worker's subjects
    come back about when its locks do). A claim outliving it lets a second job try the
    subject, which its lock and checked transitions make harmless."""
    return float(fleet.config.lock_expire_s)


def run_batch(fleet: Fleet, job: str, fn: Callable[[Fleet, str], object]) -> dict[str, int]:
    """Claim subjects of ``job``'s work set and run ``fn(fleet, subject)`` for each until
    none is claimable. An exception of one subject is logged and counted ('error'); the
    subject is done (the sweeps re-find real work), the others go on."""
    work = WorkSet(fleet.redis, fleet.keys)
    counts: Counter[str] = Counter()
    while True:
        claim = work.claim(job, CLAIM_SIZE, lease_s(fleet))
        if not claim.subjects:
            return dict(counts)
        for subject in claim.subjects:
            try:
                outcome = fn(fleet, subject)
            except Exception:
                log.exception("%s %s failed in a batch", job, subject)
                outcome = "error"
            counts[str(outcome if isinstance(outcome, str) else "done")] += 1
        work.done(job, claim, claim.subjects)


def provision_batch(fleet: Fleet) -> dict[str, int]:
    """provision_request for every request in its work set."""
    return run_batch(fleet, "provision_request", provision_request)


def create_vm_batch(fleet: Fleet) -> dict[str, int]:
    """create_vm for every reserved VM in its work set."""
    return run_batch(fleet, "create_vm", create_vm)


def check_pending_batch(fleet: Fleet) -> dict[str, int]:
    """check_pending_vm for every booting VM in its work set."""
    return run_batch(fleet, "check_pending_vm", check_pending_vm)

"""Work sets: the subjects waiting for a batch job, in their order of service.

There is one work set per kind of per-subject work (``keys.work_set(job)``: the jobs
``create_vm``, ``check_pending_vm`` and ``provision_request``).

A subject's way through:

- :meth:`WorkSet.add` puts subjects in. A subject already waiting or claimed keeps its
  place, so the set is the dedup.
- A batch job :meth:`claim` s up to N of them for a lease (one script) and runs each.
- It ends its claim on each. :meth:`done`: the work is over, out of the set.
  :meth:`release`: not run, back in line at once. :meth:`defer`: not run now (say its
  lock is held elsewhere), back in line after a delay. A deferred subject stays in the
  set meanwhile, so nothing re-adds it or loses it.
- :meth:`renew` extends the lease of a claim still at work. A claimer that dies leaves
  its subjects claimed. They are back in line, at their arrival, when the lease ends.

**Order of service** (docs/invariants.md, invariant 10, carried out by ``_workset.lua``):

- First come, first served, by arrival in server time. That is a request's
  ``created``, so neither its id nor a re-dispatch moves it.
- Round-robin across owners (a request's token user, while VMs have none). The owner served
  longest ago goes next, with its oldest waiting subject. One user's burst cannot
  starve another user's request.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from redis.commands.core import Script

from vmpool.ids import Job
from vmpool.state.durability import unconfirmed
from vmpool.state.keys import WORK_PARTS, Keys
from vmpool.state.lua import ScriptCall, read_script
from vmpool.state.records import text

__all__ = ["REQUEST_JOBS", "Claim", "WorkSet", "lua_workset"]

_PACKAGE = "vmpool.state.scripts"
# The jobs whose subjects are request ids (ordered by the request's arrival and owner).
REQUEST_JOBS: frozenset[Job] = frozenset({Job.PROVISION_REQUEST})


def lua_workset() -> str:
    """The work-set functions (_workset.lua) with the parts' suffixes rendered in.

    This is the head of every script that touches a work set.
    """
    parts = ", ".join(f"{name} = '{suffix}'" for name, suffix in WORK_PARTS.items())
    return f"local WORK_PARTS = {{{parts}}}\n" + read_script(_PACKAGE, "_workset.lua")


class Claim:
    """Subjects one batch job claimed (in the order of service), and the claim's id."""

    def __init__(self, claim_id: str, subjects: list[str]) -> None:
        self.id = claim_id
        self.subjects = subjects


class WorkSet:
    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.keys = keys
        head = lua_workset()
        self._add = redis_client.register_script(head + read_script(_PACKAGE, "work_add.lua"))
        self._claim = redis_client.register_script(head + read_script(_PACKAGE, "work_claim.lua"))
        self._done = redis_client.register_script(head + read_script(_PACKAGE, "work_done.lua"))

    @property
    def scripts(self) -> list[Script]:
        """The work set's scripts (for :func:`~vmpool.state.lua.load_missing`)."""
        return [self._add, self._claim, self._done]

    def record_key_parts(self, job: Job) -> tuple[str, str]:
        """The parts of a request's key around its id, for a job on requests.

        The add scripts read a subject's arrival and owner with them. ``('', '')`` for other
        jobs.
        """
        return self.keys.request_key_parts() if job in REQUEST_JOBS else ("", "")

    def add(self, job: Job, subjects: Sequence[str], *, client: Any = None) -> int:
        """Put ``subjects`` in ``job``'s work set. One already in keeps its place.

        ``client``: a pipeline to add to (returns 0). Without it, one round trip, returning how
        many were added.
        """
        if not subjects:
            return 0
        call = self.add_call(job, subjects)
        reply = call.script(keys=call.keys, args=call.args, client=client)
        return 0 if client is not None else int(reply)

    def add_call(self, job: Job, subjects: Sequence[str]) -> ScriptCall:
        """The call of :meth:`add`, to run with others (its reply: how many were added)."""
        head, tail = self.record_key_parts(job)
        return ScriptCall(self._add, [self.keys.work_set(job)], [head, tail, *subjects])

    def claim(self, job: Job, n: int, lease_s: float) -> Claim:
        """Claim up to ``n`` subjects of ``job``'s set in the order of service, for ``lease_s``.

        Not a write its unit of work waits for (:func:`~vmpool.state.durability.unconfirmed`),
        as a worker's dequeue is not: a claim a failover loses runs its subjects again
        (each step is idempotent), and the writes a claim leads to are confirmed after
        it, which confirms it too (a replica holds a stream in order). So a batch job that
        finds nothing to claim waits for no replica."""
        claim_id, call = self.claim_call(job, n, lease_s)
        with unconfirmed():
            return self.claimed(claim_id, call.run())

    def claim_call(self, job: Job, n: int, lease_s: float) -> tuple[str, ScriptCall]:
        """The call of :meth:`claim` with its fresh claim id, to run with others (its reply
        goes to :meth:`claimed`)."""
        claim_id = os.urandom(8).hex()
        args = [n, repr(float(lease_s)), claim_id]
        return claim_id, ScriptCall(self._claim, [self.keys.work_set(job)], args)

    @staticmethod
    def claimed(claim_id: str, reply: Any) -> Claim:
        """The claim :meth:`claim_call`'s ``reply`` made."""
        if isinstance(reply, Exception):
            raise reply
        return Claim(claim_id, [text(s) for s in reply])

    def done(self, job: Job, claim: Claim, subjects: Sequence[str]) -> int:
        """Remove finished ``subjects`` of ``claim`` (those still claimed by it)."""
        return self._end(job, claim, "done", subjects)

    def release(self, job: Job, claim: Claim, subjects: Sequence[str]) -> int:
        """Put unprocessed ``subjects`` of ``claim`` back in line at once."""
        return self._end(job, claim, "release", subjects)

    def defer(self, job: Job, claim: Claim, subjects: Sequence[str], delay_s: float) -> int:
        """Put ``subjects`` of ``claim`` back in line after ``delay_s``.

        Meanwhile no claim holds them, and they stay in the set: a dispatch does not add them
        again.
        """
        return self._end(job, claim, "defer", subjects, delay_s)

    def renew(self, job: Job, claim: Claim, subjects: Sequence[str], lease_s: float) -> int:
        """Extend the lease of ``subjects`` still claimed by ``claim`` to ``lease_s`` from now.

        A claim still at work keeps them.
        """
        return self._end(job, claim, "renew", subjects, lease_s)

    def _end(
        self, job: Job, claim: Claim, mode: str, subjects: Sequence[str], secs: float = 0.0
    ) -> int:
        call = self.end_call(job, claim, mode, subjects, secs)
        return 0 if call is None else int(call.run())

    def end_call(
        self, job: Job, claim: Claim, mode: str, subjects: Sequence[str], secs: float = 0.0
    ) -> ScriptCall | None:
        """The call that ends ``subjects`` of ``claim`` (``mode``: 'done', 'release',
        'defer' or 'renew', as the methods of those names), to run with others. None
        when there are none."""
        if not subjects:
            return None
        keys = [self.keys.work_set(job)]
        return ScriptCall(self._done, keys, [claim.id, mode, repr(float(secs)), *subjects])

    def end_calls(
        self,
        job: Job,
        claim: Claim,
        done: Sequence[str],
        deferred: Sequence[str],
        released: Sequence[str],
        delay_s: float,
    ) -> list[ScriptCall]:
        """The calls that end a claim: ``done`` out of the set, ``deferred`` back in line
        after ``delay_s``, ``released`` back in line at once (those not empty)."""
        calls = [
            self.end_call(job, claim, "done", done),
            self.end_call(job, claim, "defer", deferred, delay_s),
            self.end_call(job, claim, "release", released),
        ]
        return [call for call in calls if call is not None]

    def size(self, job: Job) -> int:
        """Subjects in the set: waiting, claimed or deferred."""
        return int(self.redis.zcard(self.keys.work_set(job)))

    def lapsed(self, jobs: Iterable[Job], now: float, limit: int = 100) -> dict[Job, list[str]]:
        """Per job, up to ``limit`` subjects whose claim or deferral ended by ``now``.

        ``now`` is server time. These subjects go back in line at the next claim, so a batch
        job should be queued: a claimer died, or a subject was deferred. One round trip for
        all jobs.
        """
        jobs = list(jobs)
        pipe = self.redis.pipeline(transaction=False)
        for job in jobs:
            key = self.keys.work_part(job, "claims")
            pipe.zrangebyscore(key, "-inf", f"{now:.6f}", start=0, num=limit)
        return {
            job: [text(s) for s in found]
            for job, found in zip(jobs, pipe.execute(), strict=True)
            if found
        }

    def clear(self, job: Job) -> None:
        """Drop ``job``'s work set with all its parts (benchmarks, tests)."""
        owners = [text(o) for o in self.redis.zrange(self.keys.work_part(job, "turns"), 0, -1)]
        owners += [text(o) for o in self.redis.hvals(self.keys.work_part(job, "owner"))]
        queues = {self.keys.work_queue(job, o) for o in [*owners, ""]}
        parts = [self.keys.work_part(job, p) for p in WORK_PARTS if p != "queue"]
        self.redis.delete(self.keys.work_set(job), *parts, *queues)

"""Work sets: the subjects waiting for a batch job (issue 15, "pay RQ's price per batch").

One sorted set per kind of per-subject work (``keys.work_set(job)``: ``create_vm``,
``check_pending_vm``, ``provision_request``), subject -> the server time from which it
may be claimed. :meth:`WorkSet.add` puts subjects in (``ZADD NX``: a subject already
waiting or claimed keeps its place, so the set is the dedup, O(1) per subject);
a batch job :meth:`claim` s up to N of them for a lease (one script), runs each, and
:meth:`done` removes them (one script, only if still its claim). A claimer that dies
leaves its subjects in the set; they are claimed again when the lease ends. A lease
that runs out while its claimer still works only lets a second batch job try the same
subject, which the subject's lock and checked transitions make harmless ('busy', or a
refusal such as 'vm_pending').
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.records import text

__all__ = ["Claim", "WorkSet"]

_CLAIM_LUA = read_script("vmpool.state.scripts", "work_claim.lua")
_DONE_LUA = read_script("vmpool.state.scripts", "work_done.lua")


class Claim:
    """Subjects one batch job claimed, and the score that marks them as its own."""

    def __init__(self, score: str, subjects: list[str]) -> None:
        self.score = score
        self.subjects = subjects


class WorkSet:
    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.keys = keys
        self._claim = redis_client.register_script(_CLAIM_LUA)
        self._done = redis_client.register_script(_DONE_LUA)

    def add(self, job: str, subjects: Sequence[str], *, client: Any = None) -> None:
        """Put ``subjects`` in ``job``'s work set, claimable now (a subject already in
        keeps its score). ``client``: a pipeline to add to, else one round trip."""
        if subjects:
            conn = client or self.redis
            conn.zadd(self.keys.work_set(job), dict.fromkeys(subjects, 0), nx=True)

    def claim(self, job: str, n: int, lease_s: float) -> Claim:
        reply: list[Any] = self._claim(keys=[self.keys.work_set(job)], args=[n, lease_s])
        return Claim(text(reply[0]), [text(s) for s in reply[1:]])

    def done(self, job: str, claim: Claim, subjects: Sequence[str]) -> int:
        """Remove finished ``subjects`` of ``claim`` (those still claimed by it)."""
        return self._end(job, claim, "done", subjects)

    def release(self, job: str, claim: Claim, subjects: Sequence[str]) -> int:
        """Make unprocessed ``subjects`` of ``claim`` claimable again at once."""
        return self._end(job, claim, "release", subjects)

    def _end(self, job: str, claim: Claim, mode: str, subjects: Sequence[str]) -> int:
        if not subjects:
            return 0
        keys = [self.keys.work_set(job)]
        return int(self._done(keys=keys, args=[claim.score, mode, *subjects]))

    def size(self, job: str) -> int:
        return int(self.redis.zcard(self.keys.work_set(job)))

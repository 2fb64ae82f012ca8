"""The fleet's word on each batch stage's pace, shared by its workers.

A worker runs a stage's follow-ups in line only once that stage has been quick in its
own claims (:class:`vmpool.lifecycle.pace.StagePace`). A worker that has run no claim
of a stage yet would queue its follow-ups and keep its first claim small, although the
fleet's other workers have found it quick: the stage's pace is the provider's, the
same for every worker. The board is where they say so: one hash, ``Keys.stage_pace``,
job name -> ``1`` (quick) or ``0`` (slow), written by a worker when its own verdict on a
stage changes, read by a worker with no verdict of its own yet.

Advice, not state: a lost or stale word costs a queued job or a small first claim,
never a transition, so its writes are not confirmed (a unit of work does not wait for
a replica to hold them) and a Redis error on the board is the same as an empty board.
"""

from __future__ import annotations

import logging

import redis

from vmpool.state.durability import unconfirmed
from vmpool.state.keys import Keys
from vmpool.state.records import text

__all__ = ["PaceBoard"]

log = logging.getLogger(__name__)


class PaceBoard:
    """Each stage's last verdict (quick or slow) as the fleet's workers posted it."""

    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.key = keys.stage_pace

    def read(self) -> dict[str, bool]:
        """Every stage's verdict, by job name ({} when Redis does not answer)."""
        try:
            raw = self.redis.hgetall(self.key)
        except redis.RedisError as exc:
            log.debug("stage pace not read: %s", exc)
            return {}
        return {text(job): text(word) == "1" for job, word in raw.items()}

    def post(self, job: str, quick: bool) -> bool:
        """Say ``job``'s stage is quick (or not); False when Redis did not take it."""
        try:
            with unconfirmed():
                self.redis.hset(self.key, job, "1" if quick else "0")
        except redis.RedisError as exc:
            log.debug("stage pace not posted: %s", exc)
            return False
        return True

"""Reads of the per-pool state indexes: which VMs of a pool are in a state, and how many.

Each pool keeps one sorted set per indexed state (``Keys.pool_state``), its members the
VM names and its scores the entry time (the lifetime's end for running VMs). The
sweeps, the API's pool counts and the CLI read them through these methods, which the
:class:`~vmpool.state.store.Store` carries; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.records import texts

__all__ = ["PoolIndexReads"]


class PoolIndexReads:
    """The pool index reads of a store with ``redis`` and ``keys``."""

    redis: redis.Redis
    keys: Keys

    def pool_vms(
        self,
        pool: str,
        state: str,
        *,
        max_score: float | None = None,
        limit: int | None = None,
    ) -> list[str]:
        """VM names of a pool in a state (:meth:`pools_vms` for one pool)."""
        return self.pools_vms([pool], state, max_score=max_score, limit=limit)[pool]

    def pools_vms_aged(
        self, state: str, ages: Mapping[str, Sequence[float]], now: float
    ) -> dict[str, tuple[list[str], list[int]]]:
        """Every VM of each pool of ``ages`` in ``state``, oldest first, in one round trip.

        And per pool, for each of its ``ages`` (seconds), how many of those names have
        been in the state at least that long at server time ``now``: a prefix of them,
        the index being in score order (scores: :meth:`pools_vms`). One transaction, so
        the counts are of the names read. What the pending sweep reads: names and counts,
        no score or record, so that a VM costs it one string of a list.
        """
        counted = any(ages.values())
        pipe = self.redis.pipeline(transaction=counted)
        for pool, pool_ages in ages.items():
            key = self.keys.pool_state(pool, state)
            pipe.zrange(key, 0, -1)
            for age in pool_ages:
                pipe.zcount(key, "-inf", now - age)
        replies = iter(pipe.execute() if ages else ())
        out: dict[str, tuple[list[str], list[int]]] = {}
        for pool, pool_ages in ages.items():
            names = texts(next(replies))
            out[pool] = (names, [int(next(replies)) for _ in pool_ages])
        return out

    def pool_counts(self, pools: Iterable[str]) -> dict[str, dict[str, int]]:
        pools = list(pools)
        states = INDEXED_VM_STATES
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            for state in states:
                pipe.zcard(self.keys.pool_state(pool, state))
        counts = iter(pipe.execute())
        return {pool: {state: int(next(counts)) for state in states} for pool in pools}

    def pools_vms(
        self,
        pools: Iterable[str],
        state: str,
        *,
        max_score: float | None = None,
        limit: int | None = None,
    ) -> dict[str, list[str]]:
        """VM names of pools in a state, in one round trip: pool -> names in score order.

        Scores: the entry time for reserved, pending and completed VMs. For running ones,
        the lifetime's end (so ``max_score=now`` finds the expired). ``limit``: at most
        that many per pool. The sweeps read through this (a non-transactional pipeline).
        """
        pools = list(dict.fromkeys(pools))
        hi: float | str = "+inf" if max_score is None else max_score
        start, num = (None, None) if limit is None else (0, limit)
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            key = self.keys.pool_state(pool, state)
            pipe.zrangebyscore(key, "-inf", hi, start=start, num=num)
        replies = pipe.execute() if pools else []
        return {pool: texts(names) for pool, names in zip(pools, replies, strict=True)}

"""The end of a batch claim: its follow-ups dispatched, its locks and subjects let go.

A claim's subjects send follow-up work (the create of a reserved VM, the check of a
created one) while the claim runs. :class:`DeferredDispatch` holds it and sends it once,
at the claim's end, one send per job: a dispatch costs a script of lane checks
(``workers.batching.BatchDispatcher.probe``), which done per subject would be most of a
subject's Redis commands.

The end keeps an order that a worker killed at any point of it cannot break:

1. the claim's locks are released, so that a follow-up's runner is not refused them;
2. the follow-ups are dispatched;
3. the claim's subjects are ended in their work set (done, deferred or let go).

A worker killed before 3 leaves its subjects claimed: they are run again once the lease
ends (each step is idempotent), so a follow-up is never lost with them. The three go to
Redis in one round trip when every follow-up stays in the batch job (only added to its
work set, :class:`InLine`): a pipeline's calls run in the order sent, each its own
script, and one cut short by a dropped connection ran a prefix, as calls sent one by one
would have. A follow-up sent to the queues (a dispatcher's own round trips) splits it
in two: 1 with the in-line adds, then the sends, then 3.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import redis

from vmpool.ids import Job
from vmpool.lifecycle.chain import AheadRound
from vmpool.lifecycle.claims import ClaimKeeper
from vmpool.lifecycle.fleet import Dispatcher
from vmpool.lifecycle.outcomes import BatchCount
from vmpool.state.lock_renewer import LockRenewer
from vmpool.state.locks import FencedLock, LockRelease, releasing
from vmpool.state.lua import ScriptCall, run_pipelined
from vmpool.state.workset import WorkSet

__all__ = ["DeferredDispatch", "InLine", "end_claim"]


class InLine(Protocol):
    """The stages a batch job runs itself (:class:`~vmpool.lifecycle.chain.Chain`)."""

    def takes(self, job: Job) -> bool:
        """Whether a follow-up to ``job`` stays in this batch job."""

    def add_call(self, job: Job, subjects: list[str]) -> ScriptCall:
        """The call that adds ``subjects`` to ``job``'s work set, no job queued."""

    def ahead(self, here: Mapping[Job, Sequence[str]]) -> AheadRound:
        """What the end of a claim runs for the stages next in line (``here``: each
        stage's follow-ups): the next claims, and grants of locks (with reads) for them."""


class DeferredDispatch:
    """A Dispatcher that holds one claim's follow-ups and sends them at its end.

    It holds what the subjects of one claim send and hands it on at :meth:`end`: one
    send per job, each subject once, in the order first asked. With ``in_line`` (a batch
    job's stages), the follow-ups to a stage it takes are only added to their work set,
    and kept in :attr:`here` for the job to run."""

    def __init__(self, inner: Dispatcher, in_line: InLine | None = None) -> None:
        self.inner = inner
        self._in_line = in_line
        self._held: dict[Job, dict[str, None]] = {}
        self.here: dict[Job, list[str]] = {}

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        self._held.setdefault(job, {}).update(dict.fromkeys(subjects))

    def end(
        self,
        client: redis.Redis,
        release: LockRelease | None = None,
        ends: Sequence[ScriptCall] = (),
    ) -> None:
        """End a claim: ``release`` its locks, dispatch what is held, run ``ends``.

        In that order (the module's docstring), in one round trip when nothing held goes
        to the queues. ``ends``: the calls that end the claim's subjects in their work
        set (none when the claim is left by an exception: its lease brings them back).
        Then, in the same round trip, the next claim of each stage the follow-ups went
        to in line, and the grant of their locks for a stage that takes them ahead
        (:meth:`InLine.ahead`; not for a claim left by an exception): the stage runs
        right after, and neither its claim nor its grant costs a round trip of its own.
        The first error reply is raised once every call has run."""
        held, self._held = self._held, {}
        first: list[ScriptCall] = [] if release is None else [release.call]
        sends: list[tuple[Job, list[str]]] = []
        for job, subjects in held.items():
            names = list(subjects)
            if self._in_line is not None and self._in_line.takes(job):
                first.append(self._in_line.add_call(job, names))
                self.here.setdefault(job, []).extend(names)
            else:
                sends.append((job, names))
        ahead = None if self._in_line is None or not ends else self._in_line.ahead(self.here)
        last = [*ends, *(ahead.calls if ahead is not None else [])]
        reads = ahead.reads if ahead is not None else None
        replies: list[Any]
        if sends:
            replies = run_pipelined(client, first)
            for job, names in sends:
                self.inner.send(job, names)
            replies += run_pipelined(client, last, reads=reads)
        else:
            replies = run_pipelined(client, [*first, *last], reads=reads)
        read_replies = replies[len(first) + len(last) :]
        replies = replies[: len(first) + len(last)]
        if ahead is not None and ahead.calls:
            ahead.keep(replies[len(replies) - len(ahead.calls) :], read_replies)
        if release is not None:
            release.check(replies[0])
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply


def end_claim(
    dispatch: DeferredDispatch,
    work: WorkSet,
    renewer: LockRenewer,
    keeper: ClaimKeeper | None,
    held: dict[str, FencedLock],
    ends: list[ScriptCall],
    counts: Counter[str],
) -> None:
    """End a batch claim: stop keeping it (``renewer``: the one it was given to), then
    release the locks its keeper did not let go, dispatch its follow-ups and run
    ``ends`` (:meth:`DeferredDispatch.end`)."""
    released: set[str] = set()
    if keeper is not None:
        keeper.close()
        renewer.remove(keeper)
        released = set(keeper.let_go)
        if released:
            counts[BatchCount.RELEASED] += len(released)
    release = releasing([lock for s, lock in held.items() if s not in released])
    dispatch.end(work.redis, release, ends)

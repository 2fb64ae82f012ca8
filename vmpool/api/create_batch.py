"""POST /ondemandvm's creates, sent together: one round trip for a turn of the event loop.

Each create is its own atomic script call (create_request.lua: the record, its queue
entries and its place in the provision work set). The creates that handlers ask for in
one turn of the loop go to Redis in one pipeline, followed by one lane check for all of
them (``BatchDispatcher.provision_after_create``: a lane job claims the whole work set,
so one check after the batch's creates starts the provisioning of every one). The
pipeline adds no atomicity across the creates and takes none away: each reply is its
call's, an error in its place. A POST alone is a batch of one.

Under load a round trip's client cost (a pooled connection, a send, the event loop's
wake-up for the replies) and the lane check were the largest part of a POST's Python
past what a /healthz costs (profiled: docs/benchmarks.md); batched, they are paid once
per turn, and Redis runs one lane check for the turn's creates.

The batch is sent in a context of its own (no POST's unit of work,
:mod:`vmpool.state.durability`): the pipeline confirms the creates in its round trip. The
lanes the check found free are queued in a unit of work of their own (a task, the RQ
enqueue in the thread pool), whose end confirms them, before any POST of the batch is
answered. A batch that fails (Redis gone, a confirmation refused) fails each of its
POSTs with that error: each answers its 503 naming its own request id. A POST that stops
waiting (its client gone) leaves the batch running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from vmpool.api.turn_batch import TurnBatches
from vmpool.lifecycle.failpoints import failpoint
from vmpool.state.direct_pipeline import DirectPipeline, Replied
from vmpool.state.durability import confirmed_async
from vmpool.state.lua import ScriptCall, ScriptPipeline
from vmpool.state.records import Outcome
from workers.batching import BatchDispatcher, LaneFollowUp

__all__ = ["CreateBatches"]

log = logging.getLogger(__name__)


class CreateBatches(TurnBatches):
    """The creates waiting for this turn's pipeline, one batch per event loop.

    ``pipeline``: the loop's pipeline (``LoopClients.pipeline``). ``on_enqueue_failure``:
    called when queueing the lanes found free failed (the API's counter).
    """

    def __init__(
        self,
        pipeline: Callable[[], DirectPipeline],
        batch: BatchDispatcher,
        on_enqueue_failure: Callable[[], None],
    ) -> None:
        super().__init__(pipeline)
        self.batch = batch
        self.on_enqueue_failure = on_enqueue_failure

    def _send_batch(self, calls: Sequence[ScriptCall], settle: Replied) -> None:
        """The creates, then the lane check, in one round trip; the lanes found free
        queued (a unit of work of its own) before any create is answered."""
        pipe = ScriptPipeline()
        for call in calls:
            pipe.add(call)
        follow_up = self.batch.provision_after_create(pipe)
        pipeline = self.pipeline()
        count = len(calls)

        def replied(result: list[Any] | Exception) -> None:
            if isinstance(result, Exception):
                settle(result)
            elif any(_created(reply) for reply in result[:count]) and follow_up.wanted(result):
                pipeline.start(self._queue_then_settle(pipeline, follow_up, result, count, settle))
            else:
                settle(result[:count])

        pipeline.run(pipe.calls, replied)

    async def _queue_then_settle(
        self,
        pipeline: DirectPipeline,
        follow_up: LaneFollowUp,
        replies: list[Any],
        count: int,
        settle: Replied,
    ) -> None:
        """Queue the lanes (RQ: in the thread pool), confirm that, then answer the creates."""
        try:
            async with confirmed_async(pipeline.client):
                await run_in_threadpool(self._queue_lanes, follow_up, replies, count)
        except Exception as exc:
            settle(exc)
            return
        settle(replies[:count])

    def _queue_lanes(self, follow_up: LaneFollowUp, replies: Sequence[Any], count: int) -> None:
        """Queue the lanes the check found free. A failure is counted and logged, not raised:
        the requests exist, in the provision work set, and the provision sweep finds them."""
        try:
            failpoint("api.queue_lanes")  # tests: the queueing fails after the creates
            follow_up.queue(replies)
        except Exception as exc:
            self.on_enqueue_failure()
            log.warning(
                "%d request(s) created: enqueue of their provisioning failed (%s);"
                " the sweep will pick them up",
                count,
                type(exc).__name__,
            )


def _created(reply: Any) -> bool:
    return not isinstance(reply, Exception) and Outcome.from_reply(reply).ok

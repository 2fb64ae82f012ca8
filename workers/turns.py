"""Queue turns: the order a worker tries its queues in, job after job (fair queues).

A worker listens to the sweeps, the requests and the VMs (:data:`workers.table.QUEUES`).
The sweeps go first whenever one waits (workers/queues.py says why; at most a handful
are ever queued). The requests and the VMs take weighted turns
(:data:`workers.table.QUEUE_WEIGHTS`): a queue is served its weight of jobs in a row,
then the next one is tried first. Under strict priority a backlog of request jobs (a
provision flood, a provision batch queueing its continuation) held every VM create back
until it drained. With turns, a job at the head of its queue waits at most the other
queues' weights of jobs, whatever their backlogs.

Only the order of the next pop changes: the pop itself is still ``pop_job.lua`` over
every queue (the first non-empty one in this order), so a job still leaves its queue
only with its heartbeat, and an idle worker still blocks on the wake-up lists
(workers/dequeue.py). A queue found empty banks no turns: the queue served moves to the
head, so a queue that was empty a long time does not then starve the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rq import Queue

from workers.dequeue import StampingQueue
from workers.rqcompat import WorkerHooks
from workers.table import QUEUE_WEIGHTS

__all__ = ["FairDequeue", "QueueTurns", "queue_weight"]


def queue_weight(queue_name: str) -> int | None:
    """The weight of queue ``queue_name`` (``<prefix>-<short>``); None: it takes no turns.

    The short name ends the queue name and holds no ``-`` (:meth:`Keys.queue`).
    """
    return QUEUE_WEIGHTS.get(queue_name.rsplit("-", 1)[-1])


class QueueTurns:
    """The order of a worker's next pop over ``names``, told each queue it served.

    The queues without a weight keep their listening order, first; the weighted ones
    follow, in turn order.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self._first = [name for name in names if queue_weight(name) is None]
        self._turns = [name for name in names if queue_weight(name) is not None]
        self._streak = 0  # jobs served in a row from the head queue

    def order(self) -> list[str]:
        """The queue names, in the order the next pop tries them."""
        return [*self._first, *self._turns]

    def served(self, name: str) -> None:
        """A job was popped from queue ``name``."""
        if name not in self._turns:
            return
        if name != self._turns[0]:  # the queues before it were empty: no turns banked
            self._rotate(self._turns.index(name))
        self._streak += 1
        if self._streak >= (queue_weight(name) or 1):
            self._rotate(1)

    def _rotate(self, head: int) -> None:
        self._turns = self._turns[head:] + self._turns[:head]
        self._streak = 0


class FairDequeue(WorkerHooks):
    """An RQ worker mix-in: vmpool's dequeue, in turns.

    Each pop stamps its job (:class:`workers.dequeue.StampingQueue`), and after each pop
    :class:`QueueTurns` orders the next one, in place of RQ's ``reorder_queues`` (its
    dequeue strategies): RQ calls it with the queue each job came from. For a worker
    class (``class W(FairDequeue, SteadyLoop, SimpleWorker)``).
    """

    queue_class = StampingQueue  # pops and stamps the heartbeat in one unit

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._turn_order = QueueTurns([queue.name for queue in self.queues])
        self._put_in_order()

    def reorder_queues(self, reference_queue: Queue) -> None:
        self._turn_order.served(reference_queue.name)
        self._put_in_order()

    def _put_in_order(self) -> None:
        by_name = {queue.name: queue for queue in self.queues}
        self.pop_order = [by_name[name] for name in self._turn_order.order()]

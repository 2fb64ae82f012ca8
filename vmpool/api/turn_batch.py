"""Script calls that handlers ask for in one turn of the event loop, sent in one round trip.

Under load, a round trip's client cost (a pooled connection, a send, the event loop's
wake-up for the replies) is most of what a hot route's Redis work costs the API's CPU
past what a /healthz costs (profiled: docs/benchmarks.md). :class:`TurnBatches` gathers
the calls of a turn and sends them together, on the loop's
:class:`~vmpool.state.direct_pipeline.DirectPipeline` (no task, no pooled connection, on
the plain path), so that cost is paid once per turn. Each
call is still its own atomic script: the round trip adds no atomicity across them and
takes none away. Each caller gets its own call's reply (an error in its place); an error
of the whole round trip (Redis gone, a confirmation refused) is raised to each caller. A
caller that stops waiting (its client gone) leaves the batch running.

A turn's calls past :data:`BATCH_MOST` start another batch, sent in the same turn. One
round trip for a whole turn makes the API and Redis take turns: the loop parses and
plans every POST of the turn while Redis sits idle, then idles itself while Redis runs
every script. Split, the replies of the first part come back while Redis runs the
next, and the loop answers them (and reads the requests their clients send next)
meanwhile (measured: docs/benchmarks.md, "API").

While :data:`MOST_IN_FLIGHT` batches of the loop are out, the calls a turn asks for wait
for the next reply and go together then: under load the requests of a few clients
come in a turn or two apart, and a round trip for each such turn cost the loop more
than their wait (measured: docs/benchmarks.md, "API"). A full batch goes at once. When
nothing is out, a turn's calls go at its end: a quiet API waits for nothing.

The batch is sent in a context of its own, so its round trip is not part of any caller's
unit of work (:mod:`vmpool.state.durability`): it confirms what it wrote or read in that
same round trip. :class:`ReadBatches` is GET /ondemandvm/<id>'s;
:class:`vmpool.api.create_batch.CreateBatches` is POST /ondemandvm's.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from vmpool.state.confirmation import current_scope
from vmpool.state.direct_pipeline import DirectPipeline, Replied
from vmpool.state.lua import ScriptCall

__all__ = ["BATCH_MOST", "MOST_IN_FLIGHT", "ReadBatches", "TurnBatches"]

# The most calls in one round trip (bench/api_rps.py at 16 connections: 6 and 8 alike;
# 12 overlaps little more than one batch a turn; 2 and 4 cost more round trips than they
# overlap).
BATCH_MOST = 8
# With this many batches of a loop out, a turn's calls wait for a reply (two APIs side by
# side at 16 connections: one and two out both better than no wait; docs/benchmarks.md).
MOST_IN_FLIGHT = 1

_Waiting = list[tuple[ScriptCall, "asyncio.Future[Any]"]]


class _Line:
    """One loop's calls waiting for a round trip, and its batches out.

    ``due``: a send at the turn's end is scheduled. ``held``: the turn ended with
    :data:`MOST_IN_FLIGHT` batches out; the next reply sends what waits."""

    __slots__ = ("due", "held", "out", "waiting")

    def __init__(self) -> None:
        self.waiting: _Waiting = []
        self.out = 0
        self.due = False
        self.held = False


class TurnBatches:
    """The calls waiting for their round trip, one line per event loop.

    ``pipeline``: the loop's pipeline (``LoopClients.pipeline``), which sends a batch and
    hands it its replies. A subclass may say how a batch is sent (:meth:`_send_batch`).
    """

    def __init__(self, pipeline: Callable[[], DirectPipeline]) -> None:
        self.pipeline = pipeline
        self._lines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Line] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # a test client may run loops in several threads

    async def submit(self, call: ScriptCall) -> Any:
        """The reply of ``call``, run in this turn's batch (or the next reply's).

        Raises the batch's error (Redis, or the confirmation refused); a call's own
        error is returned in its place, as ``run_pipelined_async`` returns it.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        full: _Waiting | None = None
        with self._lock:
            line = self._lines.get(loop)
            if line is None:
                line = self._lines[loop] = _Line()
            if not (line.due or line.held):
                line.due = True
                loop.call_soon(self._turn_ended, line)
            line.waiting.append((call, done))
            if len(line.waiting) >= BATCH_MOST:
                full = self._take(line)  # the next calls: a new batch
        if full is not None:
            self._start(line, full)
        reply = await done
        # The batch's confirmation came after the caller's unit's writes so far (a
        # token's use): it covers them, and the unit's end has nothing left to wait for.
        scope = current_scope()
        if scope is not None and scope.settles and scope.pending:
            scope.covered()
        return reply

    def _turn_ended(self, line: _Line) -> None:
        """Send what the turn asked for, unless a reply is due to send it."""
        with self._lock:
            line.due = False
            if line.out >= MOST_IN_FLIGHT and line.waiting:
                line.held = True
                return
            waiting = self._take(line)
        if waiting:
            self._start(line, waiting)

    def _replied(self, line: _Line) -> None:
        """A batch of ``line`` is answered: send what waited for it, if anything."""
        with self._lock:
            line.out -= 1
            waiting = self._take(line) if line.held else []
            line.held = False
        if waiting:
            self._start(line, waiting)

    @staticmethod
    def _take(line: _Line) -> _Waiting:
        """The calls waiting in ``line`` (counted out: the caller sends them)."""
        waiting, line.waiting = line.waiting, []
        if waiting:
            line.out += 1
        return waiting

    def _start(self, line: _Line, waiting: _Waiting) -> None:
        """Send ``waiting``'s calls; each caller gets its reply, or the batch's error."""

        answered = False

        def settle(result: list[Any] | Exception) -> None:
            nonlocal answered
            if not answered:  # settle is handed an error again if it fails (bug)
                answered = True
                self._replied(line)
            if isinstance(result, Exception):
                for _, done in waiting:
                    if not done.done():
                        done.set_exception(result)
                return
            for (_, done), reply in zip(waiting, result, strict=True):
                if not done.done():
                    done.set_result(reply)

        self._send_batch([call for call, _ in waiting], settle)

    def _send_batch(self, calls: Sequence[ScriptCall], settle: Replied) -> None:
        """Send ``calls`` in one round trip; ``settle`` gets their replies (errors in
        place) or the batch's error."""
        self.pipeline().run(calls, settle)


class ReadBatches(TurnBatches):
    """Read scripts of a turn (GET /ondemandvm/<id>'s ``request_place.lua``): one round
    trip, which confirms what Redis holds, so all they read."""

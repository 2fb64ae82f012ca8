"""While a batch of the loop is out, the calls of later turns wait for its reply and go
together then (vmpool/api/turn_batch.py).

Each test runs :class:`TurnBatches` on a real :class:`DirectPipeline` against a Redis
server of its own, which holds the first batch out (CLIENT PAUSE WRITE: its scripts wait,
unrun) while the test asks for more calls in later turns of the loop. A turn is one pass
of the event loop (``await asyncio.sleep(0)``): nothing here waits on a clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis

from vmpool.api.turn_batch import BATCH_MOST, TurnBatches
from vmpool.state.confirmation import WriteNotConfirmed
from vmpool.state.connection import connect_async
from vmpool.state.direct_pipeline import DirectPipeline, Replied
from vmpool.state.lua import ScriptCall

from pipelinehelp import APPEND, calls, options

KEY = "turns"


class CountedBatches(TurnBatches):
    """TurnBatches that keep the size of each batch they send (and send it)."""

    def __init__(self, pipeline: Callable[[], DirectPipeline]) -> None:
        super().__init__(pipeline)
        self.sizes: list[int] = []

    def _send_batch(self, batch_calls: Sequence[ScriptCall], settle: Replied) -> None:
        self.sizes.append(len(batch_calls))
        super()._send_batch(batch_calls, settle)


async def turns(count: int = 3) -> None:
    """Let the loop run ``count`` passes: the tasks started so far ask for their calls,
    and their turn's end sends what it sends."""
    for _ in range(count):
        await asyncio.sleep(0)


def asked(batches: TurnBatches, batch_calls: Sequence[ScriptCall]) -> list[asyncio.Task[Any]]:
    return [asyncio.ensure_future(batches.submit(call)) for call in batch_calls]


def run_held(
    url: str,
    conn: redis.Redis,
    body: Callable[[CountedBatches], Awaitable[None]],
    replicas: int = 0,
) -> None:
    """``body`` with Redis paused for writes (released when it returns)."""

    async def main() -> None:
        client = connect_async(url, options(replicas=replicas), decode_responses=True)
        pipeline = DirectPipeline(client)
        await pipeline.connect()
        conn.script_load(APPEND)  # no NOSCRIPT round trip in the batches
        conn.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            await body(CountedBatches(lambda: pipeline))
        finally:
            conn.execute_command("CLIENT", "UNPAUSE")
            pipeline.close()
            await client.aclose()

    asyncio.run(main())


def test_the_calls_of_later_turns_wait_for_the_batch_out_and_go_together(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: with a batch of three out, the three calls of a later turn and the two of
    a turn after it are not sent (one round trip each, without the wait); when the first
    batch's reply comes, the five go in one batch. Each call gets its own reply, in the
    order asked (RPUSH then LLEN on one list: 1 to 8), each run once."""
    url, conn = own_redis
    values = [f"v{i}" for i in range(8)]
    answers: list[Any] = []

    async def body(batches: CountedBatches) -> None:
        first = asked(batches, calls(conn, KEY, values[:3]))
        await turns()
        assert batches.sizes == [3]
        later = asked(batches, calls(conn, KEY, values[3:6]))
        await turns()
        later += asked(batches, calls(conn, KEY, values[6:]))
        await turns()
        assert batches.sizes == [3]  # nothing more sent while the first is out
        conn.execute_command("CLIENT", "UNPAUSE")
        answers.extend(await asyncio.wait_for(asyncio.gather(*first, *later), 30))
        assert batches.sizes == [3, 5]

    run_held(url, conn, body)
    assert answers == list(range(1, 9))
    assert conn.lrange(KEY, 0, -1) == values


def test_a_full_batch_goes_at_once_while_another_is_out(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: with a batch out, a turn that asks for BATCH_MOST calls sends them at once
    (a full batch is worth its round trip); the one call past them waits for a reply."""
    url, conn = own_redis
    values = [f"v{i}" for i in range(BATCH_MOST + 2)]
    answers: list[Any] = []

    async def body(batches: CountedBatches) -> None:
        first = asked(batches, calls(conn, KEY, values[:1]))
        await turns()
        later = asked(batches, calls(conn, KEY, values[1:]))
        await turns()
        assert batches.sizes == [1, BATCH_MOST]
        conn.execute_command("CLIENT", "UNPAUSE")
        answers.extend(await asyncio.wait_for(asyncio.gather(*first, *later), 30))
        assert batches.sizes == [1, BATCH_MOST, 1]

    run_held(url, conn, body)
    assert sorted(answers) == list(range(1, len(values) + 1))
    assert sorted(conn.lrange(KEY, 0, -1)) == sorted(values)


def test_a_batch_that_fails_sends_what_waited_for_it(
    own_redis: tuple[str, redis.Redis],
) -> None:
    """Proves: a batch's error (its confirmation refused: WAIT for a replica there is
    not) also sends the calls that waited for it, which get their own batch's error:
    no call waits for a reply that came as an error."""
    url, conn = own_redis
    errors: list[BaseException | None] = []

    async def body(batches: CountedBatches) -> None:
        first = asked(batches, calls(conn, KEY, ["a", "b"]))
        await turns()
        later = asked(batches, calls(conn, KEY, ["c"]))
        await turns()
        assert batches.sizes == [2]
        conn.execute_command("CLIENT", "UNPAUSE")
        done = await asyncio.wait_for(asyncio.gather(*first, *later, return_exceptions=True), 30)
        errors.extend(d if isinstance(d, BaseException) else None for d in done)
        assert batches.sizes == [2, 1]

    run_held(url, conn, body, replicas=1)
    assert [type(e) for e in errors] == [WriteNotConfirmed] * 3

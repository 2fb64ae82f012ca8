"""The fleet's word on each stage's pace (PaceBoard), shared by its workers.

Proves: a worker whose own claims have not run a stage yet takes the verdict another
worker posted (creates quick: its provision job runs them in line, with no create job
queued and no first claim kept to one VM); its own claims, once it has some, override
the board; a verdict is posted when it changes, not at every claim; the board is read
at most every BOARD_READ_S while a worker has no word; and a board Redis does not answer is
an empty one. Red before the board: the second worker queued its creates although the
first had found them quick (seen as a 60 ms gap in the fleet's end-to-end runs).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle.pace import BOARD_READ_S, StagePace
from vmpool.local.redis_server import free_port
from vmpool.state.keys import Keys
from vmpool.state.pace_board import PaceBoard
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.batching import BatchDispatcher

from lifecyclehelp import create_request, make_config, make_fleet


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_with_no_claim_of_a_stage_takes_the_fleets_word(
    redis_client: redis.Redis,
) -> None:
    board = PaceBoard(redis_client, Keys("vmpool"))
    clock = _Clock()
    first, second = StagePace(board=board), StagePace(board=board, clock=clock)
    assert not second.quick(Job.CREATE_VM)  # no word yet: a create may block
    first.record(Job.CREATE_VM, 0.001, 1)
    assert not second.quick(Job.CREATE_VM)  # read less than a second ago
    clock.now += 2 * BOARD_READ_S
    assert second.quick(Job.CREATE_VM)  # the first worker's word
    second.record(Job.CREATE_VM, 2.0, 1)  # its own claim: a blocking clone
    assert not second.quick(Job.CREATE_VM)
    assert board.read() == {"create_vm": False}  # the later verdict posted


def test_a_verdict_is_posted_when_it_changes_only(redis_client: redis.Redis) -> None:
    board = PaceBoard(redis_client, Keys("vmpool"))
    pace = StagePace(board=board)
    redis_client.config_resetstat()
    for _ in range(5):
        pace.record(Job.CREATE_VM, 0.001, 1)
    assert int(redis_client.info("commandstats")["cmdstat_hset"]["calls"]) == 1
    assert board.read() == {"create_vm": True}


def test_a_board_redis_does_not_answer_is_an_empty_one() -> None:
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    board = PaceBoard(dead, Keys("vmpool"))
    assert board.read() == {}
    assert board.post("create_vm", True) is False
    pace = StagePace(board=board)
    pace.record(Job.CREATE_VM, 0.001, 1)  # not posted, no error
    assert pace.quick(Job.CREATE_VM) and not StagePace(board=board).quick(Job.CREATE_VM)


def _queued(client: redis.Redis, keys: Keys) -> list[Any]:
    return [*client.lrange(keys.rq_queue("vms"), 0, -1)]


def test_a_second_workers_provision_job_runs_creates_in_line_on_the_fleets_word(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = make_fleet(redis_client, make_config())
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys)
    board = PaceBoard(redis_client, fleet.keys)
    StagePace(board=board).record(Job.CREATE_VM, 0.001, 2)  # another worker's claim
    fleet.pace = StagePace(board=board)  # this worker: no claim of its own yet
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, ["r1"])
    counts = lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready", counts
    assert counts.get("create_vm:pending") == 2, counts  # both created in this job
    assert _queued(redis_client, fleet.keys) == []  # no create batch job queued

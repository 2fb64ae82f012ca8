"""The schedule log: every move of a periodic template, newest first, capped.

Each move of :mod:`workers.schedule` appends one row to ``keys.schedule_log`` in the
move's own unit (``schedule_move.lua``), for operators and for the tests that prove
"never doubled, never stopped"::

    <server time> <job> <outcome> <due time> <next due time> <replica>

``outcome``: ``1`` a run was queued, ``0`` none (the last run still waits or runs),
``idle`` none (the job's inputs were empty: nothing to do). The next due time is the one
the move set, so a reader can tell a parked pending sweep's long wait from a stall.
Rows of older releases have no next due time (five fields).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, NamedTuple

import redis

from vmpool.state.keys import Keys

__all__ = ["LOG_LENGTH", "MoveOutcome", "ScheduleMove", "log_row", "read_schedule_log", "text"]

LOG_LENGTH: Final = 2000


class MoveOutcome(StrEnum):
    """What a move did about a run of its job."""

    QUEUED = "1"  # a run was queued
    WAITING = "0"  # none: the last run still waits in its queue, or runs
    IDLE = "idle"  # none: the job's inputs are empty (vmpool/lifecycle/idle.py)


class ScheduleMove(NamedTuple):
    """One row of the schedule log."""

    time: float  # server time of the move
    job: str
    outcome: MoveOutcome
    due: float  # the due time this move consumed
    next_due: float | None  # the due time it set (None in an older release's row)
    replica: str

    @property
    def enqueued(self) -> bool:
        """Whether this move queued a run."""
        return self.outcome is MoveOutcome.QUEUED


def log_row(now: float, job: str, outcome: MoveOutcome, due: float, after: float, who: str) -> str:
    """The row of one move, as :func:`read_schedule_log` reads it back."""
    return f"{now:.3f} {job} {outcome} {due!r} {after!r} {who}"


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_schedule_log(conn: redis.Redis, keys: Keys) -> list[ScheduleMove]:
    """The schedule log, oldest first."""
    rows: list[ScheduleMove] = []
    for raw in reversed(conn.lrange(keys.schedule_log, 0, -1)):
        fields = text(raw).split(" ")
        if len(fields) == 5:  # an older release's: no next due time
            fields.insert(4, "")
        when, job, outcome, due, after, replica = fields
        rows.append(
            ScheduleMove(
                float(when),
                job,
                MoveOutcome(outcome),
                float(due),
                float(after) if after else None,
                replica,
            )
        )
    return rows

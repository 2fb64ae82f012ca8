"""The periodic work: rq-scheduler puts each sweep on the queues at its config interval.

The periodic jobs are the rows of the job table (:mod:`workers.table`) marked
``periodic``. Each one's interval is the ``:schedule:`` setting of the same name
(in seconds: :class:`vmpool.config.Schedule`, docs/architecture.md).

What the schedule is for: each job runs every interval, and two runs of the expiry
sweep (``sweep_expired``) are *queued* at most its interval apart (while a scheduler
replica runs and Redis answers). Invariant 4 (docs/invariants.md) ("TTL plus one sweep
interval") rests on it.

How. Every replica writes the same six *templates* at start: RQ job hashes with fixed
ids (:func:`workers.table.template_id`) in one sorted set (score = next due time, Redis
server time), added with ``NX`` so a restart does not push the next run back. A template
whose interval changed (a new config) has its due time moved to where the new interval
puts it, the last due time plus the new cadence, if that is sooner (``LT``). So a shorter
interval applies at once, not after one more run of the old one. A longer one applies
after the run already due. Due times lie on a grid: the next is the previous plus the
job's :func:`cadence`. A grid, unlike "now + interval" at each move, does not let the
delay from a due time to its move (a wake-up, a few round trips) add up run after run.
After a stall the next due time is the first grid point still ahead, never a burst of
catch-up runs. For the jobs whose
interval is a promised bound (the table's ``bounded`` rows: the expiry sweep) the
cadence is the interval less a lead (a quarter of it, at most :data:`MAX_LEAD_S`), which
absorbs that delay, so the runs themselves stay within the interval. For the others it
is the interval itself (a frequency, not a promise: a lead would only add work).

A replica sleeps until the earliest due time or its tick (``--interval``, default 1 s),
whichever comes first, plus a random jitter of up to a twentieth of the tick, so the
replicas take turns instead of one winning every due time. Awake, it reads the due
templates and moves each one. It enqueues a run of the job through
:func:`workers.queues.enqueue`, then runs ``schedule_move.lua``. Only if the score is
still the due time it read, the script moves the template to its next due time, logs the
move and records the run.

A template this version does not know (a job of a newer release, during a rolling
upgrade) is left alone and logged once: the replica that knows it runs it.

A job's runs share its one id (``unique``: while a run is queued or running, no other
is queued, and a dead one is reclaimed, workers/queues.py). The bounded jobs are the
exception. Each of their runs has its own id, ``..._r<due time in ms>`` (still
``unique``, so two replicas enqueueing one due time queue it once). Their next run is
queued unless the last one (``keys.schedule_last_runs``) still *waits* in its queue. So
at most one run of the expiry sweep waits at a time, however long the workers are busy.
But a run that has *started* never blocks the next. A worker frozen (SIGSTOP) or killed
in the middle of a sweep leaves its job ``started``. With one fixed id, that held back
every sweep until the worker woke or its heartbeat went stale (10 s), which made
requests settle late in the soak. Two expiry sweeps may then overlap, which is
harmless: each expiry is its own atomic, checked transition. The other jobs keep one
id, so a slow one (a reconcile took 7 s in the soak) never runs beside itself.

There is no scheduler lock to hold. Any number of replicas may wake at once, and each
due time is moved and logged once (the script's compare). A due time never goes
backwards (but to a shorter interval's or a wake-up's, both ``ZADD LT``), and a replica
frozen in the middle of its tick (SIGSTOP, a GC pause) delays nobody.
Enqueueing before the move means a replica killed between the two leaves the template
due for the next replica, so no run is lost. (rq-scheduler's own
loop takes a lock with ``SET NX EX interval+10``. A replica frozen holding it stopped
every sweep for up to 11 s, longer than the sweep interval. It is not used here.)

A job with nothing to do is not run: a move checks the keys its sweep reads first, and
queues no run when they are all absent, and the pending sweep parks while nothing is
reserved or booting, until a reservation wakes it (:mod:`workers.schedule_park`).

Each move is logged to a capped list (``keys.schedule_log``, newest first, with what it
queued and the next due time it set: :mod:`workers.schedule_log`), for operators and
for the tests that prove "never doubled, never stopped".
"""

from __future__ import annotations

import logging
import math
import random
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import redis
from rq.exceptions import NoSuchJobError

from vmpool.ids import Job
from vmpool.state.durability import unconfirmed
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from workers.queues import enqueue
from workers.rqcompat import SchedulerHooks
from workers.schedule_log import (
    LOG_LENGTH,
    MoveOutcome,
    ScheduleMove,
    log_row,
    read_schedule_log,
    text,
)
from workers.schedule_park import PARK_S, Parking
from workers.table import JOBS, PERIODIC, QUEUE_SWEEPS, job_id, template_id

if TYPE_CHECKING:
    from vmpool.config import Schedule
    from workers.loop import AliveFile

__all__ = [
    "MAX_LEAD_S",
    "PARK_S",
    "FleetScheduler",
    "MoveOutcome",
    "ScheduleMove",
    "cadence",
    "last_run_id",
    "next_due",
    "read_schedule_log",
    "schedule_intervals",
]

log = logging.getLogger(__name__)

# The lead (see the module docstring): a quarter of the interval, at most 1 s. Measured
# in the 10,600-request chaos soak (docs/reliability.md), a sweep move came 43 ms
# (median) after its due time and at worst 0.20 s away from Redis restarts, on a loaded
# 2-core machine. 0.5 s of lead for the 2 s sweep covers that.
LEAD_FRACTION: Final = 0.25
MAX_LEAD_S: Final = 1.0
# The random part of each sleep, as a share of the tick: the replicas' turns.
JITTER_FRACTION: Final = 0.05

_MOVE_LUA: Final = read_script("workers", "schedule_move.lua")


def schedule_intervals(schedule: Schedule) -> dict[Job, float]:
    """Seconds between runs, per periodic job (its ``:schedule:`` setting of one name)."""
    return {spec.name: float(getattr(schedule, spec.name)) for spec in PERIODIC}


def cadence(job: Job, interval: float) -> float:
    """The spacing of a job's due times: its interval, less the lead if it is bounded.

    A bounded job is due a lead early, and each run has its own id, so a frozen run
    holds back no other.
    """
    if not JOBS[job].bounded:
        return interval
    return interval - min(MAX_LEAD_S, interval * LEAD_FRACTION)


def next_due(due: float, every: float, now: float) -> float:
    """The first point of the grid ``due + k * every`` (k >= 1) after ``now``."""
    steps = max(1, math.floor((now - due) / every) + 1)
    return due + steps * every


class FleetScheduler(SchedulerHooks):
    """rq-scheduler with vmpool's keys, server time, a due-time grid, no lock.

    Its enqueues are deduplicated. ``clock`` replaces the Redis server clock (tests only).
    ``inputs``: per job, the keys it reads first (see the module docstring); a job not
    in it always runs.
    """

    def __init__(
        self,
        connection: redis.Redis,
        keys: Keys,
        interval: float = 1.0,
        clock: Callable[[], float] | None = None,
        seed: int | None = None,
        alive: AliveFile | None = None,
        inputs: Mapping[Job, Sequence[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            queue_name=keys.queue(QUEUE_SWEEPS),
            connection=connection,
            interval=interval,
            **kwargs,
        )
        # rq-scheduler reads its keys from these attributes: ours, under the prefix.
        self.keys = keys
        self.redis_scheduler_namespace_prefix = keys.scheduler_prefix
        self.scheduler_key = keys.schedulers
        self.scheduler_lock_key = keys.scheduler_lock  # never taken by this loop
        self.scheduled_jobs_key = keys.schedule_due
        self.tick_s = float(interval)  # the longest sleep between two ticks
        self._clock = clock
        self._rng = random.Random(seed)
        self._move_script = connection.register_script(_MOVE_LUA)
        # templates of jobs this version does not know: never moved, cancelled or waited on
        self._foreign: set[str] = set()
        self._alive = alive  # touched on every tick: `vmpool probe scheduler` reads it
        self.parking = Parking(connection, keys, inputs or {})

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        sec, usec = self.connection.time()
        return float(sec) + float(usec) / 1_000_000

    def install(self, intervals: Mapping[Job, float]) -> None:
        """Write the templates (idempotent: every replica does it at start).

        A changed interval moves the next due time (see the module docstring).
        """
        now = self._now()
        for job, seconds in intervals.items():
            if job not in JOBS or seconds <= 0:
                raise ValueError(f"bad periodic job {job!r} every {seconds!r} s")
            previous = self._installed_interval(template_id(self.keys, job))
            template = self.create_template(
                "workers.jobs.noop",
                template_id(self.keys, job),
                description=f"every {seconds:g} s: enqueue {job}",
                meta={"vmpool_job": str(job), "vmpool_interval": seconds},  # plain text
            )
            template.save()
            self.connection.zadd(self.scheduled_jobs_key, {template.id: now}, nx=True)
            if previous is not None and previous != seconds:
                self._reschedule(job, template.id, previous, seconds)

    def _installed_interval(self, template: str) -> float | None:
        """The interval the installed template of that id runs at. None if there is none."""
        try:
            job = self.job_class.fetch(template, connection=self.connection)
        except NoSuchJobError:
            return None
        interval = job.meta.get("vmpool_interval")
        return float(interval) if isinstance(interval, (int, float)) else None

    def _reschedule(self, job: Job, template: str, old: float, new: float) -> None:
        """Move the due time to the last one plus the new cadence, if that is sooner."""
        score = self.connection.zscore(self.scheduled_jobs_key, template)
        if score is None:
            return
        due = float(score) - cadence(job, old) + cadence(job, new)
        self.connection.zadd(self.scheduled_jobs_key, {template: due}, lt=True)
        log.info("%s: interval %g s -> %g s, next due time moved if sooner", job, old, new)

    def due_templates(self) -> list[tuple[str, float]]:
        """(template id, due time) of every template due now, earliest first."""
        rows = self.connection.zrangebyscore(
            self.scheduled_jobs_key, "-inf", self._now(), withscores=True
        )
        due = [(text(member), float(score)) for member, score in rows]
        return [(tid, score) for tid, score in due if tid not in self._foreign]

    def move(self, template_id: str, due: float) -> bool:
        """Enqueue the template's job and move it on, if ``due`` is still its due time.

        True if this call moved it (to its next due time). A job whose inputs are empty
        is not run; the pending sweep parks (see the module docstring).
        """
        periodic = self._periodic(template_id)
        if periodic is None:
            return False
        name, interval = periodic
        # A replica that lost the race usually sees it here, before enqueueing a sweep
        # that may already have run. The script below is what decides.
        score = self.connection.zscore(self.scheduled_jobs_key, template_id)
        if score is None or float(score) != due:
            return False
        every = cadence(name, interval)
        busy = self.parking.has_work(name)
        outcome, run_id = self._run(name, due) if busy else (MoveOutcome.IDLE, "")
        now = self._now()
        after = next_due(due, every, now)
        keys = [self.scheduled_jobs_key, self.keys.schedule_log, self.keys.schedule_last_runs]
        row = log_row(now, name, outcome, due, after, self.name)
        args: list[str | int] = [template_id, repr(due), repr(after), row, LOG_LENGTH, name, run_id]
        if self.parking.parks(name):  # the script parks it if no input exists
            parked = max(after, now + PARK_S)
            keys += self.parking.park_keys(name)
            args += [
                repr(due + every),
                repr(parked),
                log_row(now, name, outcome, due, parked, self.name),
            ]
        moved = int(self._move_script(keys=keys, args=args))
        if moved:
            log.debug("%s: %s%s", name, outcome.name.lower(), ", parked" if moved == 2 else "")
        return bool(moved)

    def _run(self, name: Job, due: float) -> tuple[MoveOutcome, str]:
        """Queue a run of ``name`` for ``due``: what was done, and the run's id ('' none).

        A bounded job's run has this due time's own id, and is not queued while its
        last run still waits (see the module docstring).
        """
        run = round(due * 1000) if JOBS[name].bounded else None
        if run is not None and self._still_waiting(name):
            return MoveOutcome.WAITING, ""
        queued = enqueue(self.connection, self.keys, name, run=run)
        run_id = job_id(self.keys, name, run=run)
        return (MoveOutcome.QUEUED if queued else MoveOutcome.WAITING), run_id

    def _periodic(self, template_id: str) -> tuple[Job, float] | None:
        """The (job name, interval) of a template this version runs, else None.

        None for one that is gone (its entry dropped) or unknown to this version (left
        alone).
        """
        try:
            template = self.job_class.fetch(template_id, connection=self.connection)
        except NoSuchJobError:
            log.warning("dropping schedule entry %s: its template is gone", template_id)
            self.connection.zrem(self.scheduled_jobs_key, template_id)
            return None
        name = template.meta.get("vmpool_job")
        interval = float(template.meta.get("vmpool_interval") or 0)
        if name not in JOBS or not JOBS[name].periodic or interval <= 0:
            # A newer release's job (a rolling upgrade): its replicas run it. Cancelling
            # it here would delete their template. Leave it, and say so once.
            self._foreign.add(template_id)
            log.warning(
                "schedule entry %s (job %r) is unknown to this version: left alone",
                template_id,
                name,
            )
            return None
        return Job(name), interval

    def _still_waiting(self, name: Job) -> bool:
        """Whether the job's last scheduled run still waits in its queue (not started)."""
        last = last_run_id(self.connection, self.keys, name)
        if last is None:
            return False
        queue_key = self.keys.rq_queue(JOBS[name].queue)
        return self.connection.lpos(queue_key, last) is not None

    def enqueue_jobs(self) -> list[str]:
        """Move every due template. The ids this replica moved."""
        return [tid for tid, due in self.due_templates() if self.move(tid, due)]

    def seconds_to_next_tick(self) -> float:
        """Until the earliest due time or one tick, whichever is sooner, plus jitter."""
        # the earliest template that is ours: a foreign one due forever must not spin us
        rows = self.connection.zrange(
            self.scheduled_jobs_key, 0, len(self._foreign), withscores=True
        )
        first = [score for member, score in rows if text(member) not in self._foreign]
        wait = self.tick_s
        if first:
            wait = min(wait, max(0.0, float(first[0]) - self._now()))
        return wait + self._rng.uniform(0.0, self.tick_s * JITTER_FRACTION)

    def tick(self) -> list[str]:
        """One pass: the liveness heartbeat (and the alive file), then the due moves."""
        if self._alive is not None:
            self._alive.touch()
        self.heartbeat()
        return self.enqueue_jobs()

    def run(self, burst: bool = False) -> None:
        """Tick until SIGTERM/SIGINT, or once with ``burst``."""
        self.register_birth()
        self.install_signal_handlers()
        try:
            while True:
                with unconfirmed():  # a move a failover loses runs a job again or late
                    self.tick()
                if burst:
                    return
                self.parking.wait(self.seconds_to_next_tick())
        finally:
            self._say_death()

    def install_signal_handlers(self) -> None:
        """Stop on SIGTERM and SIGINT, never waiting on Redis.

        rq-scheduler's own handler writes the scheduler's death first: with Redis gone (an
        outage, or `vmpool up` killed with its Redis) that raised a Redis error, which the
        caller took for an outage to wait out, and the process never stopped."""

        def stop(signum: int, frame: Any) -> None:
            self.log.info("Shutting down RQ scheduler...")
            raise SystemExit()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)

    def _say_death(self) -> None:
        """Record the death if Redis answers (a scheduler's record expires anyway)."""
        try:
            self.register_death()
        except redis.RedisError as exc:
            log.info("scheduler: could not record its death: %s", exc)


def last_run_id(conn: redis.Redis, keys: Keys, job: Job) -> str | None:
    """The RQ job id of the job's latest scheduled run (its hash is gone once it ran)."""
    value = conn.hget(keys.schedule_last_runs, job)
    return None if value is None else text(value)

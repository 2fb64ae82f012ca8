"""The on-demand lifecycle: what each RQ job does, as plain functions of a :class:`Fleet`.

``workers/`` holds thin RQ entry points. Each calls one function here. Every function is
idempotent (safe to run twice, late, or beside a copy of itself). It re-reads the state
it acts on, does provider work only under a fenced lock (:mod:`vmpool.state.locks`), and
records the result through one checked store transition. It treats the store's refusals
as the normal answer of a race it lost (logged at debug/info, never raised).

The job graph::

    API / provision_sweep ──> provision_request(rid) ── reserve_vm (n) ──> create_vm(name)
    create_vm ── provider.create ── vm_created ──> check_pending_vm(name)
    check_pending_vm ── provider ready? ── vm_ready (running | fulfilled | completed)
                     └─ past the pool timeout / vanished ── vm_failed ── retry ──> provision_request
    sweep_expired ── expire_request (fulfilled | failed) ──> destroy_vm for released VMs
    reap_running ── end_vm_lifetime ──> destroy_vm
    destroy_sweep ──> destroy_vm ── provider.destroy ── vm_destroyed
    reconcile ── provider inventory, then records: leaks, abandoned reservations, lost VMs

Which lock guards what: ``reserve_vm`` runs under the request's lock (fence from
``keys.request_fence``). ``vm_created``, ``vm_ready``, ``vm_failed`` and ``vm_destroyed``
under the VM's lock (fence from ``keys.vm_fence``). ``expire_request`` and
``end_vm_lifetime`` take no lock: they involve no provider work and their scripts check
everything they need.

Time always comes from the Redis server (``store.server_time()``), never this host.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from redis import Redis
from redis.commands.core import Script

from vmpool.config import Config
from vmpool.ids import Job
from vmpool.lifecycle.pace import StagePace
from vmpool.providers import Provider, providers_from_config
from vmpool.state.capacity import ProviderCapacity
from vmpool.state.circuit import ProviderCircuit
from vmpool.state.fleet_identity import IdentityWatch
from vmpool.state.keys import Keys
from vmpool.state.lock_renewer import LockRenewer
from vmpool.state.locks import LOCK_TEXTS, FencedLock, LockKind
from vmpool.state.lua import load_missing
from vmpool.state.names import NameGenerator
from vmpool.state.records import Outcome, VMRecord
from vmpool.state.semaphore import CloneSemaphore
from vmpool.state.store import Store
from vmpool.state.transitions import VMState
from vmpool.state.workset import WorkSet

__all__ = [
    "Dispatcher",
    "Fleet",
    "RecordingDispatcher",
    "SweepWatch",
    "after_vm_failed",
    "dispatch_released",
    "note_outcome",
]

log = logging.getLogger(__name__)


class Dispatcher(Protocol):
    """Puts follow-up work on the queues: :meth:`send`, one entry for every job.

    The implementations are workers/queues.py's (a deduplicated RQ job per subject) and
    workers/batching.py's (a work set and its batch jobs)."""

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        """Queue ``job`` for each of ``subjects`` (request ids or VM names).

        Cheap, idempotent, and deduplicated per (job, subject) by the implementation. In
        a constant number of Redis round trips per call however many subjects: a sweep
        sends all it found at once, never one round trip per open request per tick.
        """


@runtime_checkable
class SweepWatch(Protocol):
    """A Dispatcher that can tell whether a sweep waits for a worker (workers/queues.py's).

    A long batch job asks it now and then and stops when one does
    (:class:`vmpool.lifecycle.batch_time.BatchTime`)."""

    def sweep_waiting(self) -> bool:
        """Whether a job waits in the sweeps' queue (one read)."""


@dataclass
class RecordingDispatcher:
    """A Dispatcher that only records what it was asked (tests, ``--dry-run`` tools).

    One (job, subject) per subject sent, in order (run_dispatched-style replay)."""

    calls: list[tuple[Job, str]] = field(default_factory=list)

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        self.calls.extend((job, subject) for subject in subjects)

    def take(self) -> list[tuple[Job, str]]:
        """The calls recorded so far, and forget them."""
        calls, self.calls = self.calls, []
        return calls


@dataclass
class Fleet:
    """Everything a lifecycle function needs. No globals. One per worker process."""

    redis: Redis
    keys: Keys
    config: Config
    store: Store
    providers: Mapping[str, Provider]
    dispatch: Dispatcher
    actor: str
    clone_slots: CloneSemaphore | None = None
    rng: random.Random = field(default_factory=random.SystemRandom)
    names: NameGenerator = field(init=False)
    circuit: ProviderCircuit = field(init=False)
    capacity: ProviderCapacity = field(init=False)
    identity: IdentityWatch = field(init=False)
    # One renewal thread for every lock this process holds (not one per lock).
    lock_renewer: LockRenewer = field(default_factory=LockRenewer)
    # How quick each batch stage has been in this process; None: every follow-up is
    # queued, none run in line (vmpool.lifecycle.batch). A worker process sets one.
    pace: StagePace | None = None

    def __post_init__(self) -> None:
        if self.clone_slots is None:
            self.clone_slots = CloneSemaphore(
                self.redis, self.keys, self.config.ondemand_clone_limit, self.lease_s
            )
        self.circuit = ProviderCircuit(
            self.redis,
            self.keys,
            self.config.provider_circuit_failures,
            self.config.provider_circuit_cooldown_s,
        )
        self.names = NameGenerator(self.config.hostname_prefix, self.rng)
        self.capacity = ProviderCapacity(self.redis, self.keys, self.lease_s)
        self.identity = IdentityWatch(self.redis, self.keys)

    @classmethod
    def build(
        cls,
        redis_client: Redis,
        config: Config,
        dispatch: Dispatcher,
        actor: str,
        pace: StagePace | None = None,
    ) -> Fleet:
        keys = Keys(config.key_prefix)
        fleet = cls(
            redis=redis_client,
            keys=keys,
            config=config,
            store=Store(redis_client, keys),
            providers=providers_from_config(redis_client, keys, config),
            dispatch=dispatch,
            actor=actor,
            pace=pace,
        )
        fleet.identity.start()  # held from now on, so that a loss is noticed
        return fleet

    def warm(self, extra: Sequence[Script] = ()) -> int:
        """Make the scripts of the store, work sets, locks, clone slots and providers (and
        ``extra``: the worker's own) ready before the first job; how many Redis lacked
        (now loaded).

        Each store script's text is composed on its first use (its helpers pruned: a few
        ms each), and on a fresh or restarted Redis each script's first call is answered
        NOSCRIPT (a round trip and a load; in a pipeline, the call runs again after those
        that followed it). A worker pays both as it starts, not in its first claims."""
        scripts = [*self.store.scripts.all(), *WorkSet(self.redis, self.keys).scripts]
        scripts += [self.redis.register_script(text) for text in LOCK_TEXTS]
        if self.clone_slots is not None:
            scripts += self.clone_slots.scripts
        for provider in self.providers.values():  # the simulated cloud's, on Redis
            scripts += getattr(provider, "scripts", [])
        return load_missing(self.redis, [*scripts, *extra])

    # -- helpers ------------------------------------------------------------------------
    @property
    def lease_s(self) -> float:
        """How long a clone slot is held without renewal.

        Twice the lock expiry, well above the slowest create, so only a dead worker's
        slot ever times out."""
        return 2.0 * self.config.lock_expire_s

    @property
    def slots(self) -> CloneSemaphore:
        assert self.clone_slots is not None  # set in __post_init__
        return self.clone_slots

    def who(self, job: str) -> str:
        return f"{self.actor}/{job}"

    def lock(
        self, kind: LockKind, subject: str, job: str, *, read_record: bool = False
    ) -> FencedLock:
        """The subject's fenced lock, not yet acquired.

        ``read_record``: its grant also reads the subject's record
        (:attr:`FencedLock.record`)."""
        return FencedLock(
            self.redis,
            self.keys,
            kind,
            subject,
            expire_s=self.config.lock_expire_s,
            holder=self.who(job),
            orphan_fence_ttl_s=self.config.data_ttl_s,
            renewer=self.lock_renewer,
            read_record=read_record,
        )

    def provider_for(self, vm: VMRecord) -> Provider | None:
        provider = self.providers.get(vm.provider)
        if provider is None:
            log.error(
                "VM %s names provider %r, which is not configured; leaving it alone",
                vm.name,
                vm.provider,
            )
        return provider

    def pool_timeout_s(self, pool: str) -> float:
        pool_config = self.config.pools.get(pool)
        return pool_config.timeout_s if pool_config is not None else self.config.timeout_s


def note_outcome(what: str, subject: str, outcome: Outcome) -> None:
    """Log a transition's outcome: refusals are normal (a race lost), so info, not error."""
    if outcome.ok:
        log.debug("%s %s: %s (v%s)", what, subject, outcome.code, outcome.version)
    else:
        log.info("%s %s refused: %s", what, subject, outcome.code)


def dispatch_released(fleet: Fleet, *request_ids: str) -> None:
    """Dispatch destroy_vm for the requests' VMs on their way to destruction.

    Dispatch destroy_vm, in one batch, for every VM of the requests that is on its way
    to destruction (after a request failed or was fulfilled late, its VMs are
    'completed'). A warm-pool VM's '' (no request) is skipped."""
    released = [
        vm.name
        for request_id in request_ids
        if request_id
        for vm in fleet.store.request_vms(request_id)
        if vm.state == VMState.COMPLETED
    ]
    if released:
        fleet.dispatch.send(Job.DESTROY_VM, released)


def after_vm_failed(fleet: Fleet, vm: VMRecord, outcome: Outcome) -> None:
    """Dispatch what follows a vm_failed transition.

    Follow-up of a vm_failed transition: a new reservation on 'retry', destruction of
    what the provider may hold, and of the request's VMs if the request failed."""
    if not outcome.ok:
        return
    fleet.dispatch.send(Job.DESTROY_VM, [vm.name])
    if outcome.code == "retry":
        fleet.dispatch.send(Job.PROVISION_REQUEST, [vm.request_id])
    elif outcome.code == "request_failed":
        dispatch_released(fleet, vm.request_id)

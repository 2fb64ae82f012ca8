"""The fleet's moving parts for the model test (tests/test_model.py): warm pools, batch
claims, the listing sweep, the clone semaphore and the order of service.

:class:`FleetMachine` is a hypothesis state machine whose rules run vmpool's real
lifecycle functions (``top_up_pools``, ``provision_request``, ``create_vm``,
``check_pending_vm``, ``check_ready``, ``destroy_vm``) and its real work sets, store and
clone semaphore, on a real Redis with the simulated provider; the steps that race are
split where the real actor waits (a claim and its run; the listing sweep's list and its
acting on it; a create stopped inside its provider call, on a thread, past its lock and
lease; check_ready's read and its recycle). After every step: the whole audit
(providers included), every reserved VM in the create work set (no subject lost), the
clone semaphore never over its limit, and the order of service: each request's place in
line is the one the policy of docs/state-machine.md gives it (computed here
independently, from its arrival, its priority and its user's waiting requests), each
provision claim takes the waiting requests of the smallest places, and no place is
later than its arrival plus one round per request of its user waiting ahead at its
priority (so no request starves: one arriving later than that cannot come ahead);
quotas per user are never exceeded (the audit's invariant 11, the count kept equal to
the records); every pending request's position is honest (0 once being provisioned,
else 1 + the requests placed ahead of it in line) and never rises but by the requests
that entered the line ahead of it since.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import redis
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from vmpool import lifecycle
from vmpool.config import Config, parse_config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.lifecycle.batch import DEFERRED, retry_s
from vmpool.lifecycle.pending import Listing, apply_listing, list_pending
from vmpool.lifecycle.requests import CloneGate
from vmpool.providers import SimulatedProvider
from vmpool.state.audit import audit_state
from vmpool.state.keys import Keys
from vmpool.state.names import NameGenerator
from vmpool.state.quotas import QuotaLimits
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.workset import Claim, WorkSet

from storehelp import wait_until

SIM = "sim"
POOLS = ("debian", "centos")  # debian: warm (size 2); centos: on demand only
CLONE_LIMIT = 4
USERS = ("", "ann", "bob")
QUOTA = {"ann": 2, "bob": 1}  # max_vms: small enough that requests wait for them
# The aging period, which is also the round of fair share: far longer than an example
# lasts, so the order does not depend on how fast the steps run (the same in replays).
ROUND_S = 600
# Ids chosen to sort against their arrival: the order must not follow them.
ID_HEADS = ("zz", "ffff", "mm", "0000", "a")
MAX_REQUESTS = 6
ACTOR = "model"


def fleet_config() -> Config:
    data = {
        ":providers": {SIM: {"provider_class": "simulated", "boot_seconds": 0, "seed": 1}},
        ":config": {"ondemand_request_ttl": 10, "ondemand_clone_limit": CLONE_LIMIT,
                    "max_vm_retries": 1, "timeout": 600, "lock_expire": 600},
        # nothing here runs by the clock: a lock, a lease, a deferral (its retry follows
        # the pending sweep's interval) ends only when a rule ends it, so every example
        # replays the same way
        ":schedule": {"check_pending_sweep": 600},
        ":quotas": {"priority_aging": ROUND_S, "default": {"priority": 1},
                    "users": {user: {"max_vms": n} for user, n in QUOTA.items()}},
        ":pools": [
            {"name": "debian", "template": "debian-12", "size": 2, "provider": SIM},
            {"name": "centos", "template": "centos-9", "size": 0, "provider": SIM},
        ],
    }  # fmt: skip
    return parse_config(data, source="model", env={})


class WorkSetDispatcher:
    """The batching dispatcher's work-set half (the machine's rules are the batch jobs,
    so no RQ job is queued); provision adds are reported to the order model."""

    def __init__(self, work: WorkSet, added: Any, store: Any) -> None:
        self.work, self.added, self.store = work, added, store

    def send(self, job: Job, subjects: Sequence[str]) -> None:
        if job == Job.PROVISION_REQUEST:
            for rid in subjects:
                if self.work.add(job, [rid]):
                    self.added(rid)
        elif job in (Job.CREATE_VM, Job.CHECK_PENDING_VM):
            self.work.add(job, list(subjects))
        # check_request and destroy_vm: the machine's rules stand for what they would do
        # (the destroy rule finds completed VMs by their index)


@dataclass
class OrderModel:
    """The order of service, computed from what the machine did, independently of the
    scripts: each request's place (its arrival less its priority's lead, and a round
    behind its user's previous request of that priority while that one waits in line),
    and the provision claims: the waiting requests of the smallest places first."""

    place: dict[str, float] = field(default_factory=dict)  # every request posted
    created: dict[str, float] = field(default_factory=dict)
    line_of: dict[str, tuple[str, int]] = field(default_factory=dict)  # rid -> (user, priority)
    last: dict[tuple[str, int], str] = field(default_factory=dict)  # (user, priority) -> rid
    waiting: set[str] = field(default_factory=set)  # in the provision work set, unclaimed

    def posted(
        self, rid: str, created: float, user: str, priority: int, in_line: set[str]
    ) -> float:
        """The place the policy gives a new request; ``in_line``: the requests in the
        provision queue when it was posted."""
        place = created - (2 - priority) * ROUND_S
        previous = self.last.get((user, priority))
        if previous is not None and previous in in_line:
            place = max(place, self.place[previous] + ROUND_S)
        self.place[rid], self.created[rid] = place, created
        self.last[(user, priority)] = rid
        self.line_of[rid] = (user, priority)
        return place

    def add(self, rid: str) -> None:
        self.waiting.add(rid)

    def claim(self, n: int) -> list[str]:
        picks = sorted(self.waiting, key=lambda r: self.place[r])[:n]
        self.waiting -= set(picks)
        return picks


@dataclass
class PositionWatch:
    """Every pending request's position as GET shows it, checked against the line: 0
    once being provisioned, else 1 + the requests placed ahead of it in the provision
    queue; and between two looks it never rises but by the requests that entered the
    line ahead of it meanwhile (a higher or aged priority, fair share, a retry)."""

    positions: dict[str, int] = field(default_factory=dict)
    unreserved: dict[str, int] = field(default_factory=dict)
    line: set[str] = field(default_factory=set)

    def look(self, store: Any, order: OrderModel, line: set[str]) -> list[str]:
        problems = []
        entered = line - self.line
        for rid in sorted(order.place):
            req = store.get_request(rid)
            if req is None or req.status != "pending":
                self.positions.pop(rid, None)
                self.unreserved.pop(rid, None)
                continue
            place = store.quotas.place(rid, CLONE_LIMIT)
            assert place is not None
            started = rid not in line or req.unreserved < req.need
            ahead = {r for r in line if order.place[r] < order.place[rid]}
            expected = 0 if started else 1 + len(ahead)
            if place.position != expected:
                problems.append(f"{rid} at position {place.position}, {expected} by the line")
            before = self.positions.get(rid)
            # it lost a VM and waits in line again (entered it, or had stayed in it with
            # VMs still to reserve: then its count of VMs to reserve rose)
            back = rid in entered or req.unreserved > self.unreserved.get(rid, req.unreserved)
            self.unreserved[rid] = req.unreserved
            if before is not None and not back and place.position > before + len(ahead & entered):
                problems.append(f"{rid} rose from {before} to {place.position}")
            self.positions[rid] = place.position
        self.line = set(line)
        return problems


@dataclass
class Creator:
    """A create_vm stopped inside its provider call (on its own thread)."""

    name: str
    fence: int
    thread: threading.Thread
    go: threading.Event
    result: dict[str, str]
    stale: bool = False


@dataclass
class ReadyCheck:
    name: str


class _StoppedProvider:
    """The simulated provider, whose create waits for the test (a creator stopped)."""

    def __init__(self, sim: SimulatedProvider) -> None:
        self.sim = sim
        self.inside = threading.Event()
        self.go = threading.Event()

    def create_vm(self, *args: Any, **kwargs: Any) -> Any:
        self.inside.set()
        self.go.wait(30)
        return self.sim.create_vm(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.sim, attr)


class FleetMachine(RuleBasedStateMachine):
    url: ClassVar[str] = ""
    client: ClassVar[Any] = None
    outcomes: ClassVar[Counter[str]]

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        if cls.client is None:
            cls.client = redis.Redis.from_url(self.url, decode_responses=True)
        self.client.flushdb()
        self.order = OrderModel()
        self.positions = PositionWatch()
        self.keys = Keys()
        self.work = WorkSet(self.client, self.keys)
        self.fleet = Fleet.build(self.client, fleet_config(), None, f"worker:{ACTOR}")  # type: ignore[arg-type]
        self.fleet.dispatch = WorkSetDispatcher(self.work, self._added, self.fleet.store)
        self.fleet.rng = random.Random(7)  # the same VM names in every replay
        self.fleet.names = NameGenerator(self.fleet.config.hostname_prefix, self.fleet.rng)
        self.sim = self.fleet.providers[SIM]
        self.requests: list[str] = []
        self.live: list[str] = []  # not deleted by the machine
        self.threads: list[Creator] = []
        self.problems: list[str] = []
        self.seen: dict[str, Any] = {}  # what the last check found (the preconditions)
        self._look()

    @initialize(users=st.permutations(USERS), heads=st.permutations(ID_HEADS))
    def fleet_at_work(self, users: list[str], heads: list[str]) -> None:
        """Every example starts with three users' requests (ids sorting against their
        arrival) and a warm pool topped up, so each rule finds something to act on."""
        for user, head in zip(users, heads, strict=False):
            self.post_request(user, head, 1, "centos", 2)
        self.top_up()

    def _look(self) -> None:
        """What the preconditions need, read once after each step."""
        pipe = self.client.pipeline(transaction=False)
        states = ("reserved", "pending", "ready", "running", "completed")
        for state in states:
            for pool in POOLS:
                pipe.zcard(self.keys.pool_state(pool, state))
        for job in ("provision_request", "create_vm"):
            pipe.zcard(self.keys.work_set(job))
            pipe.zcard(self.keys.work_part(job, "claims"))
        pipe.hlen(self.keys.work_part("create_vm", "claimed"))
        counts = pipe.execute()
        warm = self.fleet.store.pools.warm_counts(["debian"])["debian"]
        self.seen["warm_short"] = warm["ready"] + warm["warming"] < 2
        for i, state in enumerate(states):
            self.seen[state] = counts[2 * i] + counts[2 * i + 1]
        n = 2 * len(states)
        self.seen["provision"] = counts[n] - counts[n + 1]
        self.seen["create"] = counts[n + 2] - counts[n + 3]
        self.seen["deferred"] = counts[n + 3] - counts[n + 4]

    def _added(self, rid: str) -> None:
        """A request joined the provision work set (posted, or dispatched again)."""
        self.order.add(rid)

    def _line(self) -> set[str]:
        """The requests in the provision queue (pending, with VMs still to reserve)."""
        return set(self.client.zrange(self.keys.provision_queue, 0, -1))

    def _note(self, what: str) -> None:
        self.outcomes[what] += 1

    def _vms(self, state: str, pools: tuple[str, ...] = POOLS) -> list[str]:
        return sorted(n for p in pools for n in self.fleet.store.pool_vms(p, state))

    @staticmethod
    def _pick(names: list[str], index: int) -> str | None:
        return names[index % len(names)] if names else None

    # -- clients and the order of service -----------------------------------------------
    @precondition(lambda self: len(self.requests) < MAX_REQUESTS)
    @rule(user=st.sampled_from(USERS), head=st.sampled_from(ID_HEADS), n=st.integers(1, 2),
          pool=st.sampled_from(POOLS), priority=st.sampled_from((1, 2, 3)))  # fmt: skip
    def post_request(self, user: str, head: str, n: int, pool: str, priority: int) -> None:
        """POST /ondemandvm: a request joins the provision work set in its unit (or, with
        others waiting for a clone slot ahead of it and none free in its turn, the slots'
        line: its turn dispatches it), at the place the policy gives it; none later than
        its arrival (less its priority's lead) or a round behind its user's last waiting
        request of its priority."""
        rid = f"{head}-{len(self.requests)}"
        in_line = self._line()
        settings = RequestSettings.from_config(self.fleet.config, priority=priority)
        out = self.fleet.store.create_request(
            rid, [Slot(pool, pool, n)], dataclasses.replace(settings, ttl_s=600, max_vm_retries=1),
            actor="api", token_user=user, work_set=self.keys.work_set("provision_request"),
            clone_limit=CLONE_LIMIT,
        )  # fmt: skip
        assert out.ok, out
        req = self.fleet.store.get_request(rid)
        assert req is not None
        expected = self.order.posted(rid, req.created, user, priority, in_line)
        if abs(req.place - expected) > 1e-5:
            self.problems.append(f"{rid} placed at {req.place}, the policy places it {expected}")
        # Fair share's bound, from the line alone: no later than a round behind the last
        # place of its user's requests of its priority still waiting (their count is no
        # bound: a request that left the line keeps the round it gave the ones behind it).
        ahead = [r for r in in_line if self.order.line_of.get(r) == (user, priority)]
        arrival = req.created - (2 - priority) * ROUND_S
        bound = max([arrival] + [self.order.place[r] + ROUND_S for r in ahead])
        if req.place > bound + 1e-5:
            self.problems.append(f"{rid} placed past its bound {bound} ({len(ahead)} ahead)")
        if self.client.zscore(self.keys.work_set("provision_request"), rid) is not None:
            self._added(rid)
        else:
            self._note("post:in_slot_line")
        self.requests.append(rid)
        self.live.append(rid)
        self._note("post")
        if req.place != req.created:
            self._note("order:placed_off_arrival")  # a priority or fair share placed it

    @rule()
    def provision_sweep(self) -> None:
        """The provision sweep: the requests with VMs to reserve dispatched again, but
        those waiting for their user's quota while the user has no room."""
        self._note(f"provision_sweep:{'some' if lifecycle.provision_sweep(self.fleet) else 'none'}")

    @precondition(lambda self: self.seen["provision"] > 0)
    @rule(n=st.integers(1, 3))
    def provision_batch(self, n: int) -> None:
        """A provision batch: a claim in the order of service, each request provisioned
        (ready VMs first, then clones within the limit; the gate once at it)."""
        claim = self.work.claim("provision_request", n, 600)
        expected = self.order.claim(n)
        if claim.subjects != expected:
            self.problems.append(f"claimed {claim.subjects}, the policy picks {expected}")
        owners = {self.order.line_of[r][0] for r in claim.subjects}
        if len(owners) > 1:
            self._note("order:owners_mixed")
        by_arrival = sorted(claim.subjects, key=lambda r: self.order.created[r])
        if claim.subjects != by_arrival:
            self._note("order:not_by_arrival")  # a priority or fair share, not arrival alone
        gate = CloneGate()
        for rid in claim.subjects:
            lifecycle.provision_request(self.fleet, rid, gate=gate)
        self.work.done("provision_request", claim, claim.subjects)
        if gate.over_quota:
            self._note("provision:quota_parked")
        self._note(f"provision:{'gate_closed' if gate.closed else 'claimed'}" if claim.subjects
                   else "provision:empty")  # fmt: skip

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 9))
    def delete_request(self, index: int) -> None:
        rid = self._pick(self.live, index)
        if rid is not None:
            self.live.remove(rid)
            self._note(f"delete:{self.fleet.store.delete_request(rid, actor='api').code}")

    # -- warm pools ---------------------------------------------------------------------
    @precondition(lambda self: self.seen["create"] > 0)
    @rule()
    def create_batch(self) -> None:
        """A create batch job (the real one: claim, locks in one script, clone slots,
        a keeper renewing the claim) runs what is waiting."""
        for code, n in lifecycle.create_vm_batch(self.fleet).items():
            self.outcomes[f"create_batch:{code}"] += n

    @precondition(lambda self: self.seen["warm_short"])
    @rule()
    def top_up(self) -> None:
        made = lifecycle.top_up_pools(self.fleet)
        self._note("top_up:reserved" if made else "top_up:none")

    @precondition(lambda self: self.seen["reserved"] or self.seen["pending"])
    @rule(index=st.integers(0, 9))
    def vm_fails(self, index: int) -> None:
        """A reserved or booting VM fails (its create or boot), under its lock."""
        name = self._pick(self._vms("reserved") + self._vms("pending"), index)
        if name is None:
            return
        lock = self.fleet.lock("vm", name, "check_pending")
        if not lock.acquire():
            self._note("fail:busy")
            return
        try:
            out = self.fleet.store.vm_failed(name, "boot failed", actor=ACTOR, fence=lock.fence)
        finally:
            lock.release()
        vm = self.fleet.store.get_vm(name)
        self._note(
            f"fail:{'warm' if vm is not None and not vm.request_id else 'request'}:{out.code}"
        )

    @precondition(lambda self: self.seen["completed"])
    @rule(index=st.integers(0, 9))
    def destroy(self, index: int) -> None:
        name = self._pick(self._vms("completed"), index)
        if name is not None:
            self._note(f"destroy:{lifecycle.destroy_vm(self.fleet, name)}")

    # -- after every step -----------------------------------------------------------------
    @invariant()
    def invariants_hold(self) -> None:
        problems = list(self.problems)
        found = audit_state(self.fleet.store, self.fleet.providers, sweep_interval_s=3600,
                            quota_of=self.fleet.config.quotas.limits)  # fmt: skip
        problems += [v.line() for v in found]
        problems += self.positions.look(self.fleet.store, self.order, self._line())
        reserved = self._vms("reserved")
        pipe = self.client.pipeline(transaction=False)
        for name in reserved:
            pipe.zscore(self.keys.work_set("create_vm"), name)
        for name, score in zip(reserved, pipe.execute(), strict=True):
            if score is None:
                problems.append(f"reserved VM {name} is in no work set")
        stats = self.fleet.slots.stats()
        if stats.live > CLONE_LIMIT or stats.peak > CLONE_LIMIT or stats.overruns:
            problems.append(f"clone limit {CLONE_LIMIT} exceeded: {stats}")
        assert not problems, "invariants broken:\n" + "\n".join(problems)
        self._look()


class WarmFleetMachine(FleetMachine):
    """The fleet with the warm pools' and the listing sweep's actors: checks one VM at a
    time and by list (a list may be stale when it is acted on), checkouts, give-backs,
    VMs vanishing at the provider, check_ready (and its recycle split from its read)."""

    listings = Bundle("listings")
    ready_checks = Bundle("ready_checks")

    # -- warm pools ---------------------------------------------------------------------
    @precondition(lambda self: self.seen["pending"])
    @rule(index=st.integers(0, 9))
    def pending_check(self, index: int) -> None:
        """check_pending_vm of one booting VM (the per-VM job)."""
        name = self._pick(self._vms("pending"), index)
        if name is not None:
            self._note(f"check:{lifecycle.check_pending_vm(self.fleet, name)}")

    @precondition(lambda self: self.seen["ready"])
    @rule(n=st.integers(1, 2), user=st.sampled_from(["ann", "bob"]))
    def checkout(self, n: int, user: str) -> None:
        out = self.fleet.store.pools.checkout({"debian": n}, owner=user, owner_hash="",
                                        lifetime_s=600, actor="api",
                                        quota=QuotaLimits(QUOTA[user]))  # fmt: skip
        self._note(f"checkout:{out.code}")

    @precondition(lambda self: self.seen["running"])
    @rule(index=st.integers(0, 9))
    def give_back(self, index: int) -> None:
        name = self._pick(self._vms("running"), index)
        if name is not None:
            self._note(f"give_back:{self.fleet.store.pools.give_back(name, actor='api').code}")

    @precondition(lambda self: self.seen["pending"] or self.seen["ready"])
    @rule(index=st.integers(0, 9))
    def provider_loses(self, index: int) -> None:
        """A booting or ready VM vanishes at the provider, behind vmpool's back."""
        name = self._pick(self._vms("pending") + self._vms("ready"), index)
        if name is not None:
            vm = self.fleet.store.get_vm(name)
            assert vm is not None
            self.sim.destroy_vm(vm.pool, name)
            self._note("provider:lost")

    @precondition(lambda self: self.seen["ready"])
    @rule()
    def check_ready(self) -> None:
        recycled = lifecycle.check_ready(self.fleet)
        for reason, n in recycled.items():
            self.outcomes[f"check_ready:{reason}"] += n
        if not recycled:
            self._note("check_ready:kept")

    @precondition(lambda self: self.seen["ready"])
    @rule(target=ready_checks, index=st.integers(0, 9))
    def recycle_read(self, index: int) -> Any:
        """check_ready reads a ready VM and finds it must go..."""
        name = self._pick(self._vms("ready", ("debian",)), index)
        return multiple() if name is None else ReadyCheck(name)

    @rule(check=consumes(ready_checks))
    def recycle_commit(self, check: ReadyCheck) -> None:
        """...and recycles it later: refused if a checkout or a claim took it between."""
        out = self.fleet.store.pools.recycle_vm(check.name, "failed its check", actor=ACTOR)
        self._note(f"recycle:{out.code}")

    # -- the listing pending sweep, acting on a stale list --------------------------------
    @precondition(lambda self: self.seen["pending"])
    @rule(target=listings)
    def listing_read(self) -> Any:
        listing = list_pending(self.fleet, list(POOLS))
        return listing if listing.answers else multiple()

    @rule(listing=consumes(listings))
    def listing_commit(self, listing: Listing) -> None:
        _, outcomes = apply_listing(self.fleet, listing)
        for code in outcomes.values():
            self._note(f"listing:{code}")


class ClaimFleetMachine(FleetMachine):
    """The fleet with the batch claimers (which may stop past their claim's lease and
    run it late) and creates stopped inside their provider call past their lock and
    clone slot (and taken over by another)."""

    create_claims = Bundle("create_claims")
    creators = Bundle("creators")

    # -- batch claims of creates, and their dead claimers ---------------------------------
    @precondition(lambda self: self.seen["create"] > 0)
    @rule(target=create_claims, n=st.integers(1, 3))
    def create_claim(self, n: int) -> Any:
        claim = self.work.claim("create_vm", n, 600)
        return claim if claim.subjects else multiple()

    @rule(claim=consumes(create_claims))
    def create_claim_runs(self, claim: Claim) -> None:
        """A create batch runs its claim (it may be late: its lease over, the subjects
        another claim's); a deferred outcome keeps the subject in the set."""
        held = set(self._held_by(claim))
        done, later = [], []
        for name in claim.subjects:
            out = lifecycle.create_vm(self.fleet, name)
            self._note(f"create:{out}")
            (later if out in DEFERRED else done).append(name)
        ended = self.work.done("create_vm", claim, done)
        ended += self.work.defer("create_vm", claim, later, retry_s(self.fleet))
        if ended != len(held):
            self.problems.append(f"claim {claim.id} ended {ended} subjects, held {len(held)}")
        if len(held) < len(claim.subjects):
            self._note("claim:late_end_refused")

    @rule(target=create_claims, claim=consumes(create_claims))
    def claim_lease_ends(self, claim: Claim) -> Claim:
        """The batch job's worker stops (or dies) past its claim's lease: the subjects
        go back in line; a stopped one may still run its claim late (its end of the
        claim must then change nothing another claim holds)."""
        held = self._held_by(claim)
        if held:
            self.client.zadd(self.keys.work_part("create_vm", "claims"), dict.fromkeys(held, 1))
        self._note("claim:lease_ended")
        return claim

    @precondition(lambda self: self.seen["deferred"] > 0)
    @rule()
    def deferrals_end(self) -> None:
        """Time passes: deferred subjects are due back in line (the next claim)."""
        claims = self.keys.work_part("create_vm", "claims")
        owned = set(self.client.hkeys(self.keys.work_part("create_vm", "claimed")))
        due = [s for s in self.client.zrange(claims, 0, -1) if s not in owned]
        if due:
            self.client.zadd(claims, dict.fromkeys(due, 1))
            self._note("claim:deferral_over")

    def _held_by(self, claim: Claim) -> list[str]:
        key = self.keys.work_part("create_vm", "claimed")
        return [s for s in claim.subjects if self.client.hget(key, s) == claim.id]

    # -- creators stopped in their provider call; the clone semaphore ----------------------
    @precondition(lambda self: self.seen["reserved"])
    @rule(target=creators, index=st.integers(0, 9))
    def creator_starts(self, index: int) -> Any:
        """A create_vm (the per-VM job) is stopped inside its provider call."""
        name = self._pick(self._vms("reserved"), index)
        creator = self._start_creator(name) if name is not None else None
        return creator if creator is not None else multiple()

    def _start_creator(self, name: str) -> Creator | None:
        stopped = _StoppedProvider(self.sim)  # type: ignore[arg-type]
        fleet = copy.copy(self.fleet)
        fleet.providers = {SIM: stopped}
        result: dict[str, str] = {}
        thread = threading.Thread(
            target=lambda: result.update(out=lifecycle.create_vm(fleet, name)), daemon=True
        )
        thread.start()
        wait_until(lambda: stopped.inside.is_set() or not thread.is_alive(), 10)
        if not stopped.inside.is_set():
            thread.join(10)
            self._note(f"creator:{result.get('out')}")
            return None
        fence = int(self.client.get(self.keys.vm_fence(name)) or 0)
        creator = Creator(name, fence, thread, stopped.go, result)
        self.threads.append(creator)
        return creator

    @rule(target=creators, creator=consumes(creators), past_lease=st.booleans())
    def creator_paused(self, creator: Creator, past_lease: bool) -> Creator:
        """Its process stays stopped past its VM lock, and maybe past its clone slot's
        lease too (twice the lock's)."""
        self._pause(creator, past_lease)
        return creator

    def _pause(self, creator: Creator, past_lease: bool) -> None:
        lock_key = self.keys.lock("vm", creator.name)
        self.client.pexpire(lock_key, 1)
        wait_until(lambda: not self.client.exists(lock_key), 5)
        holder = self.client.hget(self.keys.clone_slot_holders, creator.name)
        if past_lease and holder == str(creator.fence):
            self.client.zadd(self.keys.clone_slots, {creator.name: 1}, xx=True)
        creator.stale = True
        self._note(f"creator:paused{':past_lease' if past_lease else ''}")

    @rule(target=creators, creator=consumes(creators), past_lease=st.booleans())
    def creator_taken_over(self, creator: Creator, past_lease: bool) -> Any:
        """It stays stopped past its lock (and maybe its lease), and another create of
        the same VM takes it over (and is stopped in its provider call too)."""
        if not creator.stale:
            self._pause(creator, past_lease)
        again = self._start_creator(creator.name)
        self._note("creator:took_over" if again is not None else "creator:no_takeover")
        return multiple(creator, again) if again is not None else creator

    @rule(creator=consumes(creators))
    def creator_wakes(self, creator: Creator) -> None:
        """It wakes and finishes its create; its slot release must drop no lease held by
        a newer holder of the VM."""
        before = self._leases()
        creator.go.set()
        creator.thread.join(30)
        self.threads.remove(creator)
        self._note(f"creator:{'stale:' if creator.stale else ''}{creator.result.get('out')}")
        after = self._leases()
        for name, token in before.items():
            if name == creator.name and token != str(creator.fence) and after.get(name) != token:
                self.problems.append(f"stale creator {creator.fence} dropped {name}'s slot {token}")
            elif name == creator.name and token != str(creator.fence):
                self._note("creator:kept_newer_slot")

    def _leases(self) -> dict[str, str]:
        live = set(self.client.zrangebyscore(self.keys.clone_slots, f"({self._now()}", "+inf"))
        holders = self.client.hgetall(self.keys.clone_slot_holders)
        return {name: holders.get(name, "") for name in live}

    def _now(self) -> float:
        return self.fleet.store.server_time()

    def teardown(self) -> None:
        for creator in self.threads:  # an example that ends with a stopped creator
            creator.go.set()
            creator.thread.join(30)


def fleet_machine(url: str, kind: str) -> type[FleetMachine]:
    """A fresh machine class ('warm' or 'claims') for ``url``, with its own outcomes."""
    base = WarmFleetMachine if kind == "warm" else ClaimFleetMachine
    return type(base.__name__, (base,), {"url": url, "outcomes": Counter()})


def close(cls: type[FleetMachine]) -> None:
    if cls.client is not None:
        cls.client.close()


__all__ = [
    "ClaimFleetMachine",
    "FleetMachine",
    "OrderModel",
    "WarmFleetMachine",
    "close",
    "fleet_machine",
]

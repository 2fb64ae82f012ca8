"""Fair and predictable service, end to end: quotas per user, priorities that age, the
queue position, over real processes (two `vmpool api`, three `vmpool worker`, one
`vmpool scheduler`) against one Redis and the simulated provider, the clients speaking
HTTP as vmfloaty does.

Proves the acceptance of quotas and priorities:

- a user with ``max_vms: 2`` posting 6 one-VM requests at once (through both APIs)
  gets exactly 2 ready and 4 pending, none failed, at positions 1-4; each DELETE of a
  ready one lets exactly one more become ready; at no poll more than 2 ready nor more
  than 2 VMs counted for the user; another user is served meanwhile; the positions of
  the waiting requests never rise, and one above 0 is read only before the request
  started; the audit is clean, with the user's peak 2 from the trails;
- a checkout over quota answers 403 with vmpooler's shape naming the quota, and hands
  out nothing;
- at clone limit 1: 6 requests at priority 3, then 2 at priority 1: both priority-1
  requests are ready before any priority-3 request that had not started when they
  arrived; between two polls a waiting request's position rises by no more than the
  higher-priority requests posted meanwhile, and a position above 0 is read only
  before the request started (from its first VM reserved it reads 0 until ready);
- with aging, every priority-3 request is ready before its TTL while priority-1
  requests keep arriving above the fleet's capacity; without it (aging a day) they
  starve and fail at their TTL: the test can fail.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from vmpool.config import load_config
from vmpool.providers import providers_from_config
from vmpool.state.audit import audit_state
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from vmpool.state.tokens import TokenStore, hash_password

from fleethelp import Client, ProcessFleet, wait_for

pytestmark = pytest.mark.slow

CONFIG = """
:providers:
  :simulated: {{boot_seconds: 1, create_latency_seconds: {create}, seed: 3}}
:auth:
  provider: static
  users: {{alice: "{hash}", bob: "{hash}", nightly: "{hash}", {ci_users}}}
:quotas:
  priority_aging: {aging}
  default: {{priority: {priority}}}
  users:
    alice: {{max_vms: 2, priority: 2}}
{ci_quotas}
:config:
  ondemand_request_ttl: {ttl}
  ondemand_clone_limit: {clone_limit}
  max_vm_retries: 1
  lock_expire: 5
:schedule:
  provision_sweep: 0.5
  sweep_expired: 1
  check_pending_sweep: 0.25
  destroy_sweep: 1
  reap_running: 5
  reconcile: 30
  top_up_pools: 1
:pools:
  - {{name: deb, template: deb, size: 0, provider: simulated}}
  - {{name: warm, template: warm, size: 3, provider: simulated}}
"""


# The release-gating users: their requests take priority 1 unless they say otherwise.
CI = [f"ci{i}" for i in range(6)]


def _fleet(tmp: Path, redis_url: str, **values: Any) -> ProcessFleet:
    settings = {"create": 0, "aging": 300, "ttl": 2, "clone_limit": 20, "priority": 2, **values}
    path = tmp / "vmpool.yaml"
    secret = hash_password("pw", iterations=1000)
    ci_users = ", ".join(f'{user}: "{secret}"' for user in CI)
    ci_quotas = "".join(f"    {user}: {{priority: 1}}\n" for user in CI)
    path.write_text(CONFIG.format(hash=secret, ci_users=ci_users, ci_quotas=ci_quotas, **settings))
    fleet = ProcessFleet(tmp, redis_url, path)
    fleet.api("api0")
    fleet.api("api1")
    for i in range(3):
        fleet.worker(f"w{i}")
    fleet.scheduler("s0")
    return fleet


@pytest.fixture
def run(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[Any]:
    started: list[ProcessFleet] = []

    def start(**values: Any) -> tuple[ProcessFleet, Store]:
        fleet = _fleet(tmp_path, redis_url, **values)
        started.append(fleet)
        return fleet, Store(redis_client, Keys("vmpool"))

    try:
        yield start
    finally:
        for fleet in started:
            fleet.stop()


def _client(store: Store, fleet: ProcessFleet, user: str) -> Client:
    return Client(fleet, TokenStore(store.redis, store.keys).create(user))


def _read_waiting_before_start(store: Store, rid: str, sent: float) -> None:
    """A read of ``rid`` sent at ``sent`` said it waits (a position above 0): it came
    before the request started (its first VM reserved or claimed, in the unit that makes
    its position 0 until ready). Exact however slow the polls are: a poll slower than a
    create and a boot never sees that 0, so "the last read before ready said 0" would
    sample, not check."""
    started = _field(store, rid, "started")
    assert started >= sent, f"{rid} read as waiting at {sent}, after it started at {started}"


def _ready(states: dict[str, dict[str, Any]]) -> list[str]:
    return [rid for rid, body in states.items() if body.get("ready") is True]


def _pending(states: dict[str, dict[str, Any]]) -> list[str]:
    return [
        rid for rid, body in states.items() if body.get("ready") is False and "position" in body
    ]


class Watch:
    """Polls alice's live requests and her count; every poll is checked: at most 2 ready,
    at most 2 VMs counted for her, none failed, no waiting position ever rising, a
    position above 0 read only before the request started."""

    def __init__(self, client: Client, store: Store, rids: list[str]) -> None:
        self.client, self.store, self.live = client, store, list(rids)
        self.positions: dict[str, int] = {}
        self.waiting_reads: dict[str, float] = {}  # rid -> when its last "waits" read was sent
        self.polls = 0

    def poll(self) -> dict[str, dict[str, Any]]:
        states, sent = {}, {}
        for rid in self.live:
            sent[rid] = time.time()
            states[rid] = self.client.get(rid)
        self.polls += 1
        assert len(_ready(states)) <= 2, states
        held = self.store.quotas.held().get("alice")
        assert held is None or held.vms <= 2, held
        for rid, body in states.items():
            assert "message" not in body, body  # none failed (nor deleted: not watched)
            if "position" in body:
                assert body["position"] <= self.positions.get(rid, body["position"]), (rid, body)
                self.positions[rid] = body["position"]
                if body["position"] > 0:
                    self.waiting_reads[rid] = sent[rid]
            elif body.get("ready") is True and rid in self.waiting_reads:
                _read_waiting_before_start(self.store, rid, self.waiting_reads.pop(rid))
        return states

    def until(self, what: str, pred: Any, timeout: float = 60) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}

        def check() -> bool:
            found.update(self.poll())
            return bool(pred(found))

        wait_for(check, timeout, what, step=0.05)
        return found


def test_a_user_with_max_vms_2_gets_exactly_2_and_one_more_per_delete(run: Any) -> None:
    fleet, store = run()
    alice, bob = _client(store, fleet, "alice"), _client(store, fleet, "bob")
    rids: list[str] = []
    lock = threading.Lock()

    def post() -> None:
        rid = alice.request("deb")
        with lock:
            rids.append(rid)

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(rids) == 6
    rids.sort(key=lambda rid: float(store.redis.hget(store.keys.request(rid), "created") or 0))
    bobs = [bob.request("deb") for _ in range(2)]
    watch = Watch(alice, store, rids)

    def two_ready_four_waiting(states: dict[str, dict[str, Any]]) -> bool:
        waiting = sorted(states[r]["position"] for r in _pending(states) if r in states)
        return len(_ready(states)) == 2 and waiting == [1, 2, 3, 4]

    states = watch.until("2 ready and 4 waiting at positions 1-4", two_ready_four_waiting)
    assert all(states[r]["eta_s"] is None for r in _pending(states))  # waits for her quota
    wait_for(lambda: all(bob.get(r)["ready"] for r in bobs), 30, "bob's requests")
    for _ in range(4):
        ready = _ready(watch.poll())
        gone = ready[0]
        alice.delete(gone)
        watch.live.remove(gone)
        before = len(_pending(watch.poll()))
        watch.until("exactly one more ready", lambda s, n=before: len(_ready(s)) == 2
                    and len(_pending(s)) == n - 1)  # fmt: skip
    assert watch.polls > 20
    wait_for(lambda: not store.quotas.parked(), 10, "nothing parked")
    fleet.alive()
    config = load_config(fleet.config_path)
    problems = audit_state(store, providers_from_config(store.redis, store.keys, config),
                           sweep_interval_s=30, quota_of=config.quotas.limits)  # fmt: skip
    assert not problems, [p.line() for p in problems]
    held = store.quotas.held()["alice"]
    assert held.peak_vms == 2
    assert store.quotas.waits()["alice"] == 4


def test_a_checkout_over_quota_is_refused_naming_the_quota(run: Any) -> None:
    fleet, store = run()
    alice = _client(store, fleet, "alice")
    wait_for(lambda: len(store.pool_vms("warm", "ready")) == 3, 60, "the warm pool")
    for _ in range(2):
        assert alice.checkout("warm").status_code == 200
    ready_before = set(store.pool_vms("warm", "ready"))
    reply = alice.checkout("warm")
    assert reply.status_code == 403
    body = reply.json()
    assert body["ok"] is False and "max_vms 2" in body["message"], body
    assert ready_before <= set(store.pool_vms("warm", "ready"))  # nothing handed out
    assert store.quotas.held()["alice"].vms == 2


class Positions:
    """Reads every watched request at each poll, all from the one thread that also posts
    (so the requests that arrived between two polls are known exactly). Checks: a
    pending request's position never rises between two polls by more than the requests
    of a higher priority posted meanwhile; a position above 0 is read only before the
    request started; none fails."""

    def __init__(self, client: Client, store: Store) -> None:
        self.client, self.store = client, store
        self.priority: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.arrived: list[int] = []  # priorities posted since the previous poll
        self.ready: set[str] = set()
        self.waiting_reads: dict[str, float] = {}  # rid -> when its last "waits" read was sent
        self.rises = 0

    def post(self, client: Client, priority: int, own_default: bool = False) -> str:
        rid = client.request("deb", priority=None if own_default else priority)
        self.priority[rid] = priority
        self.arrived.append(priority)
        return rid

    def poll(self) -> bool:
        """One read of each request not yet ready; whether all are ready."""
        for rid, priority in self.priority.items():
            if rid in self.ready:
                continue
            sent = time.time()
            body = self.client.get(rid)
            assert "message" not in body, body
            if body["ready"] is True:
                if rid in self.waiting_reads:
                    _read_waiting_before_start(self.store, rid, self.waiting_reads.pop(rid))
                self.ready.add(rid)
                continue
            before, now = self.last.get(rid), body["position"]
            if now > 0:
                self.waiting_reads[rid] = sent
            if before is not None:
                ahead = sum(1 for p in self.arrived if p < priority)
                assert now <= before + ahead, (rid, before, now, self.arrived)
                self.rises += now > before
            self.last[rid] = now
        self.arrived = []
        return len(self.ready) == len(self.priority)


def test_priority_1_requests_overtake_priority_3_ones_at_the_clone_limit(run: Any) -> None:
    """Also the honesty of positions over real processes: the priority-3 requests'
    positions rise only by the priority-1 requests posted between two polls (they do
    rise: the test sees it), never otherwise, and a request reads a position above 0
    only before it started."""
    fleet, store = run(clone_limit=1, create=0.5)
    nightly, ci = _client(store, fleet, "nightly"), _client(store, fleet, CI[0])
    line = Positions(nightly, store)
    low = [line.post(nightly, 3) for _ in range(6)]
    line.poll()
    high = []
    # The workers stopped while the priority-1 ones arrive: no request starts between
    # these polls, so the rise they cause is seen however slow the machine is.
    with fleet.paused("w0", "w1", "w2"):
        line.poll()
        for _ in range(2):
            high.append(line.post(ci, 1, own_default=True))  # ci's own priority: 1
            line.poll()
    arrived = {rid: _field(store, rid, "created") for rid in high}
    everything = [*low, *high]
    wait_for(line.poll, 90, "all ready", step=0.05)
    assert line.rises >= 1, "no priority-1 arrival was seen moving a priority-3 request back"
    ready_at = {rid: _field(store, rid, "status_since") for rid in everything}
    started = {rid: _field(store, rid, "started") for rid in low}
    for h in high:
        overtaken = [r for r in low if started[r] > arrived[h]]
        assert overtaken, "every priority-3 request started before the priority-1 ones arrived"
        assert all(ready_at[h] < ready_at[r] for r in overtaken), (h, ready_at, started)


def _field(store: Store, rid: str, name: str) -> float:
    return float(store.redis.hget(store.keys.request(rid), name) or 0)


@pytest.mark.parametrize("aging, starves", [(1, False), (86400, True)])
def test_aging_serves_priority_3_within_its_ttl_while_priority_1_keeps_arriving(
    run: Any, aging: int, starves: bool
) -> None:
    """The fleet serves at most one request a second (clone limit 1, a create of 1 s);
    priority-1 requests (every user's default here) arrive at 2 per second for the whole
    TTL (30 s), each from a user of its own (one user's waiting requests would stand a
    round apart: fair share, not aging, would let priority 3 in)."""
    fleet, store = run(clone_limit=1, create=1, aging=aging, ttl=0.5, priority=1)
    nightly = _client(store, fleet, "nightly")
    stop = threading.Event()
    high: list[str] = []

    def keep_arriving() -> None:
        while not stop.is_set():
            high.append(_client(store, fleet, f"user{len(high)}").request("deb"))
            stop.wait(0.5)

    feeder = threading.Thread(target=keep_arriving)
    feeder.start()
    try:
        wait_for(lambda: len(high) >= 3, 10, "a priority-1 backlog")
        low = [nightly.request("deb", priority=3) for _ in range(3)]
        wait_for(lambda: all(_settled(nightly.get(r)) for r in low), 60, "the priority-3 ones")
    finally:
        stop.set()
        feeder.join(timeout=30)
    outcomes = [nightly.get(r)["ready"] for r in low]
    if starves:
        assert not any(outcomes), "without aging, priority 3 starved behind priority 1"
    else:
        assert all(outcomes), outcomes


def _settled(body: dict[str, Any]) -> bool:
    return body["ready"] is True or "message" in body

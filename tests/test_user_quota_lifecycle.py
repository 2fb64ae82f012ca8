"""Quotas and priorities through the real jobs (provision, create, check, sweeps) in one
process, with the simulated provider.

Proves: a user over quota waits (pending, parked, never failed), the provision sweep
passes the parked requests by, and each VM the user frees lets exactly one more request
be served, the oldest first, with honest positions (1..n, shrinking) and no ETA while
parked; another user is served meanwhile; a POST-like priority places a request ahead
at the clone limit; a parked request whose user's quota was raised in the config is
offered again by the sweep; the counts and the per-user peak never pass the quota.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import redis

from vmpool import lifecycle
from vmpool.config import Config
from vmpool.config.quota_settings import QuotasSection, build_quotas
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.transitions import RequestStatus
from vmpool.state.workset import WorkSet
from workers.batching import BatchDispatcher

from lifecyclehelp import clean, make_config, make_fleet, recorder, run_dispatched


def _with_quotas(config: Config, quotas: dict[str, Any]) -> Config:
    section = QuotasSection.model_validate(quotas)
    return dataclasses.replace(config, quotas=build_quotas(section, lower_case_users=False))


def _post(fleet: Fleet, rid: str, user: str, priority: int = 2) -> None:
    settings = RequestSettings.from_config(fleet.config, authenticated=True, priority=priority)
    out = fleet.store.create_request(
        rid, [Slot("deb", "debian", 1)], settings, actor="api", token_user=user,
        clone_limit=fleet.config.ondemand_clone_limit,
    )  # fmt: skip
    assert out.ok, out


def _status(fleet: Fleet, rid: str) -> RequestStatus:
    req = fleet.store.get_request(rid)
    assert req is not None
    return req.status


def _serve(fleet: Fleet, rids: list[str]) -> None:
    """One round: provision ``rids``, then run what that dispatched (creates, checks),
    but not the provisions a freed clone slot dispatches for the line's head: the test
    plays the rounds that hand the slot on itself."""
    for rid in rids:
        lifecycle.provision_request(fleet, rid)
    for _ in range(200):
        calls = [c for c in recorder(fleet).take() if c[0] != Job.PROVISION_REQUEST]
        if not calls:
            return
        for job, subject in calls:
            getattr(lifecycle, job)(fleet, subject)
    raise AssertionError("dispatch did not settle")


def test_a_user_over_quota_waits_and_each_vm_freed_serves_the_next_oldest(
    redis_client: redis.Redis,
) -> None:
    config = _with_quotas(make_config(), {"users": {"alice": {"max_vms": 2}}})
    fleet = make_fleet(redis_client, config)
    alice = [f"alice-{i}" for i in range(6)]
    for rid in alice:
        _post(fleet, rid, "alice")
    _post(fleet, "bob-0", "bob")
    _serve(fleet, [*alice, "bob-0"])
    statuses = [_status(fleet, rid) for rid in alice]
    assert statuses == ["ready"] * 2 + ["pending"] * 4, statuses
    assert _status(fleet, "bob-0") == "ready"  # another user, served meanwhile
    assert set(fleet.store.quotas.parked()) == set(alice[2:])
    places = [fleet.store.quotas.place(rid, config.ondemand_clone_limit) for rid in alice[2:]]
    assert [(p.position, p.eta_s) for p in places if p] == [(i, None) for i in (1, 2, 3, 4)]
    lifecycle.provision_sweep(fleet)
    assert recorder(fleet).take() == []  # the sweep passes the parked requests by
    for freed in alice[:4]:
        assert fleet.store.delete_request(freed, actor="api").ok
        lifecycle.provision_sweep(fleet)
        run_dispatched(fleet)
        statuses = [_status(fleet, rid) for rid in alice]
        assert statuses.count("ready") == 2, statuses  # exactly one more each time
    assert statuses == ["deleted"] * 4 + ["ready"] * 2
    held = fleet.store.quotas.held()["alice"]
    assert (held.vms, held.peak_vms) == (2, 2)
    assert fleet.store.quotas.waits() == {"alice": 4}
    clean(fleet)


def test_a_quota_raised_in_the_config_serves_the_parked_requests(
    redis_client: redis.Redis,
) -> None:
    """A parked request is unparked by a VM its user frees; with none freed, the sweep of
    a process whose config gives the user more room offers it again."""
    fleet = make_fleet(redis_client, _with_quotas(make_config(), {"default": {"max_vms": 1}}))
    for rid in ("c-0", "c-1"):
        _post(fleet, rid, "carol")
    _serve(fleet, ["c-0", "c-1"])
    assert fleet.store.quotas.parked() == {"c-1": "carol"}
    fleet.config = _with_quotas(make_config(), {"default": {"max_vms": 2}})
    lifecycle.provision_sweep(fleet)
    assert [subject for _, subject in recorder(fleet).calls] == ["c-1"]
    run_dispatched(fleet)
    assert _status(fleet, "c-1") == "ready"


def test_a_higher_priority_request_is_served_first_at_the_clone_limit(
    redis_client: redis.Redis,
) -> None:
    """Clone limit 1, one request served per round: six requests of priority 3, then two
    of priority 1 (another user's): the priority-1 requests are served next, and their
    arrival moved each waiting priority-3 request's position back by exactly one."""
    config = make_config(ondemand_clone_limit=1)
    fleet = make_fleet(redis_client, config)
    low = [f"low-{i}" for i in range(6)]
    for rid in low:
        _post(fleet, rid, "batch", priority=3)
    _serve(fleet, low)  # one reserved (the clone limit), its create frees the slot
    served = {rid for rid in low if _status(fleet, rid) == "ready"}
    assert served == {"low-0"}
    before = {rid: fleet.store.quotas.place(rid, 1) for rid in low[1:]}
    for rid in ("high-0", "high-1"):
        _post(fleet, rid, "release", priority=1)
    after = {rid: fleet.store.quotas.place(rid, 1) for rid in low[1:]}
    for rid in low[1:]:
        b, a = before[rid], after[rid]
        assert b is not None and a is not None
        assert a.position == b.position + 2, (rid, b, a)
    order = []
    for _ in range(7):
        lifecycle.provision_sweep(fleet)
        calls = recorder(fleet).take()
        assert all(job == Job.PROVISION_REQUEST for job, _ in calls)
        waiting = [subject for _, subject in calls]
        _serve(fleet, waiting[:1])  # the first the sweep offers takes the one slot
        order.append(waiting[0])
    assert order[:2] == ["high-0", "high-1"], order
    assert order[2:] == low[1:], order


def test_the_work_set_serves_requests_in_the_order_of_their_places(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """The provision work set's claims (what a batch job serves, in order) follow the
    places: arrival less the priority's lead, a round (the aging period) behind the
    user's previous waiting request of that priority. Three of Ann's priority-3 requests,
    then two of Bob's and one of Cy's at priority 2, then Dee's at 1: Dee; Bob's first
    and Cy's; Ann's first (priority 3) before Bob's second (which stands a round behind
    his first: a level down, and it arrived later); then Ann's others, a round apart."""
    fleet = make_fleet(redis_client, make_config())
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys, fleet.config)
    work = fleet.keys.work_set(Job.PROVISION_REQUEST)
    posts = [("ann-0", "ann", 3), ("ann-1", "ann", 3), ("ann-2", "ann", 3), ("bob-0", "bob", 2),
             ("bob-1", "bob", 2), ("cy-0", "cy", 2), ("dee-0", "dee", 1)]  # fmt: skip
    for rid, user, priority in posts:
        settings = RequestSettings.from_config(fleet.config, priority=priority)
        out = fleet.store.create_request(
            rid, [Slot("deb", "debian", 1)], settings, actor="api", token_user=user, work_set=work
        )
        assert out.ok, out
    claim = WorkSet(fleet.redis, fleet.keys).claim(Job.PROVISION_REQUEST, 10, 30)
    assert claim.subjects == ["dee-0", "bob-0", "cy-0", "ann-0", "bob-1", "ann-1", "ann-2"]

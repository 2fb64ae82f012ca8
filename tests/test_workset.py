"""The work set's order of service and the ends of a claim (vmpool/state/workset.py).

Proves: subjects are claimed in order of arrival, not of name; owners are served
round-robin (an owner served goes to the back of the line, even when its subject comes
back unserved); a deferred subject stays in the set (a re-add does not duplicate or
move it) and is back in line, at its arrival, after the delay; a renewed claim keeps its
subjects past the original lease; only the claim that holds a subject can end it;
``lapsed`` finds a set with subjects due back in line; ``clear`` leaves no key.
"""

from __future__ import annotations

import redis

from vmpool.state.keys import Keys
from vmpool.state.workset import WorkSet


def _age_claims(client: redis.Redis, keys: Keys, job: str, *subjects: str) -> None:
    """End the leases of ``subjects`` now (rather than wait for them)."""
    client.zadd(keys.work_part(job, "claims"), dict.fromkeys(subjects, 1), xx=True)


def test_vms_are_claimed_in_order_of_arrival_not_name(
    redis_client: redis.Redis, keys: Keys
) -> None:
    work = WorkSet(redis_client, keys)
    for name in ["vm-z", "vm-a", "vm-m"]:
        work.add("create_vm", [name])  # one by one: three arrivals
    assert work.claim("create_vm", 10, lease_s=60).subjects == ["vm-z", "vm-a", "vm-m"]


def test_owners_take_turns_even_across_released_claims(
    redis_client: redis.Redis, keys: Keys
) -> None:
    store_request = redis_client.hset
    job = "provision_request"
    head, tail = keys.request_key_parts()
    for i, (rid, user) in enumerate([("a1", "ann"), ("a2", "ann"), ("a3", "ann"), ("b1", "bob")]):
        store_request(f"{head}{rid}{tail}", mapping={"created": f"{100 + i}", "token_user": user})
    work = WorkSet(redis_client, keys)
    assert work.add(job, ["a3", "b1", "a1", "a2"]) == 4  # their place: `created`, not this order
    first = work.claim(job, 10, lease_s=60)
    # ann's turn is her oldest request's arrival (100), bob's 103; after a1, ann is
    # at the back of the line
    assert first.subjects == ["a1", "b1", "a2", "a3"]
    assert work.release(job, first, first.subjects) == 4  # none could be served
    # ann was served last (a3): bob goes first now, then ann's oldest
    assert work.claim(job, 2, lease_s=60).subjects == ["b1", "a1"]


def test_a_deferred_subject_stays_and_comes_back_at_its_place(
    redis_client: redis.Redis, keys: Keys
) -> None:
    work = WorkSet(redis_client, keys)
    work.add("create_vm", ["vm-1"])
    work.add("create_vm", ["vm-2"])
    claim = work.claim("create_vm", 1, lease_s=60)
    assert claim.subjects == ["vm-1"]
    assert work.defer("create_vm", claim, ["vm-1"], delay_s=60) == 1
    assert work.add("create_vm", ["vm-1"]) == 0  # still in: not added twice
    assert work.done("create_vm", claim, ["vm-1"]) == 0  # no claim holds it any more
    assert work.claim("create_vm", 5, lease_s=60).subjects == ["vm-2"]
    now = float(redis_client.time()[0])
    assert work.lapsed(["create_vm", "check_pending_vm"], now) == {}
    _age_claims(redis_client, keys, "create_vm", "vm-1")
    assert work.lapsed(["create_vm", "check_pending_vm"], now) == {"create_vm": ["vm-1"]}
    back = work.claim("create_vm", 5, lease_s=60)
    assert back.subjects == ["vm-1"]
    assert work.done("create_vm", back, ["vm-1"]) == 1
    assert work.size("create_vm") == 1  # vm-2, still claimed


def test_a_renewed_claim_keeps_its_subjects(redis_client: redis.Redis, keys: Keys) -> None:
    work = WorkSet(redis_client, keys)
    work.add("check_pending_vm", ["vm-1", "vm-2"])
    claim = work.claim("check_pending_vm", 2, lease_s=0.001)
    assert work.renew("check_pending_vm", claim, claim.subjects, lease_s=60) == 2
    assert work.claim("check_pending_vm", 5, lease_s=60).subjects == []
    # a lease that did run out: the subject goes to a new claim; the old one cannot end it
    _age_claims(redis_client, keys, "check_pending_vm", "vm-2")
    newer = work.claim("check_pending_vm", 5, lease_s=60)
    assert newer.subjects == ["vm-2"]
    assert work.renew("check_pending_vm", claim, claim.subjects, lease_s=60) == 1
    assert work.done("check_pending_vm", claim, claim.subjects) == 1  # vm-1 only


def test_clear_drops_every_part(redis_client: redis.Redis, keys: Keys) -> None:
    work = WorkSet(redis_client, keys)
    head, tail = keys.request_key_parts()
    redis_client.hset(f"{head}r1{tail}", mapping={"created": "1", "token_user": "ann"})
    work.add("provision_request", ["r1"])
    redis_client.hset(f"{head}r2{tail}", mapping={"created": "2", "token_user": ""})
    work.add("provision_request", ["r2"])
    work.defer("provision_request", work.claim("provision_request", 1, 60), ["r1"], 60)
    work.clear("provision_request")
    left = [k for k in redis_client.scan_iter(match="*:work:*")]
    assert left == []


def test_a_subject_an_older_release_added_is_put_in_line(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: a subject left in the set by an older release (score 0, in no queue) is
    not lost to the new order: dispatched again, it joins the line, and is claimed."""
    redis_client.zadd(keys.work_set("create_vm"), {"vm-old": 0})
    work = WorkSet(redis_client, keys)
    assert work.claim("create_vm", 5, lease_s=60).subjects == []  # in no queue yet
    assert work.add("create_vm", ["vm-old"]) == 1
    assert work.add("create_vm", ["vm-old"]) == 0  # in line now: added once
    assert work.claim("create_vm", 5, lease_s=60).subjects == ["vm-old"]

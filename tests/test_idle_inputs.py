"""A sweep whose inputs are all absent has nothing to do (vmpool/lifecycle/idle.py).

What this proves: the scheduler may skip a run of such a sweep, or park the pending
sweep (workers/schedule_park.py), without leaving work undone. Every index a sweep
could read is filled (each pool's VMs in every state, due at once; the open and
provisioning requests; the claims of every work set, lapsed; a pool size set at
runtime), then one sweep's inputs are deleted and the sweep runs: it dispatches
nothing and changes no key. Red when an input is left out: without the work-set
claims, the pending sweep dispatches the lapsed subjects again.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from vmpool import lifecycle
from vmpool.config import Config
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.lifecycle.idle import sweep_inputs
from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.workset import WorkSet

from lifecyclehelp import make_config, make_fleet, recorder, warm_config
from storehelp import snapshot

SWEEPS: dict[Job, Callable[[Fleet], object]] = {
    Job.SWEEP_EXPIRED: lifecycle.sweep_expired,
    Job.PROVISION_SWEEP: lifecycle.provision_sweep,
    Job.CHECK_PENDING_SWEEP: lifecycle.check_pending_sweep,
    Job.DESTROY_SWEEP: lifecycle.destroy_sweep,
    Job.CHECK_READY: lifecycle.check_ready,
    Job.TOP_UP_POOLS: lifecycle.top_up_pools,
}


def _fill_every_index(client: redis.Redis, keys: Keys, config: Config) -> None:
    """One entry, due long ago, in every index a sweep reads."""
    for n, pool in enumerate(config.pools):
        for state in INDEXED_VM_STATES:
            client.zadd(keys.pool_state(pool, state), {f"vm-{state.replace('_', '-')}-{n}": 1.0})
    client.zadd(keys.open_requests, {"r-open": 1.0})
    client.zadd(keys.provision_queue, {"r-unreserved": 1.0})
    for job in (Job.CREATE_VM, Job.CHECK_PENDING_VM, Job.PROVISION_REQUEST):
        subject = "r-claimed" if job == Job.PROVISION_REQUEST else "vm-claimed-0"
        client.zadd(keys.work_part(job, "claims"), {subject: 1.0})
    client.hset(keys.pool_override("poolsize"), "debian", "2")


def test_every_sweep_has_inputs_but_those_that_always_run() -> None:
    config = make_config()
    assert set(sweep_inputs(config, Keys())) == set(SWEEPS)


def test_top_up_always_runs_while_a_pool_has_a_size() -> None:
    assert Job.TOP_UP_POOLS not in sweep_inputs(warm_config(size=1), Keys())


@pytest.mark.parametrize("job", list(SWEEPS), ids=str)
def test_a_sweep_without_its_inputs_does_nothing(redis_client: redis.Redis, job: Job) -> None:
    config = make_config()
    fleet = make_fleet(redis_client, config)
    _fill_every_index(redis_client, fleet.keys, config)
    redis_client.delete(*sweep_inputs(config, fleet.keys)[job])
    before = snapshot(redis_client)
    SWEEPS[job](fleet)
    assert recorder(fleet).take() == []
    assert snapshot(redis_client) == before


def test_the_check_is_red_without_the_work_set_claims(redis_client: redis.Redis) -> None:
    """The pending sweep's inputs less the claims: the sweep still finds work (the
    lapsed claims), so the claims must be among its inputs."""
    config = make_config()
    fleet = make_fleet(redis_client, config)
    _fill_every_index(redis_client, fleet.keys, config)
    claims = {fleet.keys.work_part(j, "claims") for j in lifecycle.pending.REDISPATCHED}
    inputs = sweep_inputs(config, fleet.keys)[Job.CHECK_PENDING_SWEEP]
    redis_client.delete(*[key for key in inputs if key not in claims])
    assert WorkSet(redis_client, fleet.keys).lapsed(lifecycle.pending.REDISPATCHED, 2.0)
    lifecycle.check_pending_sweep(fleet)
    assert recorder(fleet).take() != []

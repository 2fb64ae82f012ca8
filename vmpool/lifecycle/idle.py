"""What each periodic sweep reads first: when none of it exists, a run finds nothing to do.

The scheduler (workers/schedule.py) checks a sweep's inputs with one ``EXISTS`` before
it queues a run, and queues none when they are all absent: an RQ job costs about sixty
Redis commands (its hash, its registries, the worker's bookkeeping), the check one.
Redis deletes a sorted set or a hash with its last member, so an absent key is an empty
index. A key that exists with nothing due in it (a running VM whose lifetime is not
over) still runs the sweep, which decides.

Each entry mirrors its sweep's reads (tests/test_idle_inputs.py runs every sweep with
its inputs absent and everything else present, and finds it changes nothing):

- ``sweep_expired``: the open-request index (``Store.due_for_expiry``)
- ``provision_sweep``: the requests with unreserved slots (``provision_candidates``)
- ``check_pending_sweep``: every pool's reserved and pending VMs, and the claims of the
  work sets it dispatches again (:data:`vmpool.lifecycle.pending.REDISPATCHED`)
- ``destroy_sweep``: every pool's completed and on-hold VMs
- ``check_ready``: every pool's ready VMs
- ``top_up_pools``: nothing while some pool has a size; with every size 0, the sizes set
  at runtime (a warm pool exists only through one)
- ``reap_running``, ``reconcile``, ``record_history``: none, they always run (the reap
  finds the pools no longer configured with a SCAN, the reconcile asks the providers,
  the history writes a point even of an empty fleet).

The pools are the config's, as the sweeps' own (a worker's config that names a pool the
scheduler's does not is a fleet running two configs, which each process warns of).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vmpool.config import Config
from vmpool.ids import Job
from vmpool.lifecycle.pending import REDISPATCHED
from vmpool.state.keys import Keys
from vmpool.state.transitions import VMState

__all__ = ["sweep_inputs"]


def sweep_inputs(config: Config, keys: Keys) -> Mapping[Job, Sequence[str]]:
    """Per periodic sweep that can find nothing to do, the keys it reads first.

    A sweep not in the mapping always runs.
    """
    pools = list(config.pools)

    def indexes(*states: VMState) -> list[str]:
        return [keys.pool_state(pool, state) for pool in pools for state in states]

    inputs: dict[Job, Sequence[str]] = {
        Job.SWEEP_EXPIRED: [keys.open_requests],
        Job.PROVISION_SWEEP: [keys.provision_queue],
        Job.CHECK_PENDING_SWEEP: [
            *indexes(VMState.RESERVED, VMState.PENDING),
            *(keys.work_part(job, "claims") for job in REDISPATCHED),
            keys.clone_slot_line,  # requests waiting for a clone slot: it hands out turns
        ],
        Job.DESTROY_SWEEP: indexes(VMState.COMPLETED, VMState.ON_HOLD),
        Job.CHECK_READY: indexes(VMState.READY),
    }
    if all(pool.size == 0 for pool in config.pools.values()):
        inputs[Job.TOP_UP_POOLS] = [keys.pool_override("poolsize")]
    return inputs

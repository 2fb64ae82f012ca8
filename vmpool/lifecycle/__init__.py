"""The on-demand lifecycle: what each job does, as plain functions of a :class:`Fleet`.

``workers/`` holds thin RQ entry points. Each calls the function of the same name here
(the job table, :mod:`workers.table`, names them). Every function is idempotent (safe to
run twice, late, or beside a copy of itself). It re-reads the state it acts on, does
provider work only under a fenced lock (:mod:`vmpool.state.locks`), and records the
result through one checked store transition. It treats the store's refusals as the
normal answer of a race it lost (logged, never raised).

- :mod:`~vmpool.lifecycle.fleet`: the Fleet (what a worker process holds) and the
  Dispatcher (how follow-up work is queued)
- :mod:`~vmpool.lifecycle.requests`: provision, check and expire requests
- :mod:`~vmpool.lifecycle.vms`: create, check, reap and destroy VMs
- :mod:`~vmpool.lifecycle.warm`: warm pools: top up, re-check, recycle, lend to requests
- :mod:`~vmpool.lifecycle.overrides`: pool settings changed at runtime, pool resets
- :mod:`~vmpool.lifecycle.vm_tasks`: snapshots, reverts and disks of held VMs
- :mod:`~vmpool.lifecycle.reconcile`: the provider's inventory against the records
- :mod:`~vmpool.lifecycle.plan`: a request's counts as slots of pools (API and CLI).
- :mod:`~vmpool.lifecycle.failures`: failed creates, boots and requests noted for people
  to see; a failing pool's top-ups backed off
- :mod:`~vmpool.lifecycle.history`: each pool's counts, a point a minute (the dashboard).
"""

from vmpool.lifecycle.fleet import Dispatcher, Fleet, RecordingDispatcher
from vmpool.lifecycle.history import record_history
from vmpool.lifecycle.pending import check_pending_sweep, reserved_grace_s
from vmpool.lifecycle.reaping import reap_running
from vmpool.lifecycle.reconcile import reconcile
from vmpool.lifecycle.requests import (
    check_request,
    provision_request,
    provision_sweep,
    sweep_expired,
)
from vmpool.lifecycle.stages import check_pending_batch, create_vm_batch, provision_batch
from vmpool.lifecycle.vm_tasks import vm_task
from vmpool.lifecycle.vms import check_pending_vm, create_vm, destroy_sweep, destroy_vm
from vmpool.lifecycle.warm import check_ready, claim_ready, top_up_pools

__all__ = [
    "Dispatcher",
    "Fleet",
    "RecordingDispatcher",
    "check_pending_batch",
    "check_pending_sweep",
    "check_pending_vm",
    "check_ready",
    "check_request",
    "claim_ready",
    "create_vm",
    "create_vm_batch",
    "destroy_sweep",
    "destroy_vm",
    "provision_batch",
    "provision_request",
    "provision_sweep",
    "reap_running",
    "reconcile",
    "record_history",
    "reserved_grace_s",
    "sweep_expired",
    "top_up_pools",
    "vm_task",
]

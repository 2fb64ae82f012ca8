"""The store's one script registry: every transition script, registered with its preamble.

Each store script is the rendered transition table, metric keys (the quotas' keys among
them) and wake-up keys (:func:`~vmpool.state.transitions.lua_tables`,
:func:`~vmpool.state.counters.lua_metrics`, :func:`lua_wake`), then ``_quota.lua`` and
``_prelude.lua``, then its own helpers (the work-set and line functions for
``create_request``, ``_pool.lua`` for the warm-pool scripts, ``_slots.lua`` for those
that take or give back a VM's clone slot), then its file; of the helpers, only the
definitions its file reaches (:func:`~vmpool.state.lua_deps.prune`). The KEYS
layouts come from :class:`~vmpool.state.keys.Keys` (``request_script_keys``,
``vm_script_keys``). ARGV 1-4 are the same for every script (:meth:`StoreScripts.call`).
A script on one VM takes the layout its record calls for (:meth:`StoreScripts.run_on_vm`).

Every store script is answered once per operation id (:mod:`vmpool.state.ops`): its
body runs inside ``_once.lua``, and each call carries an id, the caller's or one made
for the call, so a retry of a call whose reply was lost changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import redis
from redis.commands.core import Script

from vmpool.ids import validate_vm_name
from vmpool.state.counters import lua_metrics
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, read_script
from vmpool.state.lua_deps import prune
from vmpool.state.ops import Op, new_op, once_text, retry_window_s
from vmpool.state.records import Outcome, text
from vmpool.state.transitions import lua_tables
from vmpool.state.workset import lua_workset

__all__ = [
    "BATCH_OF",
    "POOL_SCRIPTS",
    "POOL_VARIANTS",
    "REQUEST_SCRIPTS",
    "SLOT_SCRIPTS",
    "StoreScripts",
    "as_function",
    "lua_wake",
    "prelude",
]

SCRIPTS_PACKAGE: Final = "vmpool.state.scripts"

# The scripts of a request and the VMs it holds (vmpool.state.store).
REQUEST_SCRIPTS: Final = (
    "create_request",
    "reserve_vm",
    "vm_created",
    "vm_ready",
    "vm_ready_batch",
    "vm_failed",
    "expire_request",
    "delete_request",
    "end_vm_lifetime",
    "vm_destroyed",
    "quota_park",
)
# The store's VM transition -> its script for a warm-pool VM (no request).
POOL_VARIANTS: Final[Mapping[str, str]] = {
    "vm_created": "pool_vm_created",
    "vm_ready": "pool_vm_ready",
    "vm_failed": "pool_vm_failed",
    "end_vm_lifetime": "pool_end_lifetime",
    "vm_destroyed": "pool_vm_destroyed",
}
# The scripts that take or give back a VM's clone slot in their unit, or put a new
# request in the slots' line (_slots.lua).
SLOT_SCRIPTS: Final = (
    "create_request",
    "reserve_vm",
    "vm_created",
    "pool_reserve",
    "pool_vm_created",
)
# A batch script -> the one-VM script whose body it runs for each of its VMs, composed
# ahead of it as the function ``<one>_one`` (:func:`as_function`).
BATCH_OF: Final[Mapping[str, str]] = {"vm_ready_batch": "vm_ready"}
# The scripts that take the pool layout of KEYS, or either layout (scripts/_pool.lua).
POOL_SCRIPTS: Final = (
    *POOL_VARIANTS.values(),
    "pool_reserve",
    "pool_recycle",
    "checkout",
    "claim_for_request",
    "give_back",
    "extend_vm",
    "tag_vm",
    "pool_reset",
    "vm_waiting",
    "vm_task_add",
    "vm_task_done",
)


class StoreScripts:
    """The store's scripts by name, each registered on first use (one per store).

    The store and its parts (:class:`~vmpool.state.pool_store.PoolStore`,
    :class:`~vmpool.state.vm_tasks.VMTaskStore`) share one registry.
    """

    def __init__(self, redis_client: redis.Redis, keys: Keys, *, whole: bool = False) -> None:
        """``whole``: compose each script with all the helpers, not only those its body
        reaches (:func:`~vmpool.state.lua_deps.prune`): the benchmark's baseline."""
        self.keys = keys
        self._whole = whole
        self._redis = redis_client
        # The fleet's metric keys are rendered in (per prefix), as the table is: the
        # scripts count in the same unit as the transition they count.
        # The quotas' keys and counting (_quota.lua) come before the prelude, whose
        # move_vm counts each VM's move for its user in the move's unit.
        self._prelude = prelude(keys)
        pool_head = _text("_pool")
        self._heads = {name: pool_head for name in POOL_SCRIPTS}
        # create_request adds the request to the provision work set in its unit, and
        # records its ETA (the line's functions, _line.lua).
        self._heads["create_request"] = lua_workset() + _text("_line")
        # A VM's clone slot is taken in its reservation and given back when it was
        # created, in those units (_slots.lua, the clone semaphore's leases); a new
        # request behind a full line joins it in its create's.
        for name in SLOT_SCRIPTS:
            self._heads[name] = self._heads.get(name, "") + _text("_slots")
        # A batch script runs its one-VM script's body for each VM (BATCH_OF).
        for name, one in BATCH_OF.items():
            self._heads[name] = self._heads.get(one, "") + as_function(one)
        self._registered: dict[str, Script] = {}
        # How long the reply of a call made without a caller's operation id is kept.
        self.op_ttl_s = retry_window_s(redis_client)

    def __getitem__(self, name: str) -> Script:
        script = self._registered.get(name)
        if script is None:
            if name not in self._heads and name not in REQUEST_SCRIPTS:
                raise KeyError(f"not a store script: {name!r}")
            script = self._registered[name] = self._redis.register_script(self.text(name))
        return script

    def all(self) -> list[Script]:
        """Every store script, each registered (its text composed) now if not yet."""
        return [self[name] for name in dict.fromkeys([*REQUEST_SCRIPTS, *self._heads])]

    def text(self, name: str) -> str:
        """The composed text of script ``name``: its helpers, _once.lua, its body.

        Of the helpers, only the definitions the body reaches (:mod:`vmpool.state.lua_deps`):
        each call runs the script's whole text, so a helper it does not use would still
        be made on every call.
        """
        helpers = self._prelude + self._heads.get(name, "")
        body = once_text(_text(name))
        return (helpers if self._whole else prune(helpers, body)) + body

    def call(
        self,
        name: str,
        keys: Sequence[str],
        actor: str,
        request_id: str,
        args: Sequence[Any],
        op: Op | None = None,
    ) -> ScriptCall:
        """A call of script ``name`` with ``keys``, its ARGV built the one way.

        ARGV 1-4 as in _prelude.lua (the pool-index and VM key prefixes, the actor, the
        request id), then ``args``, then the operation's (_once.lua): ``op``, else one
        made now for this call (every send of the call carries it).
        """
        k = self.keys
        op = op or new_op(self.op_ttl_s)
        argv = [k.pool_state_prefix(), k.vm_prefix(), actor, request_id, *args, *op.argv(k)]
        return ScriptCall(self[name], list(keys), argv)

    def run(
        self,
        name: str,
        keys: Sequence[str],
        actor: str,
        request_id: str,
        args: Sequence[Any],
        op: Op | None = None,
    ) -> Any:
        """Run :meth:`call`'s call now and return the script's raw reply."""
        return self.call(name, keys, actor, request_id, args, op).run()

    def request_of(self, name: str, request_id: str | None = None) -> str | None:
        """The VM's request id ('' for a warm-pool VM), None when there is no VM.

        ``request_id``: the caller's, from a record read under the VM's lock (no read
        then). A VM's request id changes once, '' -> a request, while it is ready, and
        never after: the script's own check settles a read made just before it.
        """
        if request_id is not None:
            return request_id
        raw = self._redis.hget(self.keys.vm(validate_vm_name(name)), "request_id")
        return None if raw is None else text(raw)

    def run_on_vm(
        self,
        name: str,
        script: str,
        actor: str,
        args: Sequence[Any],
        *,
        request_id: str | None = None,
        op: Op | None = None,
    ) -> Outcome:
        """Run ``script`` on VM ``name`` in the KEYS layout its record calls for.

        Its request's layout, or a warm-pool VM's own (request id ''). A warm-pool VM's
        transition runs the script's pool variant (:data:`POOL_VARIANTS`). The other VM
        scripts take either layout. ``request_id``: as for :meth:`request_of`. ``op``:
        as for :meth:`call`. Outcome ``no_vm`` when there is no such VM.
        """
        request_id = self.request_of(name, request_id)
        if request_id is None:
            return Outcome(False, "no_vm")
        return Outcome.from_reply(self.call_on_vm(name, script, actor, args, request_id, op).run())

    def call_on_vm(
        self,
        name: str,
        script: str,
        actor: str,
        args: Sequence[Any],
        request_id: str,
        op: Op | None = None,
    ) -> ScriptCall:
        """:meth:`run_on_vm`'s call of ``script`` on VM ``name`` of ``request_id`` ('' for
        a warm-pool VM: its pool variant), to run alone or with others."""
        if not request_id:
            script = POOL_VARIANTS.get(script, script)
        keys = self.keys.vm_script_keys(name, request_id)
        return self.call(script, keys, actor, request_id, args, op)


def prelude(keys: Keys) -> str:
    """The head every store script of ``keys``' fleet starts with.

    The rendered transition table, metric, quota and wake-up keys, ``_quota.lua`` (whose
    counting move_vm calls), ``_prelude.lua``.
    """
    return lua_tables() + lua_metrics(keys) + lua_wake(keys) + _text("_quota") + _text("_prelude")


def lua_wake(keys: Keys) -> str:
    """The keys of the parked pending sweep's wake-up, as Lua source (_prelude.lua's).

    A reservation wakes it in its own unit (workers/schedule.py).
    """
    return (
        f"local SWEEP_PARKED = {keys.schedule_parked!r}\n"
        f"local SWEEP_WAKE = {keys.schedule_wake!r}\n"
    )


def as_function(name: str) -> str:
    """Script ``name``'s body as the helper ``local function <name>_one()`` (indented, so
    it is one top-level definition for :func:`~vmpool.state.lua_deps.prune`): its
    top-level ``return`` ends the function, its locals are the function's."""
    lines = _text(name).splitlines()
    body = "\n".join(f"  {line}" if line else "" for line in lines)
    return f"local function {name}_one()\n{body}\nend\n"


def _text(name: str) -> str:
    return read_script(SCRIPTS_PACKAGE, f"{name}.lua")

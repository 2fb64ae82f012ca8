"""The state store: every change of a request or a VM is one Lua script.

Each transition below runs one script from ``vmpool/state/scripts/`` (their headers state keys,
arguments, returns and the invariant each protects). A script checks its precondition
(the record exists, the status, the deadline, the fencing token) and makes the change
in one atomic unit, with the request's version bump and audit entry. A refused change
comes back as an ``Outcome`` with ``ok=False`` and a ``code`` saying why. Nothing here
raises for a refusal.

The store holds its parts, each built with its Redis, keys and one script registry
(:class:`~vmpool.state.store_scripts.StoreScripts`): ``store.pools`` the warm pools
(:class:`~vmpool.state.pool_store.PoolStore`: ready VMs, checkouts, claims, give-backs),
``store.tasks`` a held VM's snapshots and disks
(:class:`~vmpool.state.vm_tasks.VMTaskStore`).

Nothing else in vmpool writes a status: not the API, not a job, not the CLI.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import redis

from vmpool.ids import validate_vm_name
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, ScriptPipeline, run_pipelined
from vmpool.state.ops import Op
from vmpool.state.pool_index import PoolIndexReads
from vmpool.state.pool_store import PoolStore
from vmpool.state.quotas import NO_LIMITS, QuotaLimits, QuotaStore
from vmpool.state.reads import RecordReads
from vmpool.state.records import (
    Booted,
    Outcome,
    RequestSettings,
    Slot,
    encode_slots,
)
from vmpool.state.semaphore import SlotTerms
from vmpool.state.store_scripts import StoreScripts
from vmpool.state.vm_tasks import VMTaskStore

__all__ = ["Store", "VMAsk"]


@dataclass(frozen=True)
class VMAsk:
    """One VM to reserve for a request: its name, the slot alias it is for, its pool's
    template, provider and domain, the request lock's fence, and its clone slot's terms
    (None: no slot taken)."""

    request_id: str
    name: str
    alias: str
    pool: str
    template: str
    provider: str
    domain: str | None
    fence: int | None = None
    slot: SlotTerms | None = None


@functools.lru_cache(maxsize=64)
def _policy_args(
    settings: RequestSettings, clone_limit: int
) -> tuple[tuple[str | int, ...], tuple[str | int, ...]]:
    """create_request.lua's ARGV 6-10 and 13-16 for ``settings``: spelt once per policy
    (an API has a few), not on every create."""
    policy: tuple[str | int, ...] = (
        *(repr(float(s)) for s in (settings.ttl_s, settings.grace_s)),
        int(settings.max_vm_retries),
        *(repr(float(s)) for s in (settings.vm_lifetime_s, settings.data_ttl_s)),
    )
    line: tuple[str | int, ...] = (
        int(settings.priority),
        repr(float(settings.lead_s)),
        int(clone_limit),
        repr(float(settings.round_s)),
    )
    return policy, line


class Store(RecordReads, PoolIndexReads):
    """The request/VM state in Redis, changed only through checked atomic scripts.

    Its parts: ``pools`` (warm pools) and ``tasks`` (VM tasks), sharing its Redis, its
    keys and its script registry ``scripts``. ``redis`` may or may not decode
    responses. ``keys`` fixes the prefix. The store keeps no state of its own beyond the
    registered scripts, so one per process (or per thread) is fine.
    """

    def __init__(self, redis_client: redis.Redis, keys: Keys) -> None:
        self.redis = redis_client
        self.keys = keys
        self.scripts = StoreScripts(redis_client, keys)
        self.pools = PoolStore(redis_client, keys, self.scripts)
        self.tasks = VMTaskStore(redis_client, keys, self.scripts)
        self.quotas = QuotaStore(redis_client, keys, self.scripts)

    # -- plumbing -------------------------------------------------------------------
    def _run(
        self,
        script: str,
        request_id: str,
        actor: str,
        args: Sequence[Any] = (),
        vm_name: str | None = None,
    ) -> Outcome:
        if vm_name is None:
            keys = self.keys.request_script_keys(request_id)
        else:
            keys = self.keys.vm_script_keys(vm_name, request_id)
        return Outcome.from_reply(self.scripts.run(script, keys, actor, request_id, args))

    @staticmethod
    def _fence(token: int | None) -> str:
        return "" if token is None else str(int(token))

    # -- transitions ------------------------------------------------------------------
    @overload
    def create_request(
        self,
        request_id: str,
        slots: Sequence[Slot],
        settings: RequestSettings,
        *,
        actor: str,
        token_user: str = ...,
        token_hash: str = ...,
        work_set: str | None = ...,
        clone_limit: int = ...,
        pipeline: None = ...,
    ) -> Outcome: ...

    @overload
    def create_request(
        self,
        request_id: str,
        slots: Sequence[Slot],
        settings: RequestSettings,
        *,
        actor: str,
        token_user: str = ...,
        token_hash: str = ...,
        work_set: str | None = ...,
        clone_limit: int = ...,
        pipeline: ScriptPipeline,
    ) -> Outcome | None: ...

    def create_request(
        self,
        request_id: str,
        slots: Sequence[Slot],
        settings: RequestSettings,
        *,
        actor: str,
        token_user: str = "",
        token_hash: str = "",
        work_set: str | None = None,
        clone_limit: int = 0,
        pipeline: ScriptPipeline | None = None,
    ) -> Outcome | None:
        """Create the request (pending, its first trail entry, its queue entries).

        ``work_set``: a work-set key (``Keys.work_set('provision_request')``) the id is
        added to in the same unit (create_request.lua), unless the request waits in the
        clone slots' line from its creation (others wait ahead of it, no slot is free in
        its turn, none of its pools holds a ready VM): then it is dispatched in its turn.
        ``clone_limit``: the fleet's, for the ETA the request is created with and that
        line (0: unknown; the line is not joined). ``pipeline``: add the script
        call to it instead of running it, and return None (its reply makes an Outcome
        with ``Outcome.from_reply``). A refusal made without Redis is returned all the
        same, and nothing is added.
        """
        keys = self.keys.request_script_keys(request_id)  # checks the id first
        requested = encode_slots(slots)
        if not requested:
            return Outcome(False, "empty")
        if work_set is not None:
            keys.append(work_set)
        policy, line = _policy_args(settings, clone_limit)
        args = [requested, *policy, token_user, token_hash, *line]
        call = self.scripts.call("create_request", keys, actor, request_id, args)
        if pipeline is not None:
            pipeline.add(call)
            return None
        return Outcome.from_reply(call.run())

    def reserve_vm(
        self,
        request_id: str,
        *,
        name: str,
        alias: str,
        pool: str,
        template: str,
        provider: str,
        domain: str | None,
        actor: str,
        fence: int | None = None,
        quota: QuotaLimits = NO_LIMITS,
        slot: SlotTerms | None = None,
    ) -> Outcome:
        """``quota``: the request's user's (refused ``quota_max_vms`` / ``quota_max_cores``
        unless all the request still needs fits it). ``slot``: the VM's clone slot is
        taken in the same unit, in the request's turn (else ``clone_limit``)."""
        ask = VMAsk(request_id, name, alias, pool, template, provider, domain, fence, slot)
        return Outcome.from_reply(self._reserve_call(ask, actor, quota).run())

    def reserve_vms(self, asks: Sequence[VMAsk], *, actor: str) -> list[Outcome | Exception]:
        """:meth:`reserve_vm` for each ask (of users without a quota), in one round trip:
        each its own script, refused or not on its own (a script's error in its place),
        in the order asked."""
        calls = [self._reserve_call(ask, actor, NO_LIMITS) for ask in asks]
        return [
            reply if isinstance(reply, Exception) else Outcome.from_reply(reply)
            for reply in run_pipelined(self.redis, calls)
        ]

    def _reserve_call(self, ask: VMAsk, actor: str, quota: QuotaLimits) -> ScriptCall:
        validate_vm_name(ask.name)
        args = [ask.name, ask.alias, ask.pool, ask.template, ask.provider, ask.domain or ""]
        args += [self._fence(ask.fence), *quota.argv()]
        args += ask.slot.argv() if ask.slot else ["", "", ""]
        keys = self.keys.vm_script_keys(ask.name, ask.request_id)
        return self.scripts.call("reserve_vm", keys, actor, ask.request_id, args)

    def vm_created(
        self,
        name: str,
        *,
        actor: str,
        fence: int | None = None,
        request_id: str | None = None,
        slot_limit: int | None = None,
    ) -> Outcome:
        """The provider created the VM, which is booting (reserved -> pending).

        ``request_id``: the VM's, from a record read under its lock. It saves a read,
        and the script checks it all the same. ``slot_limit``: the clone limit; the VM's
        clone slot (``fence``'s) is then given back in the same unit, and the outcome's
        ``turns`` are the requests whose turn for a slot it is now. None keeps the slot.
        """
        args = [name, self._fence(fence), "" if slot_limit is None else int(slot_limit)]
        return self.scripts.run_on_vm(name, "vm_created", actor, args, request_id=request_id)

    def vm_created_all(
        self, created: Sequence[tuple[str, int, str]], *, actor: str, slot_limit: int
    ) -> list[Outcome | Exception]:
        """:meth:`vm_created` for each (name, fence, request id as read under the VM's
        lock), in one round trip: each its own script, refused or not on its own (a
        script's error in its place)."""
        calls = [
            self.scripts.call_on_vm(
                name, "vm_created", actor, [name, self._fence(fence), int(slot_limit)], request_id
            )
            for name, fence, request_id in created
        ]
        return [
            reply if isinstance(reply, Exception) else Outcome.from_reply(reply)
            for reply in run_pipelined(self.redis, calls)
        ]

    def vm_ready(
        self,
        name: str,
        *,
        actor: str,
        fence: int | None = None,
        hostname: str = "",
        request_id: str | None = None,
        address: str = "",
    ) -> Outcome:
        """The VM booted: attached to its request (running), or ready in its warm pool.

        ``hostname``: the address the cloud reports, for a VM whose pool has no domain
        (recorded in the same unit as the VM turning running). '' keeps it.
        ``address``: the cloud's address, recorded and indexed (Keys.addresses) so the
        API finds the VM by it. ``request_id``: as for :meth:`vm_created`.
        """
        index = self.keys.addresses if address else ""
        args = [name, self._fence(fence), hostname, address, index]
        return self.scripts.run_on_vm(name, "vm_ready", actor, args, request_id=request_id)

    def vms_ready(self, booted: Sequence[Booted], *, actor: str) -> list[Outcome]:
        """:meth:`vm_ready` for each of ``booted`` (VMs of requests), in one unit.

        One script call (vm_ready_batch.lua): one round trip, one server TIME and one
        operation id for all, each VM still checked and moved as vm_ready.lua does. The
        outcomes in the order given. A warm-pool VM (request id '') is refused here:
        its transition is another script (:meth:`vm_ready`)."""
        keys: list[str] = []
        args: list[str] = []
        for vm in booted:
            if not vm.request_id:
                raise ValueError(f"{vm.name}: a warm-pool VM has no batched ready")
            keys += self.keys.vm_script_keys(vm.name, vm.request_id)
            index = self.keys.addresses if vm.address else ""
            args += [vm.request_id, vm.name, self._fence(vm.fence), vm.hostname, vm.address, index]
        if not booted:
            return []
        reply = self.scripts.run("vm_ready_batch", keys, actor, "", args)
        return [Outcome.from_reply(one) for one in reply[1:]]

    def vm_failed(
        self,
        name: str,
        reason: str,
        *,
        actor: str,
        permanent: bool = False,
        fence: int | None = None,
        request_id: str | None = None,
        hold_s: float = 0.0,
    ) -> Outcome:
        """``request_id``: as for :meth:`vm_created`. ``hold_s`` > 0: a booted VM is kept
        on hold that long for debugging (code 'on_hold' where 'completed' would be)."""
        args = [name, self._fence(fence), reason, "1" if permanent else "0", repr(float(hold_s))]
        return self.scripts.run_on_vm(name, "vm_failed", actor, args, request_id=request_id)

    def vm_waiting(
        self,
        name: str,
        reason: str,
        *,
        actor: str,
        fence: int | None = None,
        request_id: str | None = None,
    ) -> Outcome:
        """A reserved VM waits for capacity (no transition).

        ``reason`` goes to its ``error`` and to its request's ``last_error``, which the
        request's failure by TTL reports. ``request_id``: as for :meth:`vm_created`.
        """
        args = [name, self._fence(fence), reason[:1000]]
        return self.scripts.run_on_vm(name, "vm_waiting", actor, args, request_id=request_id)

    def expire_request(self, request_id: str, *, actor: str) -> Outcome:
        return self._run("expire_request", request_id, actor)

    def delete_request(
        self, request_id: str, *, actor: str, user: str = "", op: Op | None = None
    ) -> Outcome:
        """``op``: the operation (:mod:`vmpool.state.ops`; None: one made for the call)."""
        keys = self.keys.request_script_keys(request_id)
        reply = self.scripts.run("delete_request", keys, actor, request_id, [user], op)
        return Outcome.from_reply(reply)

    def end_vm_lifetime(
        self, name: str, *, actor: str, force: bool = False, reason: str = ""
    ) -> Outcome:
        """``reason``: why it ended ('' for 'lifetime ended')."""
        args = [name, "1" if force else "0", reason]
        return self.scripts.run_on_vm(name, "end_vm_lifetime", actor, args)

    def vm_destroyed(self, name: str, *, actor: str, fence: int | None = None) -> Outcome:
        args = [name, self._fence(fence), self.keys.addresses]
        return self.scripts.run_on_vm(name, "vm_destroyed", actor, args)

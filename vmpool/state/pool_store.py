"""Warm pools in the state store: ready VMs nobody holds, checkouts, claims, give-backs.

:class:`PoolStore` is a mixin of :class:`vmpool.state.store.Store` (the one writer of
request and VM state). Each method runs one script from ``vmpool/state/scripts/`` (the
``pool_*``, ``checkout``, ``claim_for_request``, ``give_back``, ``extend_vm`` and
``tag_vm`` files; their headers give keys, arguments, returns and invariants).

A warm-pool VM's record has ``request_id`` ''. Until a request claims it, its
transitions are versioned in its own hash and audited to its own trail
(``Keys.vm_audit``); the store's VM transitions (``vm_created``, ``vm_ready``,
``vm_failed``, ``end_vm_lifetime``, ``vm_destroyed``) run the pool variant of their
script for such a VM (:data:`POOL_VARIANTS`), so the lifecycle's create, check, reap and
destroy jobs serve both kinds of VM unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.commands.core import Script

from vmpool.ids import (
    InvalidIdentifier,
    validate_pool_name,
    validate_request_id,
    validate_vm_name,
)
from vmpool.state.counters import lua_metrics
from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.lua import read_script
from vmpool.state.records import AuditEntry, Outcome, VMRecord, decode_hash, text
from vmpool.state.transitions import lua_tables

__all__ = ["POOL_SCRIPT_NAMES", "POOL_VARIANTS", "Checkout", "Claim", "PoolStore"]

_PACKAGE = "vmpool.state.scripts"

# The store's VM transition -> its script for a warm-pool VM (no request).
POOL_VARIANTS: Mapping[str, str] = {
    "vm_created": "pool_vm_created",
    "vm_ready": "pool_vm_ready",
    "vm_failed": "pool_vm_failed",
    "end_vm_lifetime": "pool_end_lifetime",
    "vm_destroyed": "pool_vm_destroyed",
}
POOL_SCRIPT_NAMES = (
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
)


@dataclass(frozen=True)
class Checkout:
    """What a checkout did: ``vms`` (name, pool) handed out, or ``short`` naming the
    pool that had too few ready VMs (then nothing was handed out)."""

    ok: bool
    code: str
    vms: tuple[tuple[str, str], ...] = ()
    short: str = ""


@dataclass(frozen=True)
class Claim:
    """What claim_for_request did: the ready VMs the request took (``names``)."""

    ok: bool
    code: str
    version: int | None = None
    names: tuple[str, ...] = field(default=())


class PoolStore:
    """The warm-pool half of the store (mixed into :class:`~vmpool.state.store.Store`)."""

    redis: redis.Redis
    keys: Keys

    # -- plumbing -------------------------------------------------------------------
    def _pool_script(self, name: str) -> Script:
        scripts: dict[str, Script] = self.__dict__.setdefault("_pool_scripts", {})
        if name not in scripts:
            prelude = (
                lua_tables()
                + lua_metrics(self.keys)
                + read_script(_PACKAGE, "_prelude.lua")
                + read_script(_PACKAGE, "_pool.lua")
            )
            scripts[name] = self.redis.register_script(
                prelude + read_script(_PACKAGE, f"{name}.lua")
            )
        return scripts[name]

    def _layout(self, name: str, request_id: str) -> list[str]:
        """KEYS of a one-VM script: the request layout for a VM a request holds, the
        pool layout (scripts/_pool.lua) for a warm-pool VM."""
        k = self.keys
        vm, fence = k.vm(name), k.vm_fence(name)
        if request_id:
            return [
                k.request(request_id),
                k.request_vms(request_id),
                k.request_audit(request_id),
                k.request_fence(request_id),
                k.open_requests,
                k.provision_queue,
                vm,
                fence,
            ]
        return [vm, fence, k.vm_audit(name), fence, k.open_requests, k.provision_queue, vm, fence]

    def _argv(self, actor: str, request_id: str, args: Sequence[Any]) -> list[Any]:
        return [self.keys.pool_state_prefix(), self.keys.vm_prefix(), actor, request_id, *args]

    def _run_one(
        self, script: str, name: str, request_id: str, actor: str, args: Sequence[Any]
    ) -> Any:
        return self._pool_script(script)(
            keys=self._layout(name, request_id), args=self._argv(actor, request_id, args)
        )

    def _run_pool_vm(self, script: str, name: str, actor: str, args: Sequence[Any]) -> Outcome:
        """A store VM transition of a warm-pool VM: its pool variant."""
        return Outcome.from_reply(self._run_one(POOL_VARIANTS[script], name, "", actor, args))

    def _run_held(self, script: str, name: str, actor: str, args: Sequence[Any]) -> Outcome:
        """A script acting on a held VM, in the layout its holder calls for."""
        raw = self.redis.hget(self.keys.vm(validate_vm_name(name)), "request_id")
        if raw is None:
            return Outcome(False, "no_vm")
        # request_id changes once, '' -> a request, while the VM is ready; a held VM's
        # never changes, so the script's own check settles a read made just before.
        return Outcome.from_reply(self._run_one(script, name, text(raw), actor, args))

    def _trail(self, key: str) -> list[AuditEntry]:  # Store reads trails
        raise NotImplementedError

    # -- a request's or a warm VM's, in the layout its record calls for ----------------
    def vm_waiting(
        self,
        name: str,
        reason: str,
        *,
        actor: str,
        fence: int | None = None,
        request_id: str | None = None,
    ) -> Outcome:
        """A reserved VM waits for capacity (no transition): ``reason`` goes to its
        ``error`` and to its request's ``last_error``, which the request's failure by
        TTL reports. ``request_id``: as for :meth:`vm_created`."""
        if request_id is None:
            raw = self.redis.hget(self.keys.vm(validate_vm_name(name)), "request_id")
            if raw is None:
                return Outcome(False, "no_vm")
            request_id = text(raw)
        args = [name, "" if fence is None else str(int(fence)), reason[:1000]]
        return Outcome.from_reply(self._run_one("vm_waiting", name, request_id, actor, args))

    def vm_at_address(self, address: str) -> str | None:
        """The name of the VM that last turned ready with this cloud address, if any."""
        raw = self.redis.hget(self.keys.addresses, address)
        return None if raw is None else text(raw)

    # -- warm-pool VM transitions ----------------------------------------------------
    def reserve_pool_vm(
        self,
        name: str,
        *,
        pool: str,
        template: str,
        provider: str,
        domain: str | None,
        size: int,
        data_ttl_s: float,
        actor: str,
    ) -> Outcome:
        validate_vm_name(name)
        validate_pool_name(pool)
        args = [name, pool, template, provider, domain or "", int(size), repr(float(data_ttl_s))]
        return Outcome.from_reply(self._run_one("pool_reserve", name, "", actor, args))

    def recycle_vm(
        self, name: str, reason: str, *, actor: str, min_ready_s: float | None = None
    ) -> Outcome:
        age = "" if min_ready_s is None else repr(float(min_ready_s))
        return Outcome.from_reply(
            self._run_one("pool_recycle", validate_vm_name(name), "", actor, [name, reason, age])
        )

    def checkout(
        self,
        counts: Mapping[str, int],
        *,
        owner: str,
        owner_hash: str,
        lifetime_s: float,
        actor: str,
    ) -> Checkout:
        wanted = ",".join(f"{validate_pool_name(p)}:{int(n)}" for p, n in counts.items() if n > 0)
        reply = self._pool_script("checkout")(
            keys=[],
            args=self._argv(actor, "", [owner, owner_hash, repr(float(lifetime_s)), wanted]),
        )
        if int(reply[0]) != 1:
            return Checkout(False, text(reply[1]), short=text(reply[2]) if len(reply) > 2 else "")
        items = [text(x) for x in reply[3:]]
        return Checkout(True, text(reply[1]), tuple(zip(items[::2], items[1::2], strict=True)))

    def claim_for_request(self, request_id: str, pools: Iterable[str], *, actor: str) -> Claim:
        validate_request_id(request_id)
        lending = ",".join(validate_pool_name(p) for p in pools)
        if not lending:
            return Claim(False, "no_pools")
        k = self.keys
        keys = [
            k.request(request_id),
            k.request_vms(request_id),
            k.request_audit(request_id),
            k.request_fence(request_id),
            k.open_requests,
            k.provision_queue,
        ]
        reply = self._pool_script("claim_for_request")(
            keys=keys, args=self._argv(actor, request_id, [lending])
        )
        if int(reply[0]) != 1:
            return Claim(False, text(reply[1]))
        return Claim(True, text(reply[1]), int(reply[2]), tuple(text(n) for n in reply[3:]))

    def give_back(self, name: str, *, actor: str, user: str = "") -> Outcome:
        return self._run_held("give_back", name, actor, [name, user])

    def extend_vm(self, name: str, hours: int, *, actor: str, user: str = "") -> Outcome:
        if int(hours) <= 0:
            raise ValueError("a lifetime is a positive number of hours")
        return self._run_held("extend_vm", name, actor, [name, user, int(hours)])

    def tag_vm(self, name: str, tags: Mapping[str, str], *, actor: str, user: str = "") -> Outcome:
        flat = [str(x) for pair in tags.items() for x in pair]
        return self._run_held("tag_vm", name, actor, [name, user, *flat])

    def reset_pool(self, pool: str, *, actor: str) -> list[str]:
        """Send the pool's ready VMs to destruction and record the reset, so that no VM
        reserved before it becomes ready (pool_reset.lua); returns the VMs recycled.
        Held VMs are never touched."""
        reply = self._pool_script("pool_reset")(
            keys=[], args=self._argv(actor, "", [validate_pool_name(pool)])
        )
        return [text(n) for n in reply[3:]]

    # -- reads --------------------------------------------------------------------------
    def vm_history(self, name: str) -> list[AuditEntry]:
        """A warm-pool VM's own trail (up to its claim by a request, if any)."""
        return self._trail(self.keys.vm_audit(validate_vm_name(name)))

    def warm_counts(self, pools: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per pool: ``ready`` VMs, and ``warming``: the pool's own reserved and booting
        VMs (a request's are not counted). What the top-up job's deficit is made of;
        pool_reserve.lua counts the same inside its unit."""
        pools = list(pools)
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            pipe.zcard(self.keys.pool_state(pool, "ready"))
            pipe.zrange(self.keys.pool_state(pool, "reserved"), 0, -1)
            pipe.zrange(self.keys.pool_state(pool, "pending"), 0, -1)
        replies = iter(pipe.execute())
        ready: dict[str, int] = {}
        making: dict[str, list[str]] = {}
        for pool in pools:
            ready[pool] = int(next(replies))
            making[pool] = [text(n) for n in next(replies)] + [text(n) for n in next(replies)]
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            for name in making[pool]:
                pipe.hget(self.keys.vm(name), "request_id")
        owners = iter(pipe.execute())
        out: dict[str, dict[str, int]] = {}
        for pool in pools:
            warming = sum(1 for _ in making[pool] if (next(owners) or "") == "")
            out[pool] = {"ready": ready[pool], "warming": warming}
        return out

    def indexed_pools(self) -> set[str]:
        """The pools whose VM indexes exist in Redis (any state), configured or not: one
        SCAN of the keyspace, so only the rare passes use it (the reap pass, `vmpool
        pools`, the audit). A key of another fleet whose prefix starts like ours and
        goes on with ':pool:' is not a pool name and is skipped."""
        prefix = self.keys.pool_state_prefix()
        found: set[str] = set()
        for raw in self.redis.scan_iter(match=self.keys.pool_state_pattern(), count=1000):
            pool, _, state = text(raw)[len(prefix) :].rpartition(":")
            if state in INDEXED_VM_STATES and _is_pool_name(pool):
                found.add(pool)
        return found

    def held_vms(self, pools: Iterable[str]) -> list[VMRecord]:
        """Every running VM of the pools (checked out or a request's)."""
        pipe = self.redis.pipeline(transaction=False)
        for pool in pools:
            pipe.zrange(self.keys.pool_state(pool, "running"), 0, -1)
        names = sorted({text(n) for reply in pipe.execute() for n in reply})
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self.keys.vm(name))
        return [VMRecord.from_hash(decode_hash(raw)) for raw in pipe.execute() if raw]

    def owner_token(self, name: str) -> str:
        """The token hash a checked-out VM was handed to ('' for none)."""
        raw = self.redis.hget(self.keys.vm(validate_vm_name(name)), "owner_token")
        return text(raw) if raw else ""


def _is_pool_name(name: str) -> bool:
    try:
        validate_pool_name(name)
    except InvalidIdentifier:
        return False
    return True

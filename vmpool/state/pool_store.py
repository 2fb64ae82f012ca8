"""Warm pools in the state store: ready VMs nobody holds, checkouts, claims, give-backs.

:class:`PoolStore` is the warm-pool part the store holds (``Store.pools``). Built alone,
it makes its own script registry. Each method runs one script from
``vmpool/state/scripts/`` (the ``pool_*``, ``checkout``, ``claim_for_request``,
``give_back``, ``extend_vm`` and ``tag_vm`` files, whose headers give keys, arguments,
returns and invariants) through the registry
(:class:`~vmpool.state.store_scripts.StoreScripts`).

A warm-pool VM's record has ``request_id`` ''. Until a request claims it, its
transitions are versioned in its own hash and audited to its own trail
(``Keys.vm_audit``). The store's VM transitions (``vm_created``, ``vm_ready``,
``vm_failed``, ``vm_waiting``, ``end_vm_lifetime``, ``vm_destroyed``) run the pool
variant of their script for such a VM
(:meth:`~vmpool.state.store_scripts.StoreScripts.run_on_vm`), so the lifecycle's
create, check, reap and destroy jobs serve both kinds of VM unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import redis

from vmpool.ids import (
    InvalidIdentifier,
    validate_pool_name,
    validate_request_id,
    validate_vm_name,
)
from vmpool.state import reads
from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.ops import Op
from vmpool.state.quotas import NO_LIMITS, QuotaLimits
from vmpool.state.records import AuditEntry, Outcome, VMRecord, decode_hash, text
from vmpool.state.semaphore import SlotTerms
from vmpool.state.store_scripts import StoreScripts

__all__ = ["Checkout", "Claim", "PoolStore"]


@dataclass(frozen=True)
class Checkout:
    """What a checkout did.

    ``vms`` (name, pool) handed out, or ``short`` naming the pool that had too few ready
    VMs (then nothing was handed out), or, refused for the owner's quota, what the owner
    ``held`` of it. ``asked``: the caller's ``asked``, as the checkout
    that handed them out was given it (a repeat of an operation: the first call's).
    """

    ok: bool
    code: str
    vms: tuple[tuple[str, str], ...] = ()
    short: str = ""
    asked: str = ""
    held: int = 0  # refused for a quota (code quota_max_vms, quota_max_cores): held now


@dataclass(frozen=True)
class Claim:
    """What claim_for_request did: the ready VMs the request took (``names``)."""

    ok: bool
    code: str
    version: int | None = None
    names: tuple[str, ...] = field(default=())


class PoolStore:
    """The warm-pool part of the store (``Store.pools``), usable on its own."""

    def __init__(
        self, redis_client: redis.Redis, keys: Keys, scripts: StoreScripts | None = None
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.scripts = scripts or StoreScripts(redis_client, keys)

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
        cores: int = 1,
        slot: SlotTerms | None = None,
    ) -> Outcome:
        """``cores``: of one VM of the pool (what its checkout or claim counts). ``slot``:
        the VM's clone slot is taken in the same unit (refused ``clone_limit``); None
        takes none."""
        validate_vm_name(name)
        validate_pool_name(pool)
        args = [name, pool, template, provider, domain or "", int(size), repr(float(data_ttl_s))]
        args.append(int(cores))
        args += slot.argv()[:2] if slot else ["", ""]
        return self.scripts.run_on_vm(name, "pool_reserve", actor, args, request_id="")

    def recycle_vm(
        self, name: str, reason: str, *, actor: str, min_ready_s: float | None = None
    ) -> Outcome:
        age = "" if min_ready_s is None else repr(float(min_ready_s))
        args = [name, reason, age]
        return self.scripts.run_on_vm(
            validate_vm_name(name), "pool_recycle", actor, args, request_id=""
        )

    def checkout(
        self,
        counts: Mapping[str, int],
        *,
        owner: str,
        owner_hash: str,
        lifetime_s: float,
        actor: str,
        asked: str = "",
        op: Op | None = None,
        quota: QuotaLimits = NO_LIMITS,
    ) -> Checkout:
        """Hand out ready VMs of several pools to one client, all or nothing.

        ``asked``: what the caller asked in its own terms (opaque), returned in the
        Checkout. ``op``: the operation (:mod:`vmpool.state.ops`; None: one made for the
        call). The other transitions below take ``op`` alike. ``quota``: the owner's
        (refused ``quota_max_vms`` / ``quota_max_cores`` when the VMs would pass it).
        """
        wanted = ",".join(f"{validate_pool_name(p)}:{int(n)}" for p, n in counts.items() if n > 0)
        args = [owner, owner_hash, repr(float(lifetime_s)), wanted, asked, *quota.argv()[:2]]
        reply = self.scripts.run("checkout", [], actor, "", args, op)
        if int(reply[0]) != 1:
            code = text(reply[1])
            if code.startswith("quota_"):
                return Checkout(False, code, held=int(reply[2]))
            return Checkout(False, code, short=text(reply[2]) if len(reply) > 2 else "")
        items = [text(x) for x in reply[3:]]
        vms = tuple(zip(items[::2], items[1::2], strict=True))
        return Checkout(True, text(reply[1]), vms, asked=text(reply[2] or ""))

    def claim_for_request(
        self,
        request_id: str,
        pools: Iterable[str],
        *,
        actor: str,
        quota: QuotaLimits = NO_LIMITS,
    ) -> Claim:
        """``quota``: the request's user's (as :meth:`Store.reserve_vm`'s)."""
        validate_request_id(request_id)
        lending = ",".join(validate_pool_name(p) for p in pools)
        if not lending:
            return Claim(False, "no_pools")
        keys = self.keys.request_script_keys(request_id)
        args = [lending, *quota.argv()]
        reply = self.scripts.run("claim_for_request", keys, actor, request_id, args)
        if int(reply[0]) != 1:
            return Claim(False, text(reply[1]))
        return Claim(True, text(reply[1]), int(reply[2]), tuple(text(n) for n in reply[3:]))

    def give_back(self, name: str, *, actor: str, user: str = "", op: Op | None = None) -> Outcome:
        return self.scripts.run_on_vm(name, "give_back", actor, [name, user], op=op)

    def extend_vm(
        self, name: str, hours: int, *, actor: str, user: str = "", op: Op | None = None
    ) -> Outcome:
        if int(hours) <= 0:
            raise ValueError("a lifetime is a positive number of hours")
        return self.scripts.run_on_vm(name, "extend_vm", actor, [name, user, int(hours)], op=op)

    def tag_vm(
        self,
        name: str,
        tags: Mapping[str, str],
        *,
        actor: str,
        user: str = "",
        op: Op | None = None,
    ) -> Outcome:
        flat = [str(x) for pair in tags.items() for x in pair]
        return self.scripts.run_on_vm(name, "tag_vm", actor, [name, user, *flat], op=op)

    def reset_pool(self, pool: str, *, actor: str, op: Op | None = None) -> list[str]:
        """Send the pool's ready VMs to destruction, and return the VMs recycled.

        The reset is recorded so that no VM reserved before it becomes ready
        (pool_reset.lua). Held VMs are never touched.
        """
        reply = self.scripts.run("pool_reset", [], actor, "", [validate_pool_name(pool)], op)
        return [text(n) for n in reply[3:]]

    # -- reads --------------------------------------------------------------------------
    def vm_history(self, name: str) -> list[AuditEntry]:
        """A warm-pool VM's own trail (up to its claim by a request, if any)."""
        return reads.trail(self.redis, self.keys.vm_audit(validate_vm_name(name)))

    def warm_counts(self, pools: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per pool: ``ready`` VMs, and ``warming`` (its own reserved and booting ones).

        A request's VMs are not counted. The top-up job's deficit is made of these, and
        pool_reserve.lua counts the same inside its unit.
        """
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
        """The pools whose VM indexes exist in Redis (any state), configured or not.

        One SCAN of the keyspace, so only the rare passes use it (the reap pass, `vmpool
        pools`, the audit). A key of another fleet whose prefix starts like ours and
        goes on with ':pool:' is not a pool name and is skipped.
        """
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

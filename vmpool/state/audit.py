"""Checks the invariants (docs/invariants.md) over live Redis state and providers.

- ``check_trail`` judges one request's audit trail on its own (invariants 1, 2, 5). It
  is a pure function, so the race tests can run it over any store's trail, the naive
  reference included.
- ``audit_state`` walks every request and VM record, the indexes and the providers'
  inventories (invariants 3 and 4, and the trails), and, given the quotas, invariant 11
  (:mod:`vmpool.state.quota_audit`).

Each problem is one ``Violation``: the invariant it breaks and one line saying what was
seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from vmpool.state import reads
from vmpool.state.keys import INDEXED_VM_STATES
from vmpool.state.quota_audit import Peak, QuotaOf, check_quotas, user_peaks
from vmpool.state.records import AuditEntry, RequestRecord, VMRecord, decode_trail
from vmpool.state.store import Store
from vmpool.state.transitions import (
    NONE,
    REQUEST_LIVE,
    REQUEST_TERMINAL,
    VM_AT_PROVIDER,
    request_transition_allowed,
    vm_transition_allowed,
)

INVARIANTS = {
    1: "a terminal request never leaves its state",
    2: "a ready request is never failed; its VMs are destroyed only after delete or lifetime end",
    3: "every provider VM is accounted for; none is assigned to two requests",
    4: "every request settles within its TTL plus one sweep interval",
    5: "audit trails have contiguous versions and only allowed transitions",
    6: "a VM is held by at most one owner (a checkout or one request)",
    7: "a VM is never at once ready in a pool and held",
    8: "a held VM past its lifetime is reaped within one reap interval",
    11: "no user holds more than their quota, now or at any time the trails tell",
}
# The invariants the audit checks, as a reader counts them ("1-8, 11").
CHECKED = "1-8, 11"
# The reasons under which a ready request's VM may leave it (invariant 2).
RELEASE_REASONS = frozenset({"lifetime ended", "given back"})


@dataclass(frozen=True)
class Violation:
    invariant: int
    subject: str
    message: str

    def line(self) -> str:
        return f"invariant {self.invariant}: {self.subject}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Trail:
    """What a trail has said so far, while it is read oldest entry first."""

    subject: str
    status: str = NONE
    was_ready: bool = False
    expected_version: int = 1
    vm_states: dict[str, str] = field(default_factory=dict)
    out: list[Violation] = field(default_factory=list)

    def flag(self, invariant: int, message: str) -> None:
        self.out.append(Violation(invariant, self.subject, message))


def check_trail(request_id: str, entries: Sequence[AuditEntry]) -> list[Violation]:
    """Invariants 1, 2 and 5 over one request's audit trail, oldest entry first."""
    trail = _Trail(f"request {request_id}")
    for e in entries:
        if e.version != trail.expected_version:
            trail.flag(5, f"version {e.version} where {trail.expected_version} was due")
        trail.expected_version = e.version + 1
        if e.entity == "request":
            _request_entry(trail, e)
        elif e.entity.startswith("vm:"):
            _vm_entry(trail, e, e.entity[3:])
        else:
            trail.flag(5, f"unknown entity {e.entity!r}")
    return trail.out


def _request_entry(trail: _Trail, e: AuditEntry) -> None:
    if e.src != trail.status:
        trail.flag(5, f"entry {e.version} moves from {e.src} but was {trail.status}")
    if trail.status in REQUEST_TERMINAL:
        trail.flag(1, f"left terminal {trail.status} for {e.dst} at v{e.version}")
    elif trail.was_ready and e.dst == "failed":
        trail.flag(2, f"ready request failed at v{e.version}")
    elif not request_transition_allowed(e.src, e.dst):
        trail.flag(5, f"{e.src} -> {e.dst} is not allowed")
    trail.status = e.dst
    trail.was_ready = trail.was_ready or e.dst == "ready"


def _vm_entry(trail: _Trail, e: AuditEntry, name: str) -> None:
    current = trail.vm_states.get(name, NONE)
    if current == NONE and (e.src, e.dst) == ("ready", "running"):
        current = "ready"  # claimed from a warm pool: its earlier life is in its own trail
    if e.src != current:
        trail.flag(5, f"VM {name} moves from {e.src} but was {current}")
    if not vm_transition_allowed(e.src, e.dst):
        trail.flag(5, f"VM {name}: {e.src} -> {e.dst} is not allowed")
    released = e.src == "running" and e.dst == "completed"
    if released and trail.status == "ready" and e.reason not in RELEASE_REASONS:
        trail.flag(2, f"VM {name} of the ready request released: {e.reason}")
    if e.dst == "running" and e.src != "running" and trail.status != "pending":
        trail.flag(1, f"VM {name} attached to a {trail.status} request")
    trail.vm_states[name] = e.dst


def check_vm_trail(name: str, entries: Sequence[AuditEntry]) -> list[Violation]:
    """Invariant 5 over a warm-pool VM's own trail (Keys.vm_audit), oldest first."""
    out: list[Violation] = []
    state, expected = NONE, 1
    for e in entries:
        if e.version != expected:
            out.append(Violation(5, f"vm {name}", f"version {e.version} where {expected} was due"))
        expected = e.version + 1
        if e.entity != f"vm:{name}" or e.src != state:
            out.append(
                Violation(5, f"vm {name}", f"entry {e.version} moves from {e.src} but was {state}")
            )
        if not vm_transition_allowed(e.src, e.dst):
            out.append(Violation(5, f"vm {name}", f"{e.src} -> {e.dst} is not allowed"))
        state = e.dst
    return out


def retired_pool_notes(store: Store, configured: Iterable[str]) -> list[str]:
    """One line per pool the config no longer names that still has VMs.

    Such a pool was removed or renamed. It is not a violation while the reap pass finishes
    its VMs: ready ones are recycled and destroyed, held ones reaped at their lifetime's
    end. It is shown until they are gone.
    """
    retired = sorted(store.pools.indexed_pools() - set(configured))
    lines = []
    for pool, counts in store.pool_counts(retired).items():
        held = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        if held:
            lines.append(f"pool {pool} is not configured: {held}; reap_running finishes them")
    return lines


def _scan(store: Store, pattern: str) -> Iterable[str]:
    for key in store.redis.scan_iter(match=pattern, count=1000):
        yield key.decode() if isinstance(key, bytes) else str(key)


def audit_state(
    store: Store,
    providers: Mapping[str, Any],
    *,
    sweep_interval_s: float,
    reap_interval_s: float | None = None,
    now: float | None = None,
    quota_of: QuotaOf | None = None,
) -> list[Violation]:
    """Every invariant over what Redis and the providers hold right now.

    ``reap_interval_s`` (the ``reap_running`` interval) enables invariant 8. Without it a
    held VM's lifetime is not judged. ``quota_of`` (a user's max_vms and max_cores, from
    the config) enables invariant 11 (:mod:`vmpool.state.quota_audit`).

    ``providers`` are the configured provider instances by name. A VM whose provider is not
    among them is reported (invariant 3: it can never be destroyed). An empty mapping skips
    every provider check (a store-only audit).
    """
    now = store.server_time() if now is None else now
    requests = _read_requests(store)
    request_trails = _trails(store, [store.keys.request_audit(rid) for rid in requests])
    out = _check_requests(requests, request_trails, now, sweep_interval_s)
    vms = _read_vms(store)
    vm_trails = _warm_trails(store, vms)
    out += _check_vm_owners(requests, vms)
    out += _check_holders(vms, vm_trails, now, reap_interval_s)
    out += _check_indexes(store, vms)
    out += _check_inventory(providers, vms)
    out += _check_reachable(providers, vms)
    if quota_of is not None:
        peaks = user_peaks(requests, request_trails, vm_trails, vms)
        found = check_quotas(_counted(store), vms, peaks, quota_of)
        out += [Violation(11, f"user {user}", problem) for user, problem in found]
    return out


def quota_peaks(store: Store) -> dict[str, Peak]:
    """Per user, the most VMs and cores held at once, as the trails tell (``vmpool audit``)."""
    requests = _read_requests(store)
    request_trails = _trails(store, [store.keys.request_audit(rid) for rid in requests])
    vms = _read_vms(store)
    return user_peaks(requests, request_trails, _warm_trails(store, vms), vms)


def _counted(store: Store) -> dict[str, tuple[int, int]]:
    """The scripts' count per user: (VMs, cores)."""
    return {user: (h.vms, h.cores) for user, h in store.quotas.held().items() if h.vms or h.cores}


def _warm_trails(store: Store, vms: Mapping[str, VMRecord]) -> dict[str, list[AuditEntry]]:
    """The own trails of the warm-pool VMs (no request holds them), by VM."""
    warm = [vm.name for vm in vms.values() if not vm.request_id]
    return dict(zip(warm, _trails(store, [store.keys.vm_audit(n) for n in warm]), strict=True))


# Records read per round trip (one MULTI/EXEC, so each chunk is one snapshot).
_CHUNK = 200


def _read_requests(store: Store) -> dict[str, RequestRecord]:
    """Every request record, a chunk of them per round trip."""
    rids = [store.keys.request_id_from_key(k) for k in _scan(store, store.keys.request_pattern())]
    requests: dict[str, RequestRecord] = {}
    for start in range(0, len(rids), _CHUNK):
        chunk = rids[start : start + _CHUNK]
        pipe = store.redis.pipeline(transaction=True)
        for rid in chunk:
            reads.queue_request(pipe, store.keys, rid)
        replies = pipe.execute()
        for i, rid in enumerate(chunk):
            record = reads.request_from(replies[2 * i], replies[2 * i + 1])
            if record is not None:
                requests[rid] = record
    return requests


def _trails(store: Store, keys: Sequence[str]) -> list[list[AuditEntry]]:
    """The trails at ``keys``, oldest entry first, in one pipeline.

    A trail kept as a stream (the earlier form) is read on its own.
    """
    pipe = store.redis.pipeline(transaction=False)
    for key in keys:
        pipe.lrange(key, 0, -1)
    out = []
    for key, raw in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, redis.ResponseError):
            out.append(reads.trail(store.redis, key))  # WRONGTYPE: the stream form
        else:
            out.append(decode_trail(raw or []))
    return out


def _check_requests(
    requests: Mapping[str, RequestRecord],
    trails: Sequence[Sequence[AuditEntry]],
    now: float,
    sweep_interval_s: float,
) -> list[Violation]:
    """Invariants 1, 2 and 5 per trail, 4 (settled in time), 3 (one request per VM)."""
    out: list[Violation] = []
    owner_of: dict[str, str] = {}
    for (rid, req), trail in zip(requests.items(), trails, strict=True):
        out += check_trail(rid, trail)
        if req.status == "pending" and now > req.fail_at + sweep_interval_s:
            late = f"still pending {now - req.fail_at:.1f}s past its TTL"
            out.append(Violation(4, f"request {rid}", late))
        for name in req.vm_names:
            if name in owner_of and owner_of[name] != rid:
                out.append(Violation(3, f"vm {name}", f"in requests {owner_of[name]} and {rid}"))
            owner_of[name] = rid
    return out


def _read_vms(store: Store) -> dict[str, VMRecord]:
    """Every VM record.

    A VM name holds no ':', so the ``...:fence`` keys are skipped, whatever characters the
    key prefix has.
    """
    vm_prefix = store.keys.vm_prefix()
    names = [
        name
        for key in _scan(store, store.keys.vm_pattern())
        if ":" not in (name := key[len(vm_prefix) :])
    ]
    return {vm.name: vm for vm in store.get_vms(names)}


def _check_vm_owners(
    requests: Mapping[str, RequestRecord], vms: Mapping[str, VMRecord]
) -> list[Violation]:
    out: list[Violation] = []
    for vm in vms.values():
        owner = requests.get(vm.request_id)
        if owner is not None and vm.name not in owner.vm_names:
            out.append(Violation(3, f"vm {vm.name}", f"not in its request {vm.request_id}"))
        if vm.state == "running" and owner is not None and owner.status not in REQUEST_LIVE:
            out.append(Violation(3, f"vm {vm.name}", f"running for a {owner.status} request"))
    return out


def _check_holders(
    vms: Mapping[str, VMRecord],
    trails: Mapping[str, Sequence[AuditEntry]],
    now: float,
    reap_interval_s: float | None,
) -> list[Violation]:
    """Invariants 6, 7 and 8, and invariant 5 over the warm-pool VMs' own trails."""
    out: list[Violation] = []
    for vm in vms.values():
        subject = f"vm {vm.name}"
        if vm.request_id and vm.owner:
            out.append(
                Violation(
                    6, subject, f"checked out by {vm.owner} and held by request {vm.request_id}"
                )
            )
        if vm.state == "ready" and (vm.request_id or vm.owner or vm.checkout_at is not None):
            out.append(Violation(7, subject, "ready in its pool but held"))
        if vm.state == "running" and not vm.request_id and vm.checkout_at is None:
            out.append(Violation(6, subject, "running but held by nobody"))
        end = vm.lifetime_end
        overdue = end is not None and reap_interval_s is not None and now > end + reap_interval_s
        if vm.state == "running" and end is not None and overdue:
            out.append(Violation(8, subject, f"{now - end:.1f}s past its lifetime"))
        if not vm.request_id:
            out += check_vm_trail(vm.name, trails[vm.name])
    return out


def _check_indexes(store: Store, vms: Mapping[str, VMRecord]) -> list[Violation]:
    """The per-pool indexes agree with the records."""
    out: list[Violation] = []
    pool_prefix = store.keys.pool_state_prefix()
    indexes = []
    for key in _scan(store, store.keys.pool_state_pattern()):
        pool, _, state = key[len(pool_prefix) :].rpartition(":")
        if state in INDEXED_VM_STATES:
            indexes.append((pool, state))
    pipe = store.redis.pipeline(transaction=False)
    for pool, state in indexes:
        pipe.zrange(store.keys.pool_state(pool, state), 0, -1)
    for (pool, state), members in zip(indexes, pipe.execute(), strict=True):
        for raw in members:
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            vm_rec = vms.get(name)
            if vm_rec is None or vm_rec.state != state or vm_rec.pool != pool:
                seen = "missing" if vm_rec is None else vm_rec.state
                out.append(Violation(3, f"vm {name}", f"indexed {pool}:{state} but is {seen}"))
    return out


def _check_reachable(providers: Mapping[str, Any], vms: Mapping[str, VMRecord]) -> list[Violation]:
    """Every VM not yet destroyed names a configured provider (invariant 3).

    A VM whose provider left the config is never checked, reaped at its provider or
    destroyed.
    """
    if not providers:
        return []
    return [
        Violation(
            3,
            f"vm {vm.name}",
            f"its provider {vm.provider!r} is not configured: it cannot be checked or destroyed",
        )
        for vm in vms.values()
        if vm.state in INDEXED_VM_STATES and vm.provider not in providers
    ]


def _check_inventory(providers: Mapping[str, Any], vms: Mapping[str, VMRecord]) -> list[Violation]:
    """Every VM a provider holds is accounted for (invariant 3: none leaks)."""
    out: list[Violation] = []
    for provider_name, provider in providers.items():
        for pvm in provider.inventory():
            vm_rec = vms.get(pvm.name)
            if vm_rec is None and not pvm.owned:
                continue  # under a mark the fleet does not own: maybe another install's
            if vm_rec is None:
                # a create in flight has a reserved record. Anything else is a leak
                problem = f"held by {provider_name} with no record"
            elif vm_rec.state == "destroyed":
                problem = f"held by {provider_name} but destroyed"
            elif vm_rec.state not in VM_AT_PROVIDER:
                problem = f"in unknown state {vm_rec.state}"
            else:
                continue
            out.append(Violation(3, f"vm {pvm.name}", problem))
    return out

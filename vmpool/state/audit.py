"""Checks the invariants of CONTRACT.md over live Redis state and the provider's inventory.

``check_trail`` judges one request's audit trail on its own (invariants 1, 2, 5); it is
a pure function so that the race tests can run it over any store's trail, the naive
reference included. ``audit_state`` walks every request and VM record, the indexes and
the providers' inventories (invariants 3 and 4, and the trails). Each problem is one
``Violation`` with the invariant it breaks and one line saying what was seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vmpool.state.keys import INDEXED_VM_STATES, Keys
from vmpool.state.store import AuditEntry, RequestRecord, Store, VMRecord
from vmpool.state.transitions import (
    NONE,
    REQUEST_LIVE,
    REQUEST_TERMINAL,
    VM_LIVE,
    request_transition_allowed,
    vm_transition_allowed,
)

INVARIANTS = {
    1: "a terminal request never leaves its state",
    2: "a ready request is never failed; its VMs are destroyed only after delete or lifetime end",
    3: "every provider VM is accounted for; none is assigned to two requests",
    4: "every request settles within its TTL plus one sweep interval",
    5: "audit trails have contiguous versions and only allowed transitions",
}


@dataclass(frozen=True)
class Violation:
    invariant: int
    subject: str
    message: str

    def line(self) -> str:
        return f"invariant {self.invariant}: {self.subject}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_trail(request_id: str, entries: Sequence[AuditEntry]) -> list[Violation]:
    """Invariants 1, 2 and 5 over one request's audit trail, oldest entry first."""
    out: list[Violation] = []
    subject = f"request {request_id}"
    status = NONE
    vm_states: dict[str, str] = {}
    was_ready = False
    expected_version = 1
    for e in entries:
        if e.version != expected_version:
            out.append(
                Violation(5, subject, f"version {e.version} where {expected_version} was due")
            )
        expected_version = e.version + 1
        if e.entity == "request":
            if e.src != status:
                out.append(
                    Violation(5, subject, f"entry {e.version} moves from {e.src} but was {status}")
                )
            if status in REQUEST_TERMINAL:
                out.append(
                    Violation(1, subject, f"left terminal {status} for {e.dst} at v{e.version}")
                )
            elif was_ready and e.dst == "failed":
                out.append(Violation(2, subject, f"ready request failed at v{e.version}"))
            elif not request_transition_allowed(e.src, e.dst):
                out.append(Violation(5, subject, f"{e.src} -> {e.dst} is not allowed"))
            status = e.dst
            was_ready = was_ready or e.dst == "ready"
        elif e.entity.startswith("vm:"):
            name = e.entity[3:]
            current = vm_states.get(name, NONE)
            if e.src != current:
                out.append(
                    Violation(5, subject, f"VM {name} moves from {e.src} but was {current}")
                )
            if not vm_transition_allowed(e.src, e.dst):
                out.append(Violation(5, subject, f"VM {name}: {e.src} -> {e.dst} is not allowed"))
            if (
                e.src == "running"
                and e.dst == "completed"
                and status == "ready"
                and e.reason != "lifetime ended"
            ):
                out.append(
                    Violation(2, subject, f"VM {name} of the ready request released: {e.reason}")
                )
            if e.dst == "running" and status != "pending":
                out.append(Violation(1, subject, f"VM {name} attached to a {status} request"))
            vm_states[name] = e.dst
        else:
            out.append(Violation(5, subject, f"unknown entity {e.entity!r}"))
    return out


def _scan(store: Store, pattern: str) -> Iterable[str]:
    for key in store.redis.scan_iter(match=pattern, count=1000):
        yield key.decode() if isinstance(key, bytes) else str(key)


def audit_state(
    store: Store,
    providers: Mapping[str, Any],
    *,
    sweep_interval_s: float,
    now: float | None = None,
) -> list[Violation]:
    """All five invariants over what Redis and the providers hold right now."""
    keys: Keys = store.keys
    now = store.server_time() if now is None else now
    out: list[Violation] = []

    requests: dict[str, RequestRecord] = {}
    for key in _scan(store, keys.request_pattern()):
        rid = keys.request_id_from_key(key)
        record = store.get_request(rid)
        if record is not None:
            requests[rid] = record

    owner_of: dict[str, str] = {}
    for rid, req in requests.items():
        out += check_trail(rid, store.history(rid))
        if req.status == "pending" and now > req.fail_at + sweep_interval_s:
            out.append(
                Violation(
                    4, f"request {rid}", f"still pending {now - req.fail_at:.1f}s past its TTL"
                )
            )
        for name in req.vm_names:
            if name in owner_of and owner_of[name] != rid:
                out.append(Violation(3, f"vm {name}", f"in requests {owner_of[name]} and {rid}"))
            owner_of[name] = rid

    vms: dict[str, VMRecord] = {}
    vm_prefix = keys.vm_prefix()
    names = [k[len(vm_prefix) :] for k in _scan(store, keys.vm_pattern()) if k.count(":") == 2]
    for vm in store.get_vms(names):
        vms[vm.name] = vm
        owner = requests.get(vm.request_id)
        if owner is not None and vm.name not in owner.vm_names:
            out.append(Violation(3, f"vm {vm.name}", f"not in its request {vm.request_id}"))
        if vm.state == "running" and owner is not None and owner.status not in REQUEST_LIVE:
            out.append(Violation(3, f"vm {vm.name}", f"running for a {owner.status} request"))

    # The per-pool indexes agree with the records.
    pool_prefix = keys.pool_state_prefix()
    for key in _scan(store, keys.pool_state_pattern()):
        pool, _, state = key[len(pool_prefix) :].rpartition(":")
        if state not in INDEXED_VM_STATES:
            continue
        for raw in store.redis.zrange(key, 0, -1):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            vm_rec = vms.get(name)
            if vm_rec is None or vm_rec.state != state or vm_rec.pool != pool:
                seen = "missing" if vm_rec is None else vm_rec.state
                out.append(Violation(3, f"vm {name}", f"indexed {pool}:{state} but is {seen}"))

    # Every VM a provider holds is accounted for.
    for provider_name, provider in providers.items():
        for pvm in provider.inventory():
            vm_rec = vms.get(pvm.name)
            if vm_rec is None:
                # a create in flight has a reserved record; anything else is a leak
                out.append(
                    Violation(3, f"vm {pvm.name}", f"held by {provider_name} with no record")
                )
            elif vm_rec.state == "destroyed":
                out.append(
                    Violation(3, f"vm {pvm.name}", f"held by {provider_name} but destroyed")
                )
            elif vm_rec.state not in VM_LIVE and vm_rec.state != "completed":
                out.append(Violation(3, f"vm {pvm.name}", f"in unknown state {vm_rec.state}"))
    return out

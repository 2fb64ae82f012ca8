"""A request's or a VM's timeline: every transition, oldest first, from the audit trails.

A request's trail (``keys.request_audit``) holds its own transitions and those of its
VMs while they belong to it. A warm-pool VM's own trail (``keys.vm_audit``) holds its
life in its pool, up to a request's claim. A timeline merges the trails concerned by
server time, each entry with its version, actor and reason as the store's scripts wrote
them, and says what the trails only imply:

- ``provider_call``: the provider call a VM's transition records (``create``: reserved
  to booting, or a failed create; ``ready_check``: booting to ready or running, or a
  failed boot; ``destroy``: to destroyed);
- ``error``: the entry is a failure. A request that failed, or a VM whose create or boot
  failed: its reason is the one vm_failed recorded, the provider's error text.

`vmpool request history` and the API's ``/ondemandvm/<id>/timeline`` and
``/vm/<hostname>/timeline`` show these entries; this module is their one reader.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vmpool.state.records import AuditEntry, VMRecord
from vmpool.state.store import Store
from vmpool.state.transitions import RequestStatus, VMState

__all__ = ["ProviderCall", "TimelineEntry", "request_timeline", "vm_timeline"]

ProviderCall = Literal["create", "ready_check", "destroy"]

_MADE = (VMState.RESERVED, VMState.PENDING)  # the states a VM fails from


@dataclass(frozen=True)
class TimelineEntry:
    """One transition of a request or a VM, as a timeline shows it."""

    time: float
    entity: str  # 'request' or 'vm:<name>'
    src: str
    dst: str
    version: int
    actor: str
    reason: str
    provider_call: ProviderCall | None
    error: bool

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (the trail's names: ``from``, ``to``)."""
        return {
            "time": self.time,
            "entity": self.entity,
            "from": self.src,
            "to": self.dst,
            "version": self.version,
            "actor": self.actor,
            "reason": self.reason,
            "provider_call": self.provider_call,
            "error": self.error,
        }


def request_timeline(store: Store, request_id: str) -> list[TimelineEntry] | None:
    """The request's timeline, or None when it has no record and no trail."""
    trail = store.history(request_id)
    vms = store.request_vms(request_id)
    if not trail and store.get_request(request_id) is None:
        return None
    own = [e for vm in vms for e in store.pools.vm_history(vm.name)]
    return _merged([*trail, *own], vms)


def vm_timeline(store: Store, name: str) -> list[TimelineEntry] | None:
    """The VM's timeline (its own trail and its request's entries about it), or None."""
    vm = store.get_vm(name)
    own = store.pools.vm_history(name)
    if vm is None and not own:
        return None
    entity = f"vm:{name}"
    theirs = store.history(vm.request_id) if vm is not None and vm.request_id else []
    mine = [e for e in theirs if e.entity == entity]
    return _merged([*own, *mine], [vm] if vm is not None else [])


def _merged(entries: Sequence[AuditEntry], vms: Iterable[VMRecord]) -> list[TimelineEntry]:
    """The entries by server time (a stable sort: a trail's own order breaks ties).

    A warm VM's claim by a request is written in both trails, in one unit (same time):
    it is shown once, as the trail given first tells it."""
    errors = {f"vm:{vm.name}": vm.error for vm in vms if vm.error}
    seen: set[tuple[float, str, str, str]] = set()
    out = []
    for e in sorted(entries, key=lambda e: e.time):
        if (e.time, e.entity, e.src, e.dst) not in seen:
            seen.add((e.time, e.entity, e.src, e.dst))
            out.append(_entry(e, errors))
    return out


def _entry(e: AuditEntry, errors: dict[str, str]) -> TimelineEntry:
    failed = (
        e.dst == RequestStatus.FAILED
        if e.entity == "request"
        else e.dst == VMState.COMPLETED and e.src in _MADE and errors.get(e.entity) == e.reason
    )
    return TimelineEntry(
        time=e.time,
        entity=e.entity,
        src=e.src,
        dst=e.dst,
        version=e.version,
        actor=e.actor,
        reason=e.reason,
        provider_call=None if e.entity == "request" else _provider_call(e, failed),
        error=failed,
    )


def _provider_call(e: AuditEntry, failed: bool) -> ProviderCall | None:
    """The provider call a VM's transition records, if any."""
    if e.dst == VMState.DESTROYED:
        return "destroy"
    if e.src == VMState.RESERVED and (e.dst == VMState.PENDING or failed):
        return "create"
    if e.src == VMState.PENDING and (e.dst in (VMState.READY, VMState.RUNNING) or failed):
        return "ready_check"
    return None

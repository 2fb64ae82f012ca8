"""The state machines of requests and VMs: the one table every script enforces.

The Lua scripts in ``vmpool/state/scripts/`` do not spell their own copy of these edges: the
store renders this table into each script (``lua_tables()``), so the table here, the
scripts, the audit checker and the docs cannot disagree.

Request::

    (none) -> pending -> ready -> deleted
                     \\-> failed
                     \\-> deleted

``failed`` and ``deleted`` are absorbing. A ``ready`` request is never ``failed``.

VM::

    (none) -> reserved -> pending -> running -> completed -> destroyed
                   \\          \\------------------^
                    \\------------------------------^
    warm pool:            pending -> ready -> running (claimed: a checkout or a request)
                                          \\-> completed (recycled, failed its check)
    held:                 running -> running (lifetime extended, tagged)
    on hold:              pending -> on_hold -> destroyed (hold_failed_minutes over)

``reserved`` is the intent record written before the provider is called. ``completed``
means "on its way to destruction". ``destroyed`` is a tombstone kept for ``data_ttl``.
``ready`` is a warm-pool VM nobody holds (vmpool/state/pool_store.py). A request's own
VMs never pass through it. ``on_hold`` is a VM that failed its ready check, kept at its
provider for debugging until ``hold_until`` (Nodepool's autohold): in no pool's ready
set and in no request's slot, so never handed out, then destroyed as a completed VM is.
``running -> running`` is a change in place of a held VM (its lifetime or tags),
checked, versioned and in the trail like any other edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = [
    "NONE",
    "REQUEST_LIVE",
    "REQUEST_TERMINAL",
    "REQUEST_TRANSITIONS",
    "VM_AT_PROVIDER",
    "VM_LIVE",
    "VM_TO_DESTROY",
    "VM_TRANSITIONS",
    "RequestStatus",
    "VMState",
    "lua_tables",
    "request_transition_allowed",
    "vm_transition_allowed",
]


class RequestStatus(StrEnum):
    """A request's ``status`` field: the request machine's states.

    Each member equals its string, the one Redis holds and the API returns."""

    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"
    DELETED = "deleted"


class VMState(StrEnum):
    """A VM record's ``state`` field: the VM machine's states.

    Each member equals its string, the one Redis holds and the API returns."""

    RESERVED = "reserved"
    PENDING = "pending"
    READY = "ready"
    RUNNING = "running"
    COMPLETED = "completed"
    ON_HOLD = "on_hold"
    DESTROYED = "destroyed"


NONE = "none"  # the "from" of a record's first audit entry

_R = RequestStatus
REQUEST_TRANSITIONS: Mapping[str, frozenset[RequestStatus]] = {
    NONE: frozenset({_R.PENDING}),
    _R.PENDING: frozenset({_R.READY, _R.FAILED, _R.DELETED}),
    _R.READY: frozenset({_R.DELETED}),
    _R.FAILED: frozenset(),
    _R.DELETED: frozenset(),
}
REQUEST_TERMINAL = frozenset({_R.FAILED, _R.DELETED})
REQUEST_LIVE = frozenset({_R.PENDING, _R.READY})

_V = VMState
VM_TRANSITIONS: Mapping[str, frozenset[VMState]] = {
    NONE: frozenset({_V.RESERVED}),
    _V.RESERVED: frozenset({_V.PENDING, _V.COMPLETED}),
    _V.PENDING: frozenset({_V.RUNNING, _V.READY, _V.COMPLETED, _V.ON_HOLD}),
    _V.READY: frozenset({_V.RUNNING, _V.COMPLETED}),
    _V.RUNNING: frozenset({_V.RUNNING, _V.COMPLETED}),
    _V.COMPLETED: frozenset({_V.DESTROYED}),
    _V.ON_HOLD: frozenset({_V.DESTROYED}),
    _V.DESTROYED: frozenset(),
}
# VM states in which the VM still counts toward its request's slot.
VM_LIVE = frozenset({_V.RESERVED, _V.PENDING, _V.RUNNING})
# VM states in which the provider may hold the VM (what the inventory may show).
VM_AT_PROVIDER = VM_LIVE | {_V.READY, _V.COMPLETED, _V.ON_HOLD}
# VM states the destroy job takes: on its way to destruction (on hold: once the hold is over).
VM_TO_DESTROY = frozenset({_V.COMPLETED, _V.ON_HOLD})


def _check_vocabulary(table: Mapping[str, frozenset[StrEnum]], states: type[StrEnum]) -> None:
    """Refuse a table whose states are not exactly the enum's members (plus ``NONE``)."""
    named = set(table) | {dst for dsts in table.values() for dst in dsts}
    if named != {NONE, *states}:
        raise RuntimeError(f"{states.__name__} and its transition table disagree")


_check_vocabulary(REQUEST_TRANSITIONS, RequestStatus)
_check_vocabulary(VM_TRANSITIONS, VMState)


def request_transition_allowed(src: str, dst: str) -> bool:
    """Whether the request machine has the edge ``src -> dst``."""
    return dst in REQUEST_TRANSITIONS.get(src, frozenset())


def vm_transition_allowed(src: str, dst: str) -> bool:
    """Whether the VM machine has the edge ``src -> dst``."""
    return dst in VM_TRANSITIONS.get(src, frozenset())


def _lua_table(name: str, table: Mapping[str, frozenset[StrEnum]]) -> str:
    rows = []
    for src in sorted(table):
        dsts = ", ".join(f"[{str(dst)!r}] = true" for dst in sorted(table[src]))
        rows.append(f"  [{str(src)!r}] = {{{dsts}}},")
    return f"local {name} = {{\n" + "\n".join(rows) + "\n}\n"


def lua_tables() -> str:
    """The transition tables as Lua source, prepended to every store script."""
    return _lua_table("REQUEST_EDGES", REQUEST_TRANSITIONS) + _lua_table("VM_EDGES", VM_TRANSITIONS)

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

``reserved`` is the intent record written before the provider is called; ``completed``
means "on its way to destruction"; ``destroyed`` is a tombstone kept for ``data_ttl``.
``ready`` is a warm-pool VM nobody holds (vmpool/state/pool_store.py); a request's own
VMs never pass through it. ``running -> running`` is a change in place of a held VM
(its lifetime or tags), checked, versioned and in the trail like any other edge.
"""

from __future__ import annotations

from collections.abc import Mapping

NONE = "none"  # the "from" of a record's first audit entry

REQUEST_TRANSITIONS: Mapping[str, frozenset[str]] = {
    NONE: frozenset({"pending"}),
    "pending": frozenset({"ready", "failed", "deleted"}),
    "ready": frozenset({"deleted"}),
    "failed": frozenset(),
    "deleted": frozenset(),
}
REQUEST_TERMINAL = frozenset({"failed", "deleted"})
REQUEST_LIVE = frozenset({"pending", "ready"})

VM_TRANSITIONS: Mapping[str, frozenset[str]] = {
    NONE: frozenset({"reserved"}),
    "reserved": frozenset({"pending", "completed"}),
    "pending": frozenset({"running", "ready", "completed"}),
    "ready": frozenset({"running", "completed"}),
    "running": frozenset({"running", "completed"}),
    "completed": frozenset({"destroyed"}),
    "destroyed": frozenset(),
}
# VM states in which the VM still counts toward its request's slot.
VM_LIVE = frozenset({"reserved", "pending", "running"})
# VM states in which the provider may hold the VM (what the inventory may show).
VM_AT_PROVIDER = VM_LIVE | {"ready", "completed"}


def request_transition_allowed(src: str, dst: str) -> bool:
    return dst in REQUEST_TRANSITIONS.get(src, frozenset())


def vm_transition_allowed(src: str, dst: str) -> bool:
    return dst in VM_TRANSITIONS.get(src, frozenset())


def _lua_table(name: str, table: Mapping[str, frozenset[str]]) -> str:
    rows = []
    for src in sorted(table):
        dsts = ", ".join(f"[{dst!r}] = true" for dst in sorted(table[src]))
        rows.append(f"  [{src!r}] = {{{dsts}}},")
    return f"local {name} = {{\n" + "\n".join(rows) + "\n}\n"


def lua_tables() -> str:
    """The transition tables as Lua source, prepended to every store script."""
    return _lua_table("REQUEST_EDGES", REQUEST_TRANSITIONS) + _lua_table("VM_EDGES", VM_TRANSITIONS)

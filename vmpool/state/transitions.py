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

``reserved`` is the intent record written before the provider is called; ``completed``
means "on its way to destruction"; ``destroyed`` is a tombstone kept for ``data_ttl``.
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
    "pending": frozenset({"running", "completed"}),
    "running": frozenset({"completed"}),
    "completed": frozenset({"destroyed"}),
    "destroyed": frozenset(),
}
# VM states in which the VM still counts toward its request's slot.
VM_LIVE = frozenset({"reserved", "pending", "running"})


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
    return _lua_table("REQUEST_EDGES", REQUEST_TRANSITIONS) + _lua_table(
        "VM_EDGES", VM_TRANSITIONS
    )

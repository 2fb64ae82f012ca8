"""The records the store reads and writes: requests, VMs, slots, audit entries, outcomes.

Plain frozen dataclasses built from Redis hashes (``from_hash``). Nothing here talks to
Redis. The store (:mod:`vmpool.state.store`) is what reads and changes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmpool.ids import validate_pool_name
from vmpool.state.transitions import RequestStatus, VMState

__all__ = [
    "AuditEntry",
    "Booted",
    "Outcome",
    "RequestRecord",
    "RequestSettings",
    "Slot",
    "SlotState",
    "VMRecord",
    "decode_hash",
    "decode_slots",
    "decode_stream_trail",
    "decode_trail",
    "encode_slots",
    "text",
    "texts",
]


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def texts(values: list[Any]) -> list[str]:
    """A reply's list of bulk strings (a set's members, an index's names) as str.

    The list itself when the client decodes (all its strings are str, so no copy of a
    100,000-name index), else each one decoded."""
    if not values or isinstance(values[0], str):
        return values
    return [text(v) for v in values]


def _float(value: Any, default: float | None = None) -> float | None:
    if value is None or value == "" or value == b"":
        return default
    return float(text(value))


@dataclass(frozen=True)
class Slot:
    """Part of a request: ``count`` VMs of ``pool``, asked for under the name ``alias``."""

    alias: str
    pool: str
    count: int

    @property
    def key(self) -> str:
        return f"{self.alias}:{self.pool}"


def encode_slots(slots: Iterable[Slot]) -> str:
    """vmpooler's ``requested`` format: ``alias:pool:n,alias:pool:n``."""
    merged: dict[tuple[str, str], int] = {}
    for slot in slots:
        validate_pool_name(slot.alias)
        validate_pool_name(slot.pool)
        if slot.count < 0:
            raise ValueError(f"negative count for {slot.alias}")
        merged[(slot.alias, slot.pool)] = merged.get((slot.alias, slot.pool), 0) + slot.count
    return ",".join(f"{a}:{p}:{n}" for (a, p), n in merged.items() if n > 0)


def decode_slots(requested: str) -> list[Slot]:
    slots = []
    for part in requested.split(","):
        if part:
            alias, pool, count = part.rsplit(":", 2)
            slots.append(Slot(alias, pool, int(count)))
    return slots


@dataclass(frozen=True)
class RequestSettings:
    """Per-request policy, fixed when the request is created and kept in its record.

    Every later transition applies the policy the request was accepted under."""

    ttl_s: float
    grace_s: float = 0.0
    max_vm_retries: int = 3
    vm_lifetime_s: float = 12 * 3600
    data_ttl_s: float = 168 * 3600
    # ABS's priority (1 highest, 3 lowest); how far ahead of its arrival it places the
    # request in line (vmpool.config.QuotaConfig.lead_s: 0 for priority 2); how far behind
    # its user's previous waiting request of that priority (the round of fair share: the
    # aging period; 0: none) (scripts/_line.lua)
    priority: int = 2
    lead_s: float = 0.0
    round_s: float = 0.0

    @classmethod
    def from_config(
        cls, config: Any, *, authenticated: bool = False, priority: int = 2
    ) -> RequestSettings:
        return cls(
            ttl_s=float(config.ondemand_request_ttl_s),
            grace_s=float(config.ondemand_request_grace_s),
            max_vm_retries=int(config.max_vm_retries),
            vm_lifetime_s=float(
                config.vm_lifetime_auth_s if authenticated else config.vm_lifetime_s
            ),
            data_ttl_s=float(config.data_ttl_s),
            priority=int(priority),
            lead_s=float(config.quotas.lead_s(priority)),
            round_s=float(config.quotas.priority_aging_s),
        )


@dataclass(frozen=True)
class Outcome:
    """What a transition did, or why it refused.

    ``ok`` with a ``code`` (``created``, ``fulfilled``, ``request_failed``...), or a
    refusal (``ok=False``) whose code says why. ``turns``: the requests whose turn for
    a clone slot came with the slot a transition gave back (vm_created.lua)."""

    ok: bool
    code: str
    version: int | None = None
    turns: tuple[str, ...] = ()

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> Outcome:
        ok = int(reply[0]) == 1
        version = int(reply[2]) if len(reply) > 2 and reply[2] is not None else None
        if version is not None and version < 0:
            version = None  # the request record had already expired
        turns = tuple(text(r) for r in reply[3:]) if len(reply) > 3 else ()
        return cls(ok, text(reply[1]), version, turns)


@dataclass(frozen=True)
class Booted:
    """A booted VM of a request, as its ready transition takes it (Store.vms_ready).

    ``fence``: the token of the VM's lock (None: not under a lock); ``hostname`` and
    ``address``: as :meth:`~vmpool.state.store.Store.vm_ready` takes them."""

    name: str
    request_id: str
    fence: int | None
    hostname: str = ""
    address: str = ""


@dataclass(frozen=True)
class VMRecord:
    name: str
    request_id: str
    alias: str
    pool: str
    template: str
    provider: str
    hostname: str
    state: VMState
    state_since: float | None
    attempt: int
    reserved_at: float | None
    created_at: float | None
    ready_at: float | None
    lifetime_end: float | None
    reason: str
    error: str
    # warm pools (vmpool/state/pool_store.py): who checked the VM out and when, whether
    # its holder gave it back, its tags (vmpooler's tag:<name> fields)
    owner: str = ""
    checkout_at: float | None = None
    given_back: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)
    # vmpooler's snapshot:<id> fields (snapshots taken) and disk ('+10gb:+20gb')
    snapshots: tuple[str, ...] = ()
    disks: tuple[str, ...] = ()
    # the address the cloud reported when the VM turned ready ('' when none)
    address: str = ""
    # on hold (it failed its ready check): kept until then for debugging
    hold_until: float | None = None
    # the user whose quota it counts against while reserved, booting or running ('' for
    # none), and its cores as counted
    quota_user: str = ""
    cores: int = 1

    @property
    def held_by_checkout(self) -> bool:
        """A warm-pool VM handed out by a checkout (no request holds it)."""
        return not self.request_id and self.checkout_at is not None

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> VMRecord:
        return cls(
            name=h["name"],
            request_id=h.get("request_id", ""),
            alias=h.get("alias", ""),
            pool=h.get("pool", ""),
            template=h.get("template", ""),
            provider=h.get("provider", ""),
            hostname=h.get("hostname", h["name"]),
            state=VMState(h.get("state", "")),
            state_since=_float(h.get("state_since")),
            attempt=int(h.get("attempt", "1") or 1),
            reserved_at=_float(h.get("reserved_at")),
            created_at=_float(h.get("created_at")),
            ready_at=_float(h.get("ready_at")),
            lifetime_end=_float(h.get("lifetime_end")),
            reason=h.get("reason", ""),
            error=h.get("error", ""),
            owner=h.get("owner", ""),
            checkout_at=_float(h.get("checkout_at")),
            given_back=h.get("given_back", "") == "1",
            tags={k[4:]: v for k, v in h.items() if k.startswith("tag:")},
            snapshots=tuple(k[9:] for k in h if k.startswith("snapshot:")),
            disks=tuple(h["disk"].split(":")) if h.get("disk") else (),
            address=h.get("address", ""),
            hold_until=_float(h.get("hold_until")),
            quota_user=h.get("quota_user", ""),
            cores=int(h.get("cores", "1") or 1),
        )


@dataclass(frozen=True)
class SlotState:
    alias: str
    pool: str
    want: int
    live: int
    have: int


@dataclass(frozen=True)
class RequestRecord:
    id: str
    status: RequestStatus
    version: int
    created: float
    deadline: float
    fail_at: float
    requested: str
    slots: tuple[SlotState, ...]
    need: int
    have: int
    unreserved: int
    retries: int
    max_retries: int
    failure_reason: str
    token_user: str
    token_hash: str
    vm_names: tuple[str, ...] = field(default=())
    # its priority, its place in line (scripts/_line.lua; its creation for a request
    # made before places) and when its ETA at creation said it would be ready (None: none)
    priority: int = 2
    place: float = 0.0
    eta_at: float | None = None

    @classmethod
    def from_hash(cls, h: Mapping[str, str], vm_names: Iterable[str] = ()) -> RequestRecord:
        slots = tuple(
            SlotState(
                s.alias,
                s.pool,
                int(h.get(f"want:{s.key}", s.count)),
                int(h.get(f"live:{s.key}", 0)),
                int(h.get(f"have:{s.key}", 0)),
            )
            for s in decode_slots(h.get("requested", ""))
        )
        return cls(
            id=h["id"],
            status=RequestStatus(h.get("status", "")),
            version=int(h.get("version", 0)),
            created=float(h.get("created", 0)),
            deadline=float(h.get("deadline", 0)),
            fail_at=float(h.get("fail_at", 0)),
            requested=h.get("requested", ""),
            slots=slots,
            need=int(h.get("need", 0)),
            have=int(h.get("have", 0)),
            unreserved=int(h.get("unreserved", 0)),
            retries=int(h.get("retries", 0)),
            max_retries=int(h.get("max_retries", 0)),
            failure_reason=h.get("failure_reason", ""),
            token_user=h.get("token_user", ""),
            token_hash=h.get("token_hash", ""),
            vm_names=tuple(sorted(vm_names)),
            priority=int(h.get("priority", 2) or 2),
            place=float(h.get("line_at") or h.get("created") or 0),
            eta_at=_float(h.get("eta_at")),
        )


@dataclass(frozen=True)
class AuditEntry:
    """One trail entry.

    ``stream_id``: its position in the trail ("0", "1", ...), or the stream id of a
    trail kept as a Redis stream (read by :func:`decode_stream_trail`)."""

    stream_id: str
    entity: str
    src: str
    dst: str
    version: int
    actor: str
    reason: str
    time: float


def decode_hash(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in raw.items()}


def decode_trail(rows: Sequence[Any]) -> list[AuditEntry]:
    """Decode a trail as the scripts write it (``_prelude.lua``'s ``audit``).

    Each row is a JSON array ``[entity, from, to, version, actor, reason, time]``."""
    entries = []
    for i, row in enumerate(rows):
        entity, src, dst, version, actor, reason, at = json.loads(text(row))
        entries.append(
            AuditEntry(
                stream_id=str(i),
                entity=str(entity),
                src=str(src),
                dst=str(dst),
                version=int(version),
                actor=str(actor),
                reason=str(reason),
                time=float(at),
            )
        )
    return entries


def decode_stream_trail(rows: Sequence[Any]) -> list[AuditEntry]:
    """Decode a trail kept as a Redis stream (XRANGE's reply)."""
    entries = []
    for stream_id, raw in rows:
        h = decode_hash(raw or {})
        entries.append(
            AuditEntry(
                stream_id=text(stream_id),
                entity=h.get("entity", ""),
                src=h.get("from", ""),
                dst=h.get("to", ""),
                version=int(h.get("version", 0)),
                actor=h.get("actor", ""),
                reason=h.get("reason", ""),
                time=float(h.get("time", 0)),
            )
        )
    return entries

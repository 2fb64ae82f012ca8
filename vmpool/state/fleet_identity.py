"""The fleet's identity, the mark every provider puts on the VMs it makes, and the other
marks the fleet knows.

Why it must be unique: reconcile destroys the VMs a cloud holds under the fleet's mark
that no record accounts for. Two installs sharing a cloud account must never share one,
so the identity is ``vmpool-`` and 12 random hex digits, made once per Redis and kept
there (never a default every install has, such as the key prefix). ``fleet_id`` in a
provider's options overrides it for that provider.

Why it is watched: the identity lives in the Redis that holds the records. When Redis
loses its data, the VMs under the old mark lose their records, and nobody knows whether
a user still holds one. Each process holds the identity it read
(:class:`IdentityWatch`) and checks it against Redis's on every use. When Redis names
another, or none, the held one is recorded as a **lost** mark: the fleet then destroys
no VM that no record accounts for, under any mark, until an operator adopts or forgets
it (``vmpool fleet-id adopt|forget``); a new identity marks the VMs made from then on.

The other marks, each with a role (:class:`MarkRole`), are listed with the identity, so
a VM under one of them that the records hold is checked and destroyed as usual:

- ``lost``: an identity held when Redis no longer named it (the condition above).
- ``legacy``: the key prefix, the mark of the versions that kept no identity, found on
  a Redis that holds VM records and no identity (or the prefix as its identity). Every
  install with the default prefix used it, so its VMs are this fleet's only when its
  records hold them: one no record holds may be another install's and is never destroyed.
- ``adopted``: an operator's word that every VM under it is the fleet's (one no record
  holds is a leak, destroyed after the grace).

Every write is a script (``scripts/fleet_identity.lua``, ``scripts/fleet_mark.lua``),
so it is acknowledged only once durable (:mod:`vmpool.state.durability`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal

import redis

from vmpool.state.durability import confirm
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script

__all__ = [
    "MARK_PATTERN",
    "FleetMarks",
    "IdentityWatch",
    "MarkAction",
    "MarkRole",
    "fleet_identity",
    "read_marks",
    "set_mark",
    "settle_identity",
    "warn_if_lost",
]

log = logging.getLogger(__name__)

# What a mark may be: a valid EC2 tag, GCE label and vSphere extraConfig value once
# lowercased (GCE labels), 63 characters at most.
MARK_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_SCRIPTS = "vmpool.state.scripts"
_SETTLE = read_script(_SCRIPTS, "fleet_identity.lua")
_MARK = read_script(_SCRIPTS, "fleet_mark.lua")

MarkAction = Literal["adopt", "forget"]


class MarkRole(StrEnum):
    """What a mark other than the identity is to the fleet (the module docstring)."""

    LOST = "lost"
    LEGACY = "legacy"
    ADOPTED = "adopted"


@dataclass(frozen=True)
class FleetMarks:
    """The identity and the fleet's other marks, as Redis held them when read."""

    identity: str
    others: Mapping[str, MarkRole] = field(default_factory=dict)

    @property
    def lost(self) -> tuple[str, ...]:
        """The lost marks: while there is one, no VM without a record is destroyed."""
        return tuple(sorted(m for m, role in self.others.items() if role == MarkRole.LOST))

    def listed(self, own: str) -> tuple[str, ...]:
        """Every mark a provider that marks with ``own`` lists, ``own`` first."""
        return (own, *sorted(m for m in self.others if m != own))

    def owns(self, mark: str, own: str) -> bool:
        """Whether every VM under ``mark`` is the fleet's (one no record holds: a leak).

        ``own`` is the provider's mark (the identity, or its ``fleet_id``), unless it was
        recorded lost."""
        role = self.others.get(mark)
        return role == MarkRole.ADOPTED or (mark == own and role is None)

    def problem(self) -> str | None:
        """The lost marks as one line for the logs and ``vmpool audit``; None if none."""
        if not self.lost:
            return None
        marks = ", ".join(self.lost)
        return (
            f"fleet identity: Redis lost the fleet's data (it no longer held mark {marks});"
            f" the VMs marked vmpool-fleet={marks} are neither adopted nor destroyed, and no"
            f" VM without a record is destroyed, until `vmpool fleet-id adopt MARK` (the"
            f" fleet owns them again: those with no record are destroyed) or `vmpool fleet-id"
            f" forget MARK` (they are yours to clean up); new VMs are marked {self.identity}"
        )


def read_marks(client: redis.Redis, keys: Keys) -> FleetMarks | None:
    """The marks as Redis holds them (no write); None when it holds no identity."""
    pipe = client.pipeline(transaction=True)
    pipe.get(keys.fleet_identity())
    pipe.hgetall(keys.fleet_marks())
    identity, others = pipe.execute()
    if identity is None:
        return None
    return FleetMarks(_text(identity), _roles(others))


def settle_identity(client: redis.Redis, keys: Keys, held: str = "") -> tuple[FleetMarks, str]:
    """The marks, with an identity made now if Redis holds none.

    ``held``: the identity the calling process held, recorded lost if Redis no longer
    names it. Returns the marks and the mark this call recorded lost ('' if none)."""
    upgraded = client.get(keys.fleet_identity()) is None and _holds_records(client, keys)
    script = client.register_script(_SETTLE)
    reply = script(
        keys=[keys.fleet_identity(), keys.fleet_marks()],
        args=[new_identity(), keys.prefix, "1" if upgraded else "0", held],
    )
    identity, noticed, flat = reply
    others = dict(zip(flat[::2], flat[1::2], strict=True))
    return FleetMarks(_text(identity), _roles(others)), _text(noticed)


def fleet_identity(client: redis.Redis, keys: Keys) -> str:
    """The fleet's identity: the one Redis holds, else one made and kept now."""
    found = read_marks(client, keys)
    if found is not None and found.identity != keys.prefix:
        return found.identity
    return settle_identity(client, keys)[0].identity


def set_mark(client: redis.Redis, keys: Keys, action: MarkAction, mark: str) -> str:
    """Adopt or forget ``mark``: 'adopted', 'forgotten', 'identity' or 'unknown'."""
    script = client.register_script(_MARK)
    return _text(script(keys=[keys.fleet_identity(), keys.fleet_marks()], args=[action, mark]))


def new_identity() -> str:
    """``vmpool-`` and 12 random lowercase hex digits."""
    return f"vmpool-{secrets.token_hex(6)}"


class IdentityWatch:
    """One process's hold on the fleet's identity, checked against Redis at every read.

    The first read takes what Redis holds (making it if there is none). A later one that
    finds another identity, or none, records the held one lost (logged as an error, once)
    and holds the identity Redis names from then on: a process never invents an identity
    over one it held without saying so."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.held = ""

    def start(self) -> None:
        """The first read, when the process starts: a lost mark is said at once.

        A Redis that cannot answer (or confirm) now leaves it to the first use."""
        try:
            warn_if_lost(self.marks())
        except redis.RedisError as exc:
            log.warning("fleet identity not read at start (%s); read at its first use", exc)

    def marks(self) -> FleetMarks:
        """The fleet's marks now: one read, and a script call only when they changed."""
        found = read_marks(self.client, self.keys)
        if (
            found is not None
            and found.identity != self.keys.prefix
            and self.held in ("", found.identity)
        ):
            if not self.held:
                confirm(self.client)  # taken as a fact from now on: a failover keeps it
            self.held = found.identity
            return found
        settled, noticed = settle_identity(self.client, self.keys, self.held)
        if noticed:
            log.error(
                "fleet identity %s is no longer Redis's (Redis lost its data, or was"
                " replaced); recorded as a lost mark. %s",
                noticed,
                settled.problem(),
            )
        self.held = settled.identity
        return settled


def warn_if_lost(marks: FleetMarks | None) -> str | None:
    """Log the lost marks' line as a warning (what each process says at its start)."""
    problem = marks.problem() if marks is not None else None
    if problem:
        log.warning("%s", problem)
    return problem


def _holds_records(client: redis.Redis, keys: Keys) -> bool:
    """Whether VM records exist (a SCAN, paid only on a Redis with no identity)."""
    return next(iter(client.scan_iter(match=keys.vm_pattern(), count=1000)), None) is not None


def _roles(raw: Mapping[Any, Any]) -> dict[str, MarkRole]:
    """The hash of marks, an unknown role left out (a later version's)."""
    roles = {role.value: role for role in MarkRole}
    return {_text(k): roles[_text(v)] for k, v in raw.items() if _text(v) in roles}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

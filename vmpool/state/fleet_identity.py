"""The fleet's ownership id: the mark every provider puts on the VMs it makes.

Why it must be unique: reconcile destroys the VMs a cloud holds under this mark that no
record accounts for. Two installs sharing a cloud account must never share one. A
default everybody has (the key prefix) would make them share it.

So the id is generated once per Redis, at random, and kept there. Every process of the
fleet reads the same one. Another install, with its own Redis, gets another.
``fleet_id`` in a provider's options overrides it, to move a fleet to a new Redis
without orphaning its VMs.

Upgrades: a Redis that holds VM records but no identity belongs to a fleet that marked
its VMs with the key prefix. The identity is then the prefix, so an upgrade (a rolling
one too, old workers still creating) keeps seeing the VMs it made. Every fleet process
settles the identity before it writes anything (``Fleet.build``). A new install's own
first VM never makes it look like an old one.
"""

from __future__ import annotations

import secrets

import redis

from vmpool.state.keys import Keys

__all__ = ["fleet_identity"]


def fleet_identity(client: redis.Redis, keys: Keys) -> str:
    """The fleet's id: the one stored in Redis, else one stored now.

    A new one is the key prefix when the Redis holds an older fleet's VMs, else
    ``vmpool-`` and 12 lowercase hex digits (a valid EC2 tag, GCE label and vSphere
    extraConfig value). ``SET NX`` makes processes starting together agree: the first
    write wins and every caller returns what Redis holds."""
    key = keys.fleet_identity()
    value = client.get(key)
    if value is None:
        new = keys.prefix if _holds_older_fleet(client, keys) else f"vmpool-{secrets.token_hex(6)}"
        client.set(key, new, nx=True)
        value = client.get(key)
        if value is None:  # pragma: no cover - deleted between the two commands
            return fleet_identity(client, keys)
    return value.decode() if isinstance(value, bytes) else str(value)


def _holds_older_fleet(client: redis.Redis, keys: Keys) -> bool:
    """Whether VM records exist, made before any identity was kept.

    Such records come from a fleet whose mark was the prefix. A SCAN, paid once per Redis
    (the key exists after).
    """
    return next(iter(client.scan_iter(match=keys.vm_pattern(), count=1000)), None) is not None

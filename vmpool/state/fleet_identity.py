"""The fleet's ownership id: the mark every provider puts on the VMs it makes.

Reconcile destroys the VMs a cloud holds under this mark that no record accounts for,
so two installs sharing a cloud account must never share one. A default that everybody
has (the key prefix) would make them share it; so the id is generated once per Redis,
at random, and kept there: every process of the fleet reads the same one, and another
install, with its own Redis, gets another. ``fleet_id`` in a provider's options
overrides it (to move a fleet to a new Redis without orphaning its VMs).
"""

from __future__ import annotations

import secrets

import redis

from vmpool.state.keys import Keys

__all__ = ["fleet_identity"]


def fleet_identity(client: redis.Redis, keys: Keys) -> str:
    """The fleet's id: the one stored in Redis, else a new one stored now.

    ``SET NX`` makes processes starting together agree: the first write wins and every
    caller returns what Redis holds. The id is a valid EC2 tag, GCE label and vSphere
    extraConfig value: ``vmpool-`` and 12 lowercase hex digits."""
    key = keys.fleet_identity()
    client.set(key, f"vmpool-{secrets.token_hex(6)}", nx=True)
    value = client.get(key)
    if value is None:  # pragma: no cover - deleted between the two commands
        return fleet_identity(client, keys)
    return value.decode() if isinstance(value, bytes) else str(value)

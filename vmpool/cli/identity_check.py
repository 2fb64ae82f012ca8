"""What a long-running command says at its start about the fleet's identity.

A lost mark (vmpool/state/fleet_identity.py: Redis lost the fleet's data) is logged as a
warning by ``vmpool api``, ``scheduler`` and ``up`` (the worker says it when it builds
its fleet); the fleet keeps serving meanwhile, destroying no VM it has no record of.
"""

from __future__ import annotations

import redis

from vmpool.state.connection import RedisOptions, connect
from vmpool.state.fleet_identity import read_marks, warn_if_lost
from vmpool.state.keys import Keys

__all__ = ["lost_marks_at_start"]


def lost_marks_at_start(url: str, options: RedisOptions, keys: Keys) -> str | None:
    """The lost marks' line (logged as a warning), None when there is none.

    On its own short-lived connection; an unreachable Redis is left to the command."""
    client = connect(url, options, decode_responses=True)
    try:
        return warn_if_lost(read_marks(client, keys))
    except redis.RedisError:
        return None
    finally:
        client.close()

"""Pool settings changed at runtime: size, template, clone target, and pool resets.

These are vmpooler's ``vmpooler__config__poolsize|template|clone_target`` hashes.

An override is kept in Redis (``Keys.pool_override(setting)``: pool -> value), so every
API replica and worker sees it at once. It holds only values that differ from the
configuration. Who honours what:

* size: the warm-pool top-up and ready check read the effective size
  (:func:`vmpool.lifecycle.overrides.effective_pools`).
* template: the reservation scripts (``reserve_vm``, ``pool_reserve``) take the
  runtime template in their own unit (``_prelude.lua``'s ``pool_template``). The next
  VM reserved is made from it.
* clone target: read with the others by ``effective_pools``. It is the pool's
  ``clone_target``, for backend weights and the providers that place VMs by it.

A changed template or clone target resets the pool (``PoolStore.reset_pool``), as vmpooler
drains a pool then. Nothing here writes a VM's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import redis

from vmpool.ids import validate_pool_name
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.records import text

__all__ = [
    "SETTINGS",
    "PoolOverrides",
    "Setting",
    "clear_override",
    "read_overrides",
    "set_overrides",
]

Setting = Literal["poolsize", "template", "clone_target"]
SETTINGS: Final[tuple[Setting, ...]] = ("poolsize", "template", "clone_target")


@dataclass(frozen=True)
class PoolOverrides:
    """The runtime values, by pool. A pool absent from a mapping has its configured one."""

    size: Mapping[str, int] = field(default_factory=dict)
    template: Mapping[str, str] = field(default_factory=dict)
    clone_target: Mapping[str, str] = field(default_factory=dict)
    reset_at: Mapping[str, float] = field(default_factory=dict)


def read_overrides(r: redis.Redis, keys: Keys) -> PoolOverrides:
    """Every override and reset time, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for setting in SETTINGS:
        pipe.hgetall(keys.pool_override(setting))
    pipe.hgetall(keys.pool_resets)
    sizes, templates, targets, resets = (
        {text(k): text(v) for k, v in raw.items()} for raw in pipe.execute()
    )
    return PoolOverrides(
        size={p: int(v) for p, v in sizes.items() if v.isdigit()},
        template=templates,
        clone_target=targets,
        reset_at={p: float(v) for p, v in resets.items()},
    )


def set_overrides(
    r: redis.Redis, keys: Keys, setting: Setting, values: Mapping[str, tuple[str, str]]
) -> int:
    """Set pool -> (value, configured value) of ``setting`` in one unit.

    The unit is ``override_set.lua``. Returns how many pools' effective value changed.
    """
    argv: list[str] = []
    for pool, (value, configured) in values.items():
        argv += [validate_pool_name(pool), value, configured]
    if not argv:
        return 0
    script = r.register_script(read_script("vmpool.state.scripts", "override_set.lua"))
    return int(script(keys=[keys.pool_override(setting)], args=argv))


def clear_override(r: redis.Redis, keys: Keys, setting: Setting, pool: str) -> str | None:
    """Drop ``pool``'s runtime value of ``setting``, read and removed in one transaction.

    Returns the value it had (None: there was none).
    """
    key = keys.pool_override(setting)
    pipe = r.pipeline(transaction=True)
    pipe.hget(key, validate_pool_name(pool))
    pipe.hdel(key, pool)
    before, _ = pipe.execute()
    return None if before is None else text(before)

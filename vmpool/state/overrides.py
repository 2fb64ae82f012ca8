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
drains a pool then. Nothing here writes a VM's state. Each change is one script, answered
once per operation id (:mod:`vmpool.state.ops`: the caller's ``op``, else one made for
the call) and confirmed as every acknowledged write is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import redis

from vmpool.ids import validate_pool_name
from vmpool.state.keys import Keys
from vmpool.state.lua import read_script
from vmpool.state.ops import Op, new_op, once_text, retry_window_s
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


def _run_once(
    r: redis.Redis, keys: Keys, script: str, key: str, argv: list[str], op: Op | None
) -> Any:
    """Run ``script`` (a file of vmpool/state/scripts) once per operation id."""
    runner = r.register_script(once_text(read_script("vmpool.state.scripts", script)))
    op = op or new_op(retry_window_s(r))
    return runner(keys=[key], args=[*argv, *op.argv(keys)])


def set_overrides(
    r: redis.Redis,
    keys: Keys,
    setting: Setting,
    values: Mapping[str, tuple[str, str]],
    *,
    op: Op | None = None,
) -> int:
    """Set pool -> (value, configured value) of ``setting`` in one unit.

    The unit is ``override_set.lua``. Returns how many pools' effective value changed.
    """
    argv: list[str] = []
    for pool, (value, configured) in values.items():
        argv += [validate_pool_name(pool), value, configured]
    if not argv:
        return 0
    changed = _run_once(r, keys, "override_set.lua", keys.pool_override(setting), argv, op)
    return int(changed)


def clear_override(
    r: redis.Redis, keys: Keys, setting: Setting, pool: str, *, op: Op | None = None
) -> str | None:
    """Drop ``pool``'s runtime value of ``setting``, read and removed in one unit.

    The unit is ``override_clear.lua``. Returns the value it had (None: there was none).
    """
    key = keys.pool_override(setting)
    before = _run_once(r, keys, "override_clear.lua", key, [validate_pool_name(pool)], op)
    return None if before is None else text(before)

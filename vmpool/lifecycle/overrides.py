"""Pool settings changed at runtime, as the workers, the API and the CLI apply them.

vmpooler's operator endpoints (``POST /config/poolsize``, ``/config/pooltemplate``,
``/config/clonetarget``, their DELETEs, ``POST /poolreset``) and ``vmpool pools
--set-size`` / ``vmpool pools reset`` all go through these functions. The overrides
live in Redis (:mod:`vmpool.state.overrides`), so every replica and worker sees them at
once. :func:`effective_pools` is the one read of a pool's effective settings the
workers use (the warm-pool top-up and ready check: the size).

A pool reset (and a changed template or clone target, which vmpooler follows with a
drain) is ``PoolStore.reset_pool``: one script sends the ready VMs to destruction and marks
the reset, so the VMs reserved before it never become ready. Held VMs are never
touched. The destroys are dispatched at once when a dispatcher is given (else the
destroy sweep finds them), and the top-up refills the pool with new VMs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from vmpool.config import Config, PoolConfig
from vmpool.ids import Job
from vmpool.lifecycle.fleet import Dispatcher, Fleet
from vmpool.state.keys import Keys
from vmpool.state.ops import Op
from vmpool.state.overrides import (
    PoolOverrides,
    Setting,
    clear_override,
    read_overrides,
    set_overrides,
)
from vmpool.state.store import Store

__all__ = [
    "Reverted",
    "configured_value",
    "effective_pool",
    "effective_pools",
    "pools_with_overrides",
    "reset_pools",
    "revert_setting",
    "set_setting",
]

log = logging.getLogger(__name__)

# Settings whose change makes the pool's ready VMs stale (vmpooler drains the pool).
_RESETTING: frozenset[Setting] = frozenset({"template", "clone_target"})


def effective_pool(pool: PoolConfig, overrides: PoolOverrides) -> PoolConfig:
    """``pool`` with its runtime size, template and clone target."""
    return dataclasses.replace(
        pool,
        size=overrides.size.get(pool.name, pool.size),
        template=overrides.template.get(pool.name, pool.template),
        clone_target=overrides.clone_target.get(pool.name, pool.clone_target),
    )


def pools_with_overrides(r: redis.Redis, keys: Keys, config: Config) -> dict[str, PoolConfig]:
    """Every configured pool with its runtime settings (one round trip)."""
    overrides = read_overrides(r, keys)
    return {name: effective_pool(pool, overrides) for name, pool in config.pools.items()}


def effective_pools(fleet: Fleet) -> list[PoolConfig]:
    """The fleet's pools as the workers must act on them now (one round trip)."""
    return list(pools_with_overrides(fleet.store.redis, fleet.store.keys, fleet.config).values())


def configured_value(pool: PoolConfig, setting: Setting) -> str:
    """The configuration's value of ``setting`` for ``pool``, as text ('' for none)."""
    if setting == "poolsize":
        return str(pool.size)
    if setting == "template":
        return pool.template
    return pool.clone_target or ""


def set_setting(
    store: Store,
    config: Config,
    setting: Setting,
    values: Mapping[str, str],
    *,
    actor: str,
    dispatch: Dispatcher | None = None,
    op: Op | None = None,
) -> int:
    """Set a runtime ``setting`` for some pools.

    Set pool -> value of ``setting`` (pools already checked to exist). Returns how many
    pools' effective value changed. A pool whose template or clone target changed is
    reset. ``op``: the call's operation (:mod:`vmpool.state.ops`), one part per change."""
    before = pools_with_overrides(store.redis, store.keys, config)
    pairs = {p: (v, configured_value(config.pools[p], setting)) for p, v in values.items()}
    changed = set_overrides(store.redis, store.keys, setting, pairs, op=_part(op, "set"))
    if setting in _RESETTING:
        moved = [p for p, v in values.items() if configured_value(before[p], setting) != v]
        reset_pools(store, moved, actor=actor, dispatch=dispatch, op=_part(op, "reset"))
    log.info("%s set at runtime for %s by %s (%d changed)", setting, dict(values), actor, changed)
    return changed


@dataclass(frozen=True)
class Reverted:
    """What a DELETE of an override found.

    The effective value before it, and the configured one it is back to (as text)."""

    before: str
    configured: str

    @property
    def changed(self) -> bool:
        return self.before != self.configured


def revert_setting(
    store: Store,
    config: Config,
    setting: Setting,
    pool: str,
    *,
    actor: str,
    dispatch: Dispatcher | None = None,
    op: Op | None = None,
) -> Reverted:
    """Drop ``pool``'s runtime ``setting``, back to the configuration.

    Drop ``pool``'s runtime ``setting`` (back to the configuration). A template or clone
    target that changed back resets the pool. ``op``: as for :func:`set_setting`."""
    configured = configured_value(config.pools[pool], setting)
    previous = clear_override(store.redis, store.keys, setting, pool, op=_part(op, "clear"))
    out = Reverted(configured if previous is None else previous, configured)
    if out.changed:
        log.info("%s of %s back to the configured %r by %s", setting, pool, configured, actor)
        if setting in _RESETTING:
            reset_pools(store, [pool], actor=actor, dispatch=dispatch, op=_part(op, "reset"))
    return out


def _part(op: Op | None, name: str) -> Op | None:
    return None if op is None else op.part(name)


def reset_pools(
    store: Store,
    pools: Iterable[str],
    *,
    actor: str,
    dispatch: Dispatcher | None = None,
    op: Op | None = None,
) -> dict[str, list[str]]:
    """Reset each pool: its ready VMs go.

    Reset each pool (its ready VMs go, VMs reserved before now never become ready).
    Returns the VMs recycled per pool, their destroys dispatched when ``dispatch``.
    ``op``: as for :func:`set_setting`."""
    recycled: dict[str, list[str]] = {}
    for pool in pools:
        recycled[pool] = store.pools.reset_pool(pool, actor=actor, op=_part(op, pool))
        log.info("pool %s reset by %s: %d ready VMs replaced", pool, actor, len(recycled[pool]))
    names = [name for batch in recycled.values() for name in batch]
    if names and dispatch is not None:
        dispatch.send(Job.DESTROY_VM, names)
    return recycled

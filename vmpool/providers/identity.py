"""Which fleet id each provider marks its VMs with.

Its ``fleet_id`` option, else the fleet's identity, generated once per Redis
(:func:`vmpool.state.fleet_identity`).

Reconcile destroys what a cloud holds under the mark and no record accounts for, so
the mark is what keeps two installs sharing an account apart. ``GET /status`` and
``vmpool fleet-id`` show it. The page docs/providers.md says how to move a fleet to a new Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from vmpool.providers.registry import provider_class
from vmpool.state.fleet_identity import fleet_identity

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = ["fleet_ids", "marks_fleet"]


class _ProviderConfigLike(Protocol):
    @property
    def provider_class(self) -> str: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


def marks_fleet(class_name: str) -> bool:
    """Whether the provider class tags its VMs with a fleet id (its options take one)."""
    implementation = provider_class(class_name)
    return implementation is not None and "fleet_id" in implementation.options.model_fields


def fleet_ids(
    redis: Redis, keys: Keys, providers: Mapping[str, _ProviderConfigLike]
) -> dict[str, str]:
    """Each provider instance that marks its VMs, with the fleet id it marks them with."""
    marking = {n: p for n, p in providers.items() if marks_fleet(p.provider_class)}
    if not marking:
        return {}
    generated: str | None = None
    out: dict[str, str] = {}
    for name, provider in marking.items():
        own = provider.options.get("fleet_id")
        if own:
            out[name] = str(own)
            continue
        if generated is None:
            generated = fleet_identity(redis, keys)
        out[name] = generated
    return out

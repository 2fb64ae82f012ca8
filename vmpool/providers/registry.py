"""The provider classes vmpool implements, by the name ``provider_class`` gives them.

vmpooler names provider instances under ``:providers:`` and picks each one's
implementation with ``provider_class`` (default: the instance's own name). Each class
comes with its options model: the configuration validates a ``:providers:`` entry with
it, and the class validates its options with it again when it is built. Adding a cloud
is one row here: nothing else lists the classes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from pydantic import BaseModel, ConfigDict

from vmpool.providers.base import PermanentProviderError, Provider, validate_provider_name
from vmpool.providers.cloud import (
    EC2Options,
    EC2PoolOptions,
    EC2Provider,
    GCEOptions,
    GCEPoolOptions,
    GCEProvider,
    OpenStackOptions,
    OpenStackPoolOptions,
    OpenStackProvider,
)
from vmpool.providers.simulated import SimulatedOptions, simulated_provider
from vmpool.providers.vsphere import VSphereOptions, VSpherePoolOptions, VSphereProvider

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = [
    "DEFAULT_PROVIDER",
    "PROVIDER_CLASSES",
    "NoPoolOptions",
    "PoolOptions",
    "ProviderClass",
    "make_provider",
    "provider_class",
    "providers_from_config",
]


class NoPoolOptions(BaseModel):
    """The pool keys of a class that reads none: every extra pool key is unknown to it."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# Pool name -> that pool's own keys for its provider, as the class's pool model validated
# them (vSphere's folder and datastore, a cloud's subnet): what a builder is given.
PoolOptions = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class ProviderClass:
    """One implementation: its ``provider_class`` name, its options, how to build one.

    ``pool_options`` is the model of the keys a pool using this class may carry for it.
    The configuration validates each pool's with it, and ``build`` receives them all,
    by pool name (``pools=``), so every call naming a pool can read its own."""

    name: str
    options: type[BaseModel]
    build: Callable[..., Provider]
    pool_options: type[BaseModel] = NoPoolOptions


PROVIDER_CLASSES: Final[Mapping[str, ProviderClass]] = MappingProxyType(
    {
        "simulated": ProviderClass("simulated", SimulatedOptions, simulated_provider),
        "ec2": ProviderClass("ec2", EC2Options, EC2Provider, EC2PoolOptions),
        "gce": ProviderClass("gce", GCEOptions, GCEProvider, GCEPoolOptions),
        "openstack": ProviderClass(
            "openstack", OpenStackOptions, OpenStackProvider, OpenStackPoolOptions
        ),
        "vsphere": ProviderClass("vsphere", VSphereOptions, VSphereProvider, VSpherePoolOptions),
    }
)

# The provider instance a pool uses when it names none (vmpooler's default is vsphere,
# which needs a vCenter: vmpool's is the simulated cloud).
DEFAULT_PROVIDER: Final = "simulated"


def provider_class(name: str) -> ProviderClass | None:
    """The implementation called ``name``, or None when vmpool has none of that name."""
    return PROVIDER_CLASSES.get(name)


class _PoolConfigLike(Protocol):
    """What :func:`providers_from_config` reads of a ``vmpool.config.PoolConfig``."""

    @property
    def provider(self) -> str: ...

    @property
    def provider_options(self) -> Mapping[str, Any]: ...


class _ProviderConfigLike(Protocol):
    """What :func:`providers_from_config` reads of a ``vmpool.config.ProviderConfig``."""

    @property
    def name(self) -> str: ...

    @property
    def provider_class(self) -> str: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


class _ConfigLike(Protocol):
    """What :func:`providers_from_config` reads of the whole configuration."""

    @property
    def providers(self) -> Mapping[str, _ProviderConfigLike]: ...

    @property
    def pools(self) -> Mapping[str, _PoolConfigLike]: ...


def make_provider(
    redis: Redis,
    keys: Keys,
    name: str,
    provider_class: str,
    options: Mapping[str, Any],
    pools: PoolOptions | None = None,
) -> Provider:
    """Build one named provider instance. An unknown class is a configuration error.

    ``pools`` holds the pool-level keys of each pool that uses the instance.

    The error is permanent because no retry makes an unknown class known: the caller (the
    config loader, a worker starting up) should stop and say so.
    """
    validate_provider_name(name)
    implementation = PROVIDER_CLASSES.get(provider_class)
    if implementation is None:
        raise PermanentProviderError(
            f"configuration error: provider {name!r} has unknown provider_class"
            f" {provider_class!r} (known: {', '.join(PROVIDER_CLASSES)})"
        )
    return implementation.build(redis, keys, name, options, pools=pools or {})


def providers_from_config(redis: Redis, keys: Keys, config: _ConfigLike) -> dict[str, Provider]:
    """Every provider instance the configuration names, keyed as pools refer to them.

    Each is given the pool-level keys of the pools that use it."""
    return {
        key: make_provider(
            redis,
            keys,
            provider.name,
            provider.provider_class,
            provider.options,
            {name: p.provider_options for name, p in config.pools.items() if p.provider == key},
        )
        for key, provider in config.providers.items()
    }

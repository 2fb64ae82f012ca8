"""Cloud providers: what vmpool asks of a cloud (base) and the simulated cloud it ships.

Import from here; ``make_provider`` / ``providers_from_config`` build instances from the
configuration, so callers never name an implementation class.
"""

from vmpool.providers.base import (
    PermanentProviderError,
    Provider,
    ProviderError,
    ProviderVM,
    TransientProviderError,
    is_permanent_error,
    make_provider,
    providers_from_config,
)
from vmpool.providers.simulated import SimulatedOptions, SimulatedProvider

__all__ = [
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "ProviderVM",
    "SimulatedOptions",
    "SimulatedProvider",
    "TransientProviderError",
    "is_permanent_error",
    "make_provider",
    "providers_from_config",
]

"""Cloud providers: the interface, the registry of implementations, the simulated cloud.

What vmpool asks of a cloud (base), the classes it implements (registry:
``provider_class`` name -> class and options model) and the simulated cloud.

Import from here. ``make_provider`` / ``providers_from_config`` build instances from the
configuration, so callers never name an implementation class. Nothing here imports the
configuration: it is read through the few attributes the registry needs.
"""

from vmpool.providers.base import (
    Capacity,
    CreateBatch,
    CreateOrder,
    Disks,
    PermanentProviderError,
    Provider,
    ProviderError,
    ProviderVM,
    ProviderVMState,
    QuotaExceededError,
    Snapshots,
    StatusBatch,
    TransientProviderError,
    create_for_request,
    is_permanent_error,
    uses_circuit,
)
from vmpool.providers.registry import make_provider, providers_from_config
from vmpool.providers.simulated import SimulatedOptions, SimulatedProvider

__all__ = [
    "Capacity",
    "CreateBatch",
    "CreateOrder",
    "Disks",
    "PermanentProviderError",
    "Provider",
    "ProviderError",
    "ProviderVM",
    "ProviderVMState",
    "QuotaExceededError",
    "SimulatedOptions",
    "SimulatedProvider",
    "Snapshots",
    "StatusBatch",
    "TransientProviderError",
    "create_for_request",
    "is_permanent_error",
    "make_provider",
    "providers_from_config",
    "uses_circuit",
]

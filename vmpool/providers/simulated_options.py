"""The simulated provider's options (``:providers: NAME: provider_class: simulated``).

One pydantic model, the registry's and the configuration's, with the bounds and wording of
every option (docs/providers.md, "Configuration")."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.options import (
    expect,
    invalid,
    key_path,
    problems,
    real,
    show,
    strict_integer,
)

__all__ = ["MAX_SIMULATED_SECONDS", "SimulatedOptions"]

log = logging.getLogger("vmpool.providers.simulated")

# -- options -------------------------------------------------------------------------------

# Simulated times: at most a day. A larger value would only make time.sleep overflow or
# a VM never boot. Either is a config mistake, so it is a config error.
MAX_SIMULATED_SECONDS = 86400.0
NonNegativeReal = Annotated[
    float,
    Field(ge=0, le=MAX_SIMULATED_SECONDS, allow_inf_nan=False),
    expect("a number of seconds from 0 to 86400 (a day)", real),
]
Percent = Annotated[float, Field(ge=0, le=100), expect("a number from 0 to 100", real)]


def _boot_pair(value: Any, handler: ValidatorFunctionWrapHandler) -> tuple[float, float]:
    """A number means [number, number]. A problem with it is named as the number's."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            low, high = handler((value, value))
        except ValidationError as exc:
            raise invalid(problems(exc)[0][1]) from None
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        low, high = handler(tuple(value))
    else:
        raise invalid(f"must be a number or [min, max], got {show(value)}")
    if low > high:
        raise invalid(f"[min, max] needs min <= max, got {show(value)}")
    return low, high


def _template_names(value: Any) -> frozenset[str]:
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError("not a list")
    if not all(isinstance(name, str) for name in value):
        raise TypeError("not names")
    return frozenset(value)


BootSeconds = Annotated[
    tuple[NonNegativeReal, NonNegativeReal],
    WrapValidator(
        _boot_pair, json_schema_input_type=NonNegativeReal | tuple[NonNegativeReal, NonNegativeReal]
    ),
]
TemplateNames = Annotated[frozenset[str], expect("a list of template names", _template_names)]


# The configuration validates a :providers: entry with this model (through the registry)
# and the provider validates its options with it again when it is built: one set of
# rules, one wording.
class SimulatedOptions(BaseModel):
    """Options of the simulated provider, a fake cloud whose VMs live in Redis.

    It has seeded failures, for demos and tests. A null option counts as absent."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    boot_seconds: BootSeconds = Field(
        (1.0, 3.0),
        description="How long a VM takes to boot, in seconds: a number, or [min, max] for"
        " a seeded random time in between",
        json_schema_extra={"unit": "seconds"},
    )
    create_fail_percent: Percent = Field(
        0.0, description="Share of creates that fail with a transient error, in percent"
    )
    ready_fail_percent: Percent = Field(
        0.0, description="Share of created VMs that never become ready, in percent"
    )
    destroy_fail_percent: Percent = Field(
        0.0, description="Share of destroy attempts that fail (and are retried), in percent"
    )
    seed: Annotated[int, expect("an integer", strict_integer)] = Field(
        0, description="Seeds every random decision, so that a run repeats exactly"
    )
    create_latency_seconds: NonNegativeReal = Field(
        0.0,
        description="How long each create call takes, in seconds",
        json_schema_extra={"unit": "seconds"},
    )
    batch_status: Annotated[bool, Field(strict=True), expect("true or false")] = Field(
        True,
        description="Answer the pending sweep for every booting VM with one list call, as"
        " the clouds do; false: one check per VM, as a provider without a list call",
    )
    permanent_fail_templates: TemplateNames = Field(
        frozenset(),
        description="Templates whose create fails permanently, as a template not found does",
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @property
    def boot_min_s(self) -> float:
        return self.boot_seconds[0]

    @property
    def boot_max_s(self) -> float:
        return self.boot_seconds[1]

    @property
    def create_latency_s(self) -> float:
        return self.create_latency_seconds

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SimulatedOptions:
        """Validate a raw options mapping. A bad value is a permanent configuration error."""
        unknown = sorted(str(key) for key in options if key not in cls.model_fields)
        if unknown:
            # As vmpooler providers ignore options meant for others.
            log.warning("simulated provider: ignoring unknown options %s", ", ".join(unknown))
        try:
            return cls.model_validate(options)
        except ValidationError as exc:
            where, problem = problems(exc)[0]
            raise PermanentProviderError(
                f"configuration error: simulated provider: {key_path(where)}: {problem}"
            ) from None

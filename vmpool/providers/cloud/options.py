"""The options every cloud provider takes, and the pieces they are made of.

Each cloud adds its own. Secrets are ``SecretStr``: a repr, a log line or ``vmpool
config show`` never shows them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vmpool.providers.cloud.placement import PortNumber, ReadyCheck, Secret, Tags
from vmpool.providers.options import expect, integer, number
from vmpool.state.fleet_identity import MARK_PATTERN

__all__ = ["CloudOptions", "FleetId", "Limit", "Retries", "Seconds", "Secret"]


Seconds = Annotated[
    float,
    Field(ge=0, le=3600, allow_inf_nan=False),
    expect("a number of seconds from 0 to 3600", number),
]
Retries = Annotated[int, Field(ge=0, le=20), expect("an integer from 0 to 20", integer)]
Limit = Annotated[int, Field(ge=1, le=1_000_000), expect("a whole number from 1", integer)]
FleetId = Annotated[
    str,
    Field(min_length=1, max_length=63, pattern=MARK_PATTERN),
    expect("1 to 63 letters, digits, '-', '_' or '.'"),
]


class CloudOptions(BaseModel):
    """Options every cloud provider takes (each cloud adds its own).

    Secrets are ``SecretStr``: a repr, a log line or ``vmpool config show`` never shows
    them."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    fleet_id: FleetId | None = Field(
        None,
        description="The fleet tag's value (default: the fleet's identity, generated once"
        " per Redis)",
    )
    ready_check: ReadyCheck = Field(
        "ssh",
        description="ssh: TCP connect to ssh_port (vmpooler's check); state: running with"
        " an address",
    )
    ssh_port: PortNumber = Field(22, description="The port the ssh ready check connects to")
    ssh_timeout: Seconds = Field(2.0, description="How long one ssh ready check waits")
    retries: Retries = Field(4, description="Retries of a call that failed transiently")
    backoff: Seconds = Field(1.0, description="The first retry's delay; doubled each time")
    max_backoff: Seconds = Field(60.0, description="The longest wait (Retry-After included)")
    tags: Tags = Field(
        default_factory=dict,
        description="Tags every VM gets (a pool's own are added); vmpool's own tags win",
    )
    max_instances: Limit | None = Field(
        None, description="The most VMs this provider holds at once (counted by vmpool)"
    )
    max_cores: Limit | None = Field(
        None, description="The most vCPUs its VMs have at once (counted by vmpool)"
    )

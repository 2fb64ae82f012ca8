"""Where and how a cloud makes a pool's VMs: the keys a pool may set for its provider.

Each cloud declares its placement once, as a model whose every field may be absent
(a :class:`CloudPlacement` subclass). The provider's options model inherits the same
fields, so the provider-level value is the default of every pool. The pool model (the
placement and :class:`PoolChecks`, the keys every cloud reads per pool) is what the
registry hands the configuration (``ProviderClass.pool_options``). So a pool's
``subnet_id`` or ``zone`` is read, checked and named in errors like any other key.
vmpooler's names are validation aliases (``amisize`` for ``instance_type``, ``zone``
for ``availability_zone``, ``subnetwork_name`` for ``subnetwork``): a vmpooler config
loads as it is.

Checks that need both levels (EC2's ``security_group_ids`` need a ``subnet_id``, at
either) read the provider's options from the validation context (``{"provider":
options}``), which the configuration and the provider both give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from vmpool.providers.cloud.dns import DnsOptions, Secret
from vmpool.providers.options import expect, integer, invalid

__all__ = [
    "CloudPlacement",
    "DnsOptions",
    "PoolChecks",
    "PortNumber",
    "ReadyCheck",
    "Secret",
    "Tags",
    "VolumeSize",
    "provider_value",
]

ReadyCheck = Annotated[Literal["ssh", "state"], expect("ssh or state")]
PortNumber = Annotated[int, Field(ge=1, le=65535), expect("a port from 1 to 65535", integer)]
VolumeSize = Annotated[int, Field(ge=1, le=65536), expect("a size in GB from 1 to 65536", integer)]
# User-defined tags: a cloud's tag keys and values are strings, and vmpool's own keys win.
Tags = dict[str, str]


class CloudPlacement(BaseModel):
    """The placement keys every cloud reads, on a pool or its provider.

    Absent on a pool means "the provider's"."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    user_data: str | None = Field(
        None, description="cloud-init user data (a #cloud-config document or a script)"
    )


class PoolChecks(BaseModel):
    """The keys every cloud reads per pool whose provider-level form has a default (CloudOptions).

    Absent means "the provider's"."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    ready_check: ReadyCheck | None = Field(
        None, description="ssh or state, for this pool's VMs (default: the provider's)"
    )
    ssh_port: PortNumber | None = Field(
        None, description="The port the ssh ready check connects to (default: the provider's)"
    )
    tags: Tags | None = Field(
        None,
        description="Tags (EC2), labels (GCE) or metadata (OpenStack) every VM gets, added"
        " to the provider's; vmpool's own tags win",
    )
    # the pool's own domain (filled in by the configuration from the pool's settings)
    domain: str | None = Field(None, description="The pool's domain (its own key)")
    dns: DnsOptions | None = Field(
        None,
        description="Keep <vm name>.<domain> pointing at each VM's address through a"
        " Libcloud DNS driver (route53, google, ...)",
    )

    @field_validator("dns")
    @classmethod
    def _dns_needs_a_domain(cls, value: DnsOptions | None, info: ValidationInfo) -> Any:
        if value is not None and not value.zone and not info.data.get("domain"):
            raise invalid("needs the pool's domain (or dns.zone): the records are in it")
        return value


def provider_value(info: ValidationInfo, key: str) -> Any:
    """The provider's own value of ``key`` from the validation context.

    None when the model is validated without one, or the provider does not set it."""
    context = info.context if isinstance(info.context, Mapping) else {}
    provider = context.get("provider")
    return provider.get(key) if isinstance(provider, Mapping) else None

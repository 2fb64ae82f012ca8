"""``provider_class: openstack``: the provider's options and the keys a pool may set.

Every placement key (:class:`OpenStackPlacement`) may be set on the provider, as every
pool's default, and on a pool, overriding it: ``flavor``, ``availability_zone``
(also ``zone``), ``network`` (also ``networks``: ids), ``key_name``,
``security_groups``, ``user_data``, ``config_drive``, ``tags`` (server metadata),
``volume_size`` / ``volume_type`` (boot from a volume deleted with the server),
``image_name`` (the newest image of that name, ``*`` wildcards allowed),
``ready_check``, ``ssh_port``.
"""

from __future__ import annotations

from pydantic import AliasChoices, ConfigDict, Field

from vmpool.providers.cloud.options import CloudOptions, Secret
from vmpool.providers.cloud.placement import CloudPlacement, PoolChecks, VolumeSize

__all__ = ["OpenStackOptions", "OpenStackPlacement", "OpenStackPoolOptions"]


class OpenStackPlacement(CloudPlacement):
    """Where and how Nova makes a pool's servers."""

    flavor: str | None = Field(None, description="The flavor id servers are made with")
    availability_zone: str | None = Field(
        None,
        validation_alias=AliasChoices("availability_zone", "zone"),
        description="The availability zone (default: Nova's choice)",
    )
    network: str | list[str] | None = Field(
        None,
        validation_alias=AliasChoices("network", "networks"),
        description="The network id (or ids) servers attach to",
    )
    key_name: str | None = Field(None, description="The key pair installed on servers")
    security_groups: list[str] | None = Field(None, description="Security group names")
    config_drive: bool | None = Field(None, description="Give servers a config drive")
    volume_size: VolumeSize | None = Field(
        None,
        description="Boot from a new volume of this many GB, deleted with the server"
        " (default: the flavor's local disk)",
    )
    volume_type: str | None = Field(None, description="The boot volume's type")
    image_name: str | None = Field(
        None,
        description="Start from the newest image of this name ('*' wildcards allowed)"
        " instead of the template (an image id)",
    )


class OpenStackPoolOptions(OpenStackPlacement, PoolChecks):
    """The keys a pool of an ``openstack`` provider may set (``pool_options``)."""


class OpenStackOptions(CloudOptions, OpenStackPlacement):
    """``provider_class: openstack``.

    Credentials: the options, else the entry ``cloud`` (or OS_CLOUD) of a clouds.yaml
    (OS_CLIENT_CONFIG_FILE, or the clients' search path:
    :mod:`vmpool.providers.cloud.clouds_yaml`), else the usual OS_* environment variables
    (OS_AUTH_URL, OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME, OS_USER_DOMAIN_NAME,
    OS_REGION_NAME)."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    cloud: str | None = Field(None, description="A clouds.yaml entry (default: OS_CLOUD)")
    auth_url: str | None = Field(None, description="Keystone URL (default: OS_AUTH_URL)")
    username: str | None = Field(None, description="User (default: OS_USERNAME)")
    password: Secret | None = Field(None, description="Password (secret; OS_PASSWORD)")
    project_name: str | None = Field(None, description="Project (default: OS_PROJECT_NAME)")
    domain_name: str | None = Field(None, description="User domain (OS_USER_DOMAIN_NAME)")
    region: str | None = Field(None, description="Region (default: OS_REGION_NAME)")
    flavor: str = Field(description="The flavor id servers are made with")

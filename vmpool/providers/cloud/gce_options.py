"""``provider_class: gce``: the provider's options and the keys a pool may set for it.

Every placement key (:class:`GCEPlacement`) may be set on the provider, as every pool's
default, and on a pool, overriding it: ``zone`` (also ``availability_zone``),
``machine_type``, ``network`` (vmpooler: ``network_name``), ``subnetwork``
(``subnetwork_name``), ``external_ip``, ``disk_type``, ``disk_size`` (``volume_size``),
``image_family`` / ``image_project``, ``service_account`` / ``scopes``, ``ssh_keys``,
``metadata``, ``user_data``, ``tags`` (labels), ``spot``, ``ready_check``, ``ssh_port``.
"""

from __future__ import annotations

from pydantic import AliasChoices, ConfigDict, Field

from vmpool.providers.cloud.options import CloudOptions, Seconds
from vmpool.providers.cloud.placement import CloudPlacement, PoolChecks, VolumeSize

__all__ = ["GCEOptions", "GCEPlacement", "GCEPoolOptions"]

ZONE = AliasChoices("zone", "availability_zone")
NETWORK = AliasChoices("network", "network_name")
SUBNETWORK = AliasChoices("subnetwork", "subnetwork_name")
DISK_SIZE = AliasChoices("disk_size", "volume_size")


class GCEPlacement(CloudPlacement):
    """Where and how GCE makes a pool's instances."""

    zone: str | None = Field(None, validation_alias=ZONE, description="The zone")
    machine_type: str | None = Field(None, description="The machine type, e.g. e2-small")
    network: str | None = Field(
        None, validation_alias=NETWORK, description="The VPC network (vmpooler: network_name)"
    )
    subnetwork: str | None = Field(
        None,
        validation_alias=SUBNETWORK,
        description="The subnetwork, in the zone's region (vmpooler: subnetwork_name)",
    )
    external_ip: bool | None = Field(None, description="Give instances a public address")
    disk_type: str | None = Field(
        None, description="The boot disk's type: pd-balanced, pd-ssd, ... (default: GCE's)"
    )
    disk_size: VolumeSize | None = Field(
        None, validation_alias=DISK_SIZE, description="The boot disk's size in GB"
    )
    image_family: str | None = Field(
        None, description="Start from the newest image of this family instead of the template"
    )
    image_project: str | None = Field(
        None, description="The project of image_family (default: the provider's project)"
    )
    service_account: str | None = Field(
        None, description="The service account (e-mail) instances run as"
    )
    scopes: list[str] | None = Field(
        None, description="The service account's scopes (default: cloud-platform)"
    )
    ssh_keys: list[str] | None = Field(
        None, description="Instance ssh keys, each 'user:ssh-ed25519 AAAA... comment'"
    )
    metadata: dict[str, str] | None = Field(None, description="More instance metadata")
    spot: bool | None = Field(None, description="Spot VMs (deleted when preempted)")


class GCEPoolOptions(GCEPlacement, PoolChecks):
    """The keys a pool of a ``gce`` provider may set (``ProviderClass.pool_options``)."""


class GCEOptions(CloudOptions, GCEPlacement):
    """``provider_class: gce``.

    Credentials: a service-account key file (``credentials_file``, else
    GOOGLE_APPLICATION_CREDENTIALS), or the metadata server's tokens
    (``use_metadata_server``: GKE Workload Identity, a VM's service account)."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    project: str = Field(description="The GCP project")
    zone: str = Field(
        validation_alias=ZONE, description="The zone instances start in, e.g. us-central1-a"
    )
    machine_type: str = Field("e2-small", description="The machine type")
    network: str = Field(
        "default", validation_alias=NETWORK, description="The VPC network (vmpooler: network_name)"
    )
    external_ip: bool = Field(True, description="Give instances an ephemeral public address")
    credentials_file: str | None = Field(None, description="Service-account JSON key file")
    use_metadata_server: bool = Field(
        False,
        description="Take access tokens from the metadata server (GKE Workload Identity, or"
        " the VM's service account) instead of a key file",
    )
    operation_wait: Seconds = Field(
        60.0,
        description="How long a create follows its insert operation for the cloud's answer"
        " (quota, zone exhausted, ...) before the pending checks take over",
    )

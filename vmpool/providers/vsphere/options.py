"""The vSphere provider's options, with vmpooler's keys, and the keys of its pools.

A vmpooler ``:providers: :vsphere:`` section carries over as it is (``server``,
``username``, ``password``, ``insecure``, ``datacenter``, and ``vsphere_timeout`` read
as ``timeout``). So do its pools' keys (``folder``, ``datastore``, ``clone_target``,
``create_linked_clone``, ``network``, ``datacenter``, ``snapshot_mainMem_*``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from vmpool.providers.cloud.options import CloudOptions, Secret
from vmpool.providers.cloud.placement import PortNumber, ReadyCheck
from vmpool.providers.options import expect, invalid, number, show

__all__ = ["VSphereOptions", "VSpherePoolOptions", "split_server"]

Flag = Annotated[bool, Field(strict=True), expect("true or false")]
# An inventory path below the datacenter's VM folder: names joined by '/', no empty part.
InventoryPath = Annotated[
    str,
    Field(min_length=1, max_length=1000, pattern=r"^[^/]+(/[^/]+)*$"),
    expect("an inventory path such as vmpooler/debian-12 (no leading or trailing /)"),
]
Name = Annotated[str, Field(min_length=1, max_length=255), expect("a name")]
# vCenter's waits: a call, a task (a full clone of a big template takes long).
Timeout = Annotated[
    float,
    Field(gt=0, le=86400, allow_inf_nan=False),
    expect("a number of seconds above 0, at most 86400 (a day)", number),
]
ExtraConfigValue = Annotated[
    str | int, Field(union_mode="left_to_right"), expect("a number or a string")
]

_SERVER = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+))(?::(?P<port>\d+))?$"
)


def split_server(server: str) -> tuple[str, int]:
    """``host[:port]`` (an IPv6 address in brackets) as (host, port). 443 by default."""
    found = _SERVER.match(server.strip())
    port = int(found.group("port") or 443) if found else 0
    if not found or not 0 < port < 65536:
        raise ValueError(f"server must be host[:port], got {server!r}")
    return found.group("v6") or found.group("host"), port


class VSphereOptions(CloudOptions):
    """``provider_class: vsphere``.

    Credentials: ``username``/``password``, else the environment's VSPHERE_USER /
    VSPHERE_PASSWORD, or ``password_file``."""

    server: str = Field(description="The vCenter: host[:port] (443 by default)")
    username: str | None = Field(None, description="The vCenter user (default: VSPHERE_USER)")
    password: Secret | None = Field(
        None, description="The user's password (secret; default: VSPHERE_PASSWORD)"
    )
    password_file: str | None = Field(
        None, description="A file holding the password (a mounted secret), when not given"
    )
    insecure: Flag = Field(False, description="Accept any TLS certificate (a lab's vCenter)")
    ca_file: str | None = Field(
        None, description="PEM file of the CA that signed vCenter's certificate"
    )
    datacenter: str | None = Field(
        None, description="The datacenter (default: the only one, if there is one)"
    )
    timeout: Timeout = Field(
        60.0,
        validation_alias=AliasChoices("timeout", "vsphere_timeout"),
        description="How long one call to vCenter may take (vmpooler: vsphere_timeout)",
    )
    task_timeout: Timeout = Field(
        900.0, description="How long a clone, power, snapshot or disk task may run"
    )
    create_folders: Flag = Field(
        False, description="Create a pool's folder when it is missing (vmpooler's config key)"
    )
    create_linked_clones: Flag = Field(
        False, description="Default of the pools' create_linked_clone (vmpooler's config key)"
    )
    create_template_delta_disks: Flag = Field(
        False,
        description="A linked clone's template without a snapshot gets one (delta disks"
        " on every disk, as vmpooler's key makes them) instead of the clone failing",
    )

    @field_validator("server")
    @classmethod
    def _server(cls, value: str) -> str:
        split_server(value)
        return value.strip()

    @field_validator("tags", "max_cores")
    @classmethod
    def _not_on_vsphere(cls, value: Any) -> Any:
        """The clouds' user tags and core limit.

        A clone's vCPUs are its template's, which vmpool does not count, and vSphere has
        no tags here (max_instances is counted as on the clouds)."""
        if value:
            raise invalid(f"not supported by the vsphere provider (got {show(value)})")
        return value


class VSpherePoolOptions(BaseModel):
    """A vSphere pool's keys (vmpooler's).

    The pool's ``template`` is the source VM's inventory path below the datacenter's VM
    folder (``templates/debian-12``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    ready_check: ReadyCheck | None = Field(
        None, description="ssh or state, for this pool's VMs (default: the provider's)"
    )
    ssh_port: PortNumber | None = Field(
        None, description="The port the ssh ready check connects to (default: the provider's)"
    )
    folder: InventoryPath = Field(
        description="The folder the pool's VMs are cloned into, below the datacenter's VM"
        " folder (vmpooler/debian-12)"
    )
    datastore: Name | None = Field(None, description="The datastore (default: the template's)")
    clone_target: Name | None = Field(
        None, description="The cluster or host the VMs run on (default: config.clone_target)"
    )
    create_linked_clone: Flag | None = Field(
        None,
        description="Linked clones from the template's current snapshot (default: the"
        " provider's create_linked_clones)",
    )
    network: Name | None = Field(
        None, description="The network of the first network card (default: the template's)"
    )
    datacenter: Name | None = Field(None, description="The datacenter (default: the provider's)")
    snapshot_mainMem_ioBlockPages: ExtraConfigValue | None = Field(
        None,
        validation_alias=AliasChoices(
            "snapshot_mainMem_ioBlockPages", "snapshot_mainmem_ioblockpages"
        ),
        description="mainMem.ioBlockPages in the clone's configuration (vmpooler's)",
    )
    snapshot_mainMem_iowait: ExtraConfigValue | None = Field(
        None,
        validation_alias=AliasChoices("snapshot_mainMem_iowait", "snapshot_mainmem_iowait"),
        description="mainMem.iowait in the clone's configuration (vmpooler's)",
    )

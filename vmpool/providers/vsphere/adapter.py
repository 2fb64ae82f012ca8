"""The few vCenter calls the vSphere provider makes, as a small interface.

The provider (``provider.py``) decides what to call and when: ownership, idempotency,
retries, classification. An adapter only makes the calls: :class:`PyVmomiAdapter`
(``pyvmomi_adapter.py``) over SOAP to a real vCenter or govmomi's simulator, and the
tests' in-memory adapter with injectable faults. Every call raises
:class:`~vmpool.providers.vsphere.faults.VSphereFault` for a fault vCenter answered
(a failed task's included) and ``OSError`` for a dropped connection.

Objects are named by inventory paths below the datacenter (``vm/templates/debian-12``
is a template, ``vm/vmpooler/debian-12`` a folder) and VMs by their managed object
reference (``vm-42``), as vCenter returns them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

__all__ = [
    "DELTA_DISKS_SNAPSHOT",
    "MARK_PREFIX",
    "CloneRequest",
    "PowerState",
    "VMInfo",
    "VSphereAdapter",
]

PowerState = Literal["poweredOn", "poweredOff", "suspended"]

# The extraConfig keys a listing reads: the fleet's marks, and guestinfo.hostname.
MARK_PREFIX = "guestinfo.vmpool."


@dataclass(frozen=True)
class VMInfo:
    """A VM as one listing saw it.

    ``marks``: its ``guestinfo.vmpool.*`` extraConfig (ownership, set in its clone spec),
    keys without the prefix.

    ``state``, ``public_ips``, ``private_ips`` and ``image`` are what the cloud
    providers' shared code reads of a node."""

    ref: str
    name: str
    power_state: PowerState
    marks: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None

    @property
    def id(self) -> str:
        return self.ref

    @property
    def state(self) -> str:
        """'running' when powered on, else vCenter's word.

        A VM powered off is one whose power-on is still to come (create powers it on), not
        a cloud's stopped one."""
        return "running" if self.power_state == "poweredOn" else self.power_state

    @property
    def public_ips(self) -> list[str]:
        return []

    @property
    def private_ips(self) -> list[str]:
        return [self.ip] if self.ip else []

    @property
    def image(self) -> str:
        return self.marks.get("template", "")


# The snapshot that gives a template the delta disks linked clones start from.
DELTA_DISKS_SNAPSHOT = "vmpool-delta-disks"


@dataclass(frozen=True)
class CloneRequest:
    """One clone: where from, where to, and the extraConfig it carries from its start."""

    datacenter: str | None
    template: str  # the source VM's path below the datacenter's VM folder
    folder: str  # the target folder's path below the datacenter's VM folder
    name: str
    extra_config: Mapping[str, str]
    datastore: str | None = None
    clone_target: str | None = None  # a cluster, a standalone host or a host's name
    linked: bool = False  # from the template's current snapshot, on delta disks
    network: str | None = None
    create_folder: bool = False
    # a linked clone's template without a snapshot gets one (vmpooler's delta disks)
    template_delta_disks: bool = False


class VSphereAdapter(Protocol):
    """One session with vCenter."""

    def current_time(self) -> float:
        """vCenter's clock (seconds since the epoch): the session's health check."""
        ...

    def list_vms(self, datacenter: str | None, folders: Sequence[str]) -> list[VMInfo]:
        """Every VM directly in ``folders``: one RetrievePropertiesEx (one per page)."""
        ...

    def clone(self, request: CloneRequest) -> VMInfo:
        """Clone and wait for the task. The new VM is powered off."""
        ...

    def power_on(self, ref: str) -> None: ...

    def power_off(self, ref: str) -> None: ...

    def destroy(self, ref: str) -> None: ...

    def snapshots(self, ref: str) -> list[str]:
        """The names in the VM's snapshot tree."""
        ...

    def create_snapshot(self, ref: str, name: str, memory: bool) -> None: ...

    def revert_snapshot(self, ref: str, name: str) -> None:
        """Revert to the snapshot called ``name``. ``NotFound`` when there is none."""
        ...

    def extra_config(self, ref: str) -> dict[str, str]:
        """The VM's extraConfig, read now."""
        ...

    def add_disk(
        self,
        ref: str,
        size_gb: int,
        datacenter: str | None,
        datastore: str | None,
        extra_config: Mapping[str, str],
    ) -> None:
        """A new thin disk on the VM's first SCSI controller with room.

        ``extra_config`` is set by the same reconfiguration (both, or neither)."""
        ...

    def close(self) -> None: ...

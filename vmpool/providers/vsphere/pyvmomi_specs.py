"""The specs the pyVmomi adapter sends: clone, relocation, network card, new disk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyVmomi import vim

from vmpool.providers.vsphere.faults import VSphereFault

__all__ = ["add_disk", "clone", "network_card", "relocate"]

# SCSI unit 7 is the controller's own. A controller takes 16 units (0 to 15).
_SCSI_UNITS = [unit for unit in range(16) if unit != 7]


def relocate(datastore: Any, placement: tuple[Any, Any] | None, linked: bool) -> Any:
    """Where the clone goes: datastore, resource pool (and host), disk backing.

    A linked clone gets a child disk on the template snapshot's (vCenter's
    ``createNewChildDiskBacking``). A full clone copies the disks, consolidated."""
    spec = vim.vm.RelocateSpec()
    if datastore is not None:
        spec.datastore = datastore
    if placement is not None:
        spec.pool, host = placement
        if host is not None:
            spec.host = host
    spec.diskMoveType = (
        "createNewChildDiskBacking" if linked else "moveAllDiskBackingsAndConsolidate"
    )
    return spec


def clone(relocation: Any, extra_config: Mapping[str, str], snapshot: Any, card: Any) -> Any:
    """The clone spec: powered off, with the fleet's marks, from a snapshot when linked.

    Powered off: vmpool powers it on itself. The fleet's marks are in its extraConfig from
    the start. A linked clone starts from the template's snapshot."""
    config = vim.vm.ConfigSpec(
        extraConfig=[vim.option.OptionValue(key=k, value=v) for k, v in extra_config.items()]
    )
    if card is not None:
        config.deviceChange = [vim.vm.device.VirtualDeviceSpec(operation="edit", device=card)]
    spec = vim.vm.CloneSpec(location=relocation, config=config, powerOn=False, template=False)
    if snapshot is not None:
        spec.snapshot = snapshot
    return spec


def network_card(devices: Sequence[Any], network: Any) -> Any:
    """The template's first network card, moved to ``network``, connected at power-on.

    ``network`` is a standard port group or a distributed one."""
    cards = [d for d in devices if isinstance(d, vim.vm.device.VirtualEthernetCard)]
    if not cards:
        raise VSphereFault(["InvalidArgument"], "the template has no network card to connect")
    card = cards[0]
    if isinstance(network, vim.dvs.DistributedVirtualPortgroup):
        switch: Any = network.config.distributedVirtualSwitch
        card.backing = vim.vm.device.VirtualEthernetCard.DistributedVirtualPortBackingInfo(
            port=vim.dvs.PortConnection(portgroupKey=network.key, switchUuid=switch.uuid)
        )
    else:
        card.backing = vim.vm.device.VirtualEthernetCard.NetworkBackingInfo(
            network=network, deviceName=network.name, useAutoDetect=False
        )
    card.connectable = vim.vm.device.VirtualDevice.ConnectInfo(
        startConnected=True, allowGuestControl=True, connected=True
    )
    return card


def add_disk(
    devices: Sequence[Any],
    size_gb: int,
    datastore: Any,
    datastore_name: str | None,
    extra_config: Mapping[str, str],
) -> Any:
    """A reconfiguration adding one thin disk and setting ``extra_config``.

    The disk is created with it, on the first SCSI controller with a free unit."""
    controller, unit = _free_unit(devices)
    backing = vim.vm.device.VirtualDisk.FlatVer2BackingInfo(
        diskMode="persistent", thinProvisioned=True, fileName=""
    )
    if datastore is not None:
        backing.datastore = datastore
        backing.fileName = f"[{datastore_name}]"
    disk = vim.vm.device.VirtualDisk(
        key=-1,
        controllerKey=controller,
        unitNumber=unit,
        capacityInKB=size_gb * 1024 * 1024,
        backing=backing,
    )
    change = vim.vm.device.VirtualDeviceSpec(operation="add", fileOperation="create", device=disk)
    options = [vim.option.OptionValue(key=k, value=v) for k, v in extra_config.items()]
    return vim.vm.ConfigSpec(deviceChange=[change], extraConfig=options)


def _free_unit(devices: Sequence[Any]) -> tuple[int, int]:
    """(controller key, unit number) of the first free SCSI unit."""
    used: dict[int, set[int]] = {}
    for device in devices:
        if isinstance(device, vim.vm.device.VirtualSCSIController):
            used.setdefault(device.key, set())
    for device in devices:
        if device.controllerKey in used and device.unitNumber is not None:
            used[device.controllerKey].add(device.unitNumber)
    for key in sorted(used):
        free = [unit for unit in _SCSI_UNITS if unit not in used[key]]
        if free:
            return key, free[0]
    raise VSphereFault(["InvalidArgument"], "the VM has no SCSI controller with a free unit")

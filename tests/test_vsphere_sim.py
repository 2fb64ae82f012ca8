"""The vSphere provider over the wire: SOAP to govmomi's vCenter simulator, a real
process on loopback (tests/vcsimhelp.py, the session fixture ``vcsim``).

What it proves, on a real SOAP endpoint rather than a fake: clones land in the pool's
folder, on its datastore and cluster (or host), marked with the fleet in their
extraConfig, powered on; linked clones go through; the inventory is one
RetrievePropertiesEx (counted at pyVmomi's stub) and holds only this fleet's VMs of the
pools' folders: a hand-made VM and another fleet's, in the same folder, are never listed,
powered off or destroyed; a destroyed VM is gone from vCenter, not just off; snapshots,
reverts and disks work and are not repeated; vCenter's faults (a failed login, an
unverifiable certificate, a missing template, a failed task) arrive classified; a session
logged out is re-established.
The simulator is govmomi 0.24 (2021): its gaps are in docs/providers.md.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from vmpool.providers import PermanentProviderError
from vmpool.providers.vsphere import VSphereProvider
from vmpool.state.keys import Keys

from vcsimhelp import BARE_TEMPLATE, TEMPLATE, VCSim, hand_made

# govmomi's simulator is a process of its own, built on first use (half a minute).
pytestmark = pytest.mark.slow

_unique = itertools.count(1)


class Sim:
    """One test's corner of the shared simulator: its own fleet and folders."""

    def __init__(self, vcsim: VCSim) -> None:
        n = next(_unique)
        self.vcsim = vcsim
        self.fleet = f"fleet-{n}"
        self.folder = f"sim{n}"
        self.pools = {
            "placed": {
                "folder": f"{self.folder}/placed",
                "datastore": "LocalDS_1",
                "clone_target": "DC0_C0",
                "network": "VM Network",
            },
            "linked": {
                "folder": f"{self.folder}/linked",
                "create_linked_clone": True,
                "clone_target": "DC0_C0_H1",
            },
            "plain": {"folder": f"{self.folder}/plain"},
        }
        self.si = vcsim.client()
        self.provider = self.make()

    def make(self, **options: Any) -> VSphereProvider:
        opts = self.vcsim.options(**{"fleet_id": self.fleet, "create_folders": True, **options})
        return VSphereProvider(None, Keys("k"), "vc", opts, pools=self.pools)

    def find(self, path: str) -> Any:
        return self.si.content.searchIndex.FindByInventoryPath(f"DC0/vm/{path}")

    def extra(self, vm: Any) -> dict[str, str]:
        return {o.key: o.value for o in vm.config.extraConfig}


@pytest.fixture
def sim(vcsim: VCSim) -> Iterator[Sim]:
    s = Sim(vcsim)
    yield s
    for vm in s.provider.inventory():  # what the test made, so the simulator stays small
        s.provider.destroy_vm(vm.pool, vm.name)


def soap_calls(provider: VSphereProvider) -> Counter[str]:
    """Count the SOAP methods the provider's session invokes from now on."""
    stub = provider.driver.si._stub  # type: ignore[attr-defined]
    counted: Counter[str] = Counter()
    invoke = stub.InvokeMethod

    def counting(mo: Any, info: Any, args: Any) -> Any:
        counted[info.wsdlName] += 1
        return invoke(mo, info, args)

    stub.InvokeMethod = counting
    return counted


def test_a_clone_lands_where_the_pool_says_marked_and_on(sim: Sim) -> None:
    vm = sim.provider.create_vm("placed", TEMPLATE, "vm-placed", request_id="r-1")  # type: ignore[call-arg]
    assert vm.state == "running" and vm.pool == "placed" and vm.template == TEMPLATE
    made = sim.find(f"{sim.folder}/placed/vm-placed")
    assert made is not None and made.runtime.powerState == "poweredOn"
    assert [ds.name for ds in made.datastore] == ["LocalDS_1"]
    assert made.resourcePool.owner.name == "DC0_C0"
    cards = [d for d in made.config.hardware.device if hasattr(d, "macAddress")]
    assert cards[0].backing.deviceName == "VM Network"
    extra = sim.extra(made)
    assert extra["guestinfo.vmpool.fleet"] == sim.fleet
    assert (
        extra["guestinfo.vmpool.pool"],
        extra["guestinfo.vmpool.vm"],
        extra["guestinfo.vmpool.request"],
    ) == ("placed", "vm-placed", "r-1")
    assert extra["guestinfo.hostname"] == "vm-placed"
    again = sim.provider.create_vm("placed", TEMPLATE, "vm-placed")
    assert again.name == "vm-placed" and len(sim.provider.inventory()) == 1


def test_linked_clone_on_a_host_and_its_refusal_without_a_snapshot(sim: Sim) -> None:
    sim.provider.create_vm("linked", TEMPLATE, "vm-linked")
    made = sim.find(f"{sim.folder}/linked/vm-linked")
    # A host as clone_target: its cluster's resource pool (the simulator places the VM on
    # the template's host whatever the spec's host, and ignores the disk backing).
    assert made.resourcePool.owner.name == "DC0_C0" and made.runtime.powerState == "poweredOn"
    with pytest.raises(PermanentProviderError, match="no snapshot to link clones to"):
        sim.provider.create_vm("linked", BARE_TEMPLATE, "vm-nolink")


def test_inventory_is_one_call_and_only_this_fleets(sim: Sim) -> None:
    for name in ("vm-a", "vm-b"):
        sim.provider.create_vm("plain", TEMPLATE, name)
    sim.provider.create_vm("placed", TEMPLATE, "vm-c")
    sim.provider.create_vm("linked", TEMPLATE, "vm-d")  # every pool's folder exists now
    folder = f"{sim.folder}/plain"
    mine = hand_made(sim.si, TEMPLATE, folder, "vm-hand-made")
    theirs = hand_made(
        sim.si, TEMPLATE, folder, "vm-theirs", {"fleet": "another-fleet", "vm": "vm-theirs"}
    )
    sim.provider.inventory()  # the container views are made once per session
    counted = soap_calls(sim.provider)
    names = sorted(vm.name for vm in sim.provider.inventory())
    assert names == ["vm-a", "vm-b", "vm-c", "vm-d"]
    assert counted == Counter({"RetrievePropertiesEx": 1})
    statuses = sim.provider.statuses(["vm-a", "vm-hand-made", "vm-theirs", "vm-never"])
    assert statuses["vm-a"] is not None and statuses["vm-a"].state == "running"
    assert [n for n, vm in statuses.items() if vm is None] == [
        "vm-hand-made",
        "vm-theirs",
        "vm-never",
    ]
    assert counted["RetrievePropertiesEx"] == 2
    for name in ("vm-hand-made", "vm-theirs"):
        assert sim.provider.destroy_vm("plain", name) is False
    assert mine.runtime.powerState == theirs.runtime.powerState == "poweredOn"
    assert sim.find(f"{folder}/vm-hand-made") is not None
    assert sim.find(f"{folder}/vm-theirs") is not None


def test_destroy_powers_off_and_removes_the_vm(sim: Sim) -> None:
    sim.provider.create_vm("plain", TEMPLATE, "vm-gone")
    assert sim.find(f"{sim.folder}/plain/vm-gone").runtime.powerState == "poweredOn"
    assert sim.provider.destroy_vm("plain", "vm-gone") is True
    assert sim.find(f"{sim.folder}/plain/vm-gone") is None  # gone, not just powered off
    assert sim.provider.destroy_vm("plain", "vm-gone") is False
    assert sim.provider.get_vm("plain", "vm-gone") is None


def test_snapshot_revert_and_disk(sim: Sim) -> None:
    sim.provider.create_vm("placed", TEMPLATE, "vm-snap")
    made = sim.find(f"{sim.folder}/placed/vm-snap")
    snapshot = "a" * 32
    sim.provider.create_snapshot("placed", "vm-snap", snapshot)
    sim.provider.create_snapshot("placed", "vm-snap", snapshot)  # idempotent by name
    assert [s.name for s in made.snapshot.rootSnapshotList] == [snapshot]
    sim.provider.revert_snapshot("placed", "vm-snap", snapshot)
    assert made.runtime.powerState == "poweredOn"  # a snapshot of a running VM, memory too
    with pytest.raises(PermanentProviderError, match="has no snapshot"):
        sim.provider.revert_snapshot("placed", "vm-snap", "b" * 32)

    def disks() -> list[Any]:
        from pyVmomi import vim

        return [d for d in made.config.hardware.device if isinstance(d, vim.vm.device.VirtualDisk)]

    before = len(disks())
    sim.provider.add_disk("placed", "vm-snap", 8, "disk-1")
    sim.provider.add_disk("placed", "vm-snap", 8, "disk-1")  # idempotent by label
    sim.provider.add_disk("placed", "vm-snap", 2, "disk-2")
    added = disks()[before:]
    assert [d.capacityInKB for d in added] == [8 * 1024 * 1024, 2 * 1024 * 1024]
    assert all(d.backing.fileName.startswith("[LocalDS_1]") for d in added)
    assert sim.extra(made)["guestinfo.vmpool.disk.disk-1"] == "8"


def test_faults_over_the_wire_are_classified(sim: Sim) -> None:
    wrong = sim.make(password="wrong")
    with pytest.raises(PermanentProviderError, match="InvalidLogin") as info:
        wrong.inventory()
    assert "wrong" not in str(info.value)
    verified = sim.make(insecure=False)
    with pytest.raises(PermanentProviderError, match="certificate"):
        verified.inventory()  # the simulator's certificate is self-signed
    with pytest.raises(PermanentProviderError, match="template 'templates/nope' not found"):
        sim.provider.create_vm("plain", "templates/nope", "vm-x")
    strict = sim.make(create_folders=False)
    with pytest.raises(PermanentProviderError, match=r"folder .* not found"):
        strict.create_vm("plain", TEMPLATE, "vm-y")
    bad_target = VSphereProvider(
        None,
        Keys("k"),
        "vc",
        sim.vcsim.options(fleet_id=sim.fleet),
        pools={"p": {"folder": "templates", "clone_target": "nope"}},
    )
    with pytest.raises(PermanentProviderError, match="clone_target 'nope'"):
        bad_target.create_vm("p", TEMPLATE, "vm-z")


def test_a_failed_task_arrives_as_its_fault(sim: Sim) -> None:
    """A task that fails (powering on a running VM) raises the task's own fault, with
    vSphere's ancestry: what the classification reads."""
    from vmpool.providers.vsphere.faults import VSphereFault

    sim.provider.create_vm("plain", TEMPLATE, "vm-on")
    (ref,) = [n.ref for n in sim.provider.list_fleet() if n.name == "vm-on"]
    with pytest.raises(VSphereFault) as info:
        sim.provider.driver.power_on(ref)
    assert info.value.kinds[:3] == ("InvalidPowerState", "InvalidState", "VimFault")
    with pytest.raises(VSphereFault) as info:
        sim.provider.driver.destroy(ref)  # vCenter destroys no running VM
    assert info.value.is_a("InvalidPowerState")


def test_a_lost_session_is_re_established(sim: Sim) -> None:
    sim.provider.create_vm("plain", TEMPLATE, "vm-s")
    sim.provider.driver.si.content.sessionManager.Logout()  # type: ignore[attr-defined]
    assert [vm.name for vm in sim.provider.inventory()] == ["vm-s"]
    assert sim.provider.calls["connect"] == 2 and sim.provider.calls["health"] == 1

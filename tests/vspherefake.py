"""An in-memory vCenter behind the vSphere provider's adapter interface (tests only).

``FakeVCenter`` holds an inventory (templates, folders, VMs with their extraConfig,
snapshots and disks) shared by the sessions it opens (``session()``: what the provider
is given as ``connect=``). It behaves as a real vCenter where the simulator does not: a
second clone of a name in one folder is ``DuplicateName``; and it fails on demand:
``fail(call, kind, times=, effect=)`` makes the next ``times`` calls of ``call`` raise
vCenter's fault ``kind`` (with its real ancestry, ``FAULT_ANCESTORS``), before doing
anything, or, with ``effect=True``, after doing it (an answer lost on the way back).
``expire_sessions()`` makes every open session answer ``NotAuthenticated``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmpool.providers.vsphere.adapter import (
    DELTA_DISKS_SNAPSHOT,
    MARK_PREFIX,
    CloneRequest,
    PowerState,
    VMInfo,
)
from vmpool.providers.vsphere.faults import VSphereFault

# Each fault's ancestors in vSphere's type hierarchy (pyVmomi's MRO; a test checks it).
FAULT_ANCESTORS: dict[str, tuple[str, ...]] = {
    "DuplicateName": ("VimFault", "MethodFault"),
    "NoPermission": ("SecurityError", "RuntimeFault", "MethodFault"),
    "NotAuthenticated": ("NoPermission", "SecurityError", "RuntimeFault", "MethodFault"),
    "NotFound": ("VimFault", "MethodFault"),
    "InvalidState": ("VimFault", "MethodFault"),
    "InvalidPowerState": ("InvalidState", "VimFault", "MethodFault"),
    "TaskInProgress": ("VimFault", "MethodFault"),
    "InsufficientResourcesFault": ("VimFault", "MethodFault"),
    "InsufficientCpuResourcesFault": ("InsufficientResourcesFault", "VimFault", "MethodFault"),
    "ManagedObjectNotFound": ("RuntimeFault", "MethodFault"),
    "SystemError": ("RuntimeFault", "MethodFault"),
    "InvalidLogin": ("VimFault", "MethodFault"),
    "HostCommunication": ("RuntimeFault", "MethodFault"),
}


def fault(kind: str, message: str = "") -> VSphereFault:
    return VSphereFault((kind, *FAULT_ANCESTORS.get(kind, ("MethodFault",))), message)


@dataclass
class FakeVM:
    ref: str
    name: str
    folder: str
    power: PowerState = "poweredOff"
    extra: dict[str, str] = field(default_factory=dict)
    snapshots: list[str] = field(default_factory=list)
    disks: list[int] = field(default_factory=list)  # sizes in GB, beyond the first
    datastore: str = "ds-0"
    target: str = "cluster-0"
    network: str = "VM Network"
    linked: bool = False
    reverted_to: list[str] = field(default_factory=list)


@dataclass
class Fault:
    call: str
    kind: str
    times: int
    effect: bool


class FakeVCenter:
    """One vCenter's inventory and the faults it is told to give."""

    def __init__(self) -> None:
        self.vms: dict[str, FakeVM] = {}
        self.templates: dict[str, FakeVM] = {
            "templates/debian-12": FakeVM("vm-1", "debian-12", "templates", snapshots=["base"]),
            "templates/bare": FakeVM("vm-2", "bare", "templates"),
        }
        self.folders = {"templates", "vmpooler/debian-12"}
        self.datastores = {"ds-0", "ds-1"}
        self.targets = {"cluster-0", "cluster-1", "host-1"}
        self.networks = {"VM Network", "ci-net"}
        self.calls: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.guest_ip: str | None = None  # what VMware Tools reports of a running VM
        self.sessions = 0
        self.live_sessions: set[int] = set()
        self._refs = itertools.count(100)

    def session(self) -> FakeSession:
        self.calls["connect"] += 1
        self.sessions += 1
        self.live_sessions.add(self.sessions)
        return FakeSession(self, self.sessions)

    def expire_sessions(self) -> None:
        self.live_sessions.clear()

    def fail(self, call: str, kind: str, *, times: int = 1, effect: bool = False) -> None:
        self.faults.append(Fault(call, kind, times, effect))

    def add_vm(
        self,
        name: str,
        folder: str,
        marks: Mapping[str, str] | None = None,
        power: PowerState = "poweredOn",
    ) -> FakeVM:
        """A VM made by someone else (``marks``: its guestinfo.vmpool.* extraConfig)."""
        vm = FakeVM(
            f"vm-{next(self._refs)}",
            name,
            folder,
            power,
            {MARK_PREFIX + k: v for k, v in (marks or {}).items()},
        )
        self.vms[vm.ref] = vm
        return vm

    def named(self, name: str) -> list[FakeVM]:
        return [vm for vm in self.vms.values() if vm.name == name]

    def next_fault(self, call: str) -> Fault | None:
        for f in self.faults:
            if f.call == call and f.times > 0:
                f.times -= 1
                return f
        return None

    def info(self, vm: FakeVM) -> VMInfo:
        marks = {k[len(MARK_PREFIX) :]: v for k, v in vm.extra.items() if k.startswith(MARK_PREFIX)}
        ip = self.guest_ip if vm.power == "poweredOn" else None
        return VMInfo(vm.ref, vm.name, vm.power, marks, ip)


class FakeSession:
    """One session: the adapter interface, every call counted and fault-injectable."""

    def __init__(self, vc: FakeVCenter, number: int) -> None:
        self.vc = vc
        self.number = number
        self.closed = False

    def _do(self, call: str, act: Any) -> Any:
        self.vc.calls[call] += 1
        if self.closed:
            raise ConnectionResetError("session closed")
        if self.number not in self.vc.live_sessions:
            raise fault("NotAuthenticated", "The session is not authenticated.")
        injected = self.vc.next_fault(call)
        if injected is not None and not injected.effect:
            raise fault(injected.kind, f"injected {injected.kind}")
        result = act()
        if injected is not None:
            raise fault(injected.kind, f"injected {injected.kind} (after the effect)")
        return result

    def _vm(self, ref: str) -> FakeVM:
        if ref not in self.vc.vms:
            raise fault("ManagedObjectNotFound", f"managed object not found: {ref}")
        return self.vc.vms[ref]

    # -- the adapter interface -------------------------------------------------------------
    def current_time(self) -> float:
        return float(self._do("current_time", lambda: 1.0e9))

    def list_vms(self, datacenter: str | None, folders: Sequence[str]) -> list[VMInfo]:
        def act() -> list[VMInfo]:
            return [self.vc.info(vm) for vm in self.vc.vms.values() if vm.folder in folders]

        return list(self._do("list_vms", act))

    def clone(self, request: CloneRequest) -> VMInfo:
        return self._do("clone", lambda: self.vc.info(self._clone(request)))  # type: ignore[no-any-return]

    def _clone(self, r: CloneRequest) -> FakeVM:
        source = self.vc.templates.get(r.template)
        if source is None:
            raise fault("NotFound", f"template {r.template!r} not found")
        if r.folder not in self.vc.folders:
            if not r.create_folder:
                raise fault("NotFound", f"folder {r.folder!r} not found")
            self.vc.folders.add(r.folder)
        if r.linked and not source.snapshots and r.template_delta_disks:
            source.snapshots.append(DELTA_DISKS_SNAPSHOT)
        if r.linked and not source.snapshots:
            raise fault("NotFound", "the template has no snapshot")
        for kind, value, known in (
            ("datastore", r.datastore, self.vc.datastores),
            ("clone_target", r.clone_target, self.vc.targets),
            ("network", r.network, self.vc.networks),
        ):
            if value is not None and value not in known:
                raise fault("NotFound", f"{kind} {value!r} not found")
        if any(vm.folder == r.folder and vm.name == r.name for vm in self.vc.vms.values()):
            raise fault("DuplicateName", f"The name '{r.name}' already exists.")
        vm = FakeVM(
            f"vm-{next(self.vc._refs)}",
            r.name,
            r.folder,
            "poweredOff",
            dict(r.extra_config),
            datastore=r.datastore or source.datastore,
            target=r.clone_target or source.target,
            network=r.network or source.network,
            linked=r.linked,
        )
        self.vc.vms[vm.ref] = vm
        return vm

    def power_on(self, ref: str) -> None:
        self._do("power_on", lambda: self._power(ref, "poweredOn"))

    def power_off(self, ref: str) -> None:
        self._do("power_off", lambda: self._power(ref, "poweredOff"))

    def _power(self, ref: str, state: PowerState) -> None:
        vm = self._vm(ref)
        if vm.power == state:
            raise fault("InvalidPowerState", f"the VM is {state} already")
        vm.power = state

    def destroy(self, ref: str) -> None:
        def act() -> None:
            if self._vm(ref).power == "poweredOn":
                raise fault("InvalidPowerState", "the VM is powered on")
            del self.vc.vms[ref]

        self._do("destroy", act)

    def snapshots(self, ref: str) -> list[str]:
        return list(self._do("snapshots", lambda: list(self._vm(ref).snapshots)))

    def create_snapshot(self, ref: str, name: str, memory: bool) -> None:
        self._do("create_snapshot", lambda: self._vm(ref).snapshots.append(name))

    def revert_snapshot(self, ref: str, name: str) -> None:
        def act() -> None:
            vm = self._vm(ref)
            if name not in vm.snapshots:
                raise fault("NotFound", f"no snapshot {name!r}")
            vm.reverted_to.append(name)

        self._do("revert_snapshot", act)

    def extra_config(self, ref: str) -> dict[str, str]:
        return dict(self._do("extra_config", lambda: dict(self._vm(ref).extra)))

    def add_disk(
        self,
        ref: str,
        size_gb: int,
        datacenter: str | None,
        datastore: str | None,
        extra_config: Mapping[str, str],
    ) -> None:
        def act() -> None:
            vm = self._vm(ref)
            if datastore is not None and datastore not in self.vc.datastores:
                raise fault("NotFound", f"datastore {datastore!r} not found")
            vm.disks.append(size_gb)
            vm.extra.update(extra_config)

        self._do("add_disk", act)

    def close(self) -> None:
        self.closed = True

"""The vSphere adapter over SOAP, with pyVmomi (the ``vsphere`` extra).

Only this module (and ``pyvmomi_specs``) import pyVmomi, and only when a provider
first connects: a fleet without a vSphere pool never needs the extra.

Every read is a ``RetrievePropertiesEx`` with explicit property paths, never pyVmomi's
lazy attribute reads (one round trip each, and govmomi's simulator drops the connection
on a lazy read of an unset property). Every task is awaited by reading its state, its
error and its result (nothing else of ``info``: the simulator's task entity for a
snapshot revert is not a ManagedEntity, which pyVmomi refuses to parse). Inventory
lookups (datacenter, folder, template, datastore, cluster, network) are remembered for
the session and forgotten on ``ManagedObjectNotFound``.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from pyVim.connect import Disconnect, SmartConnect
from pyVmomi import vim, vmodl

from vmpool.providers.vsphere import pyvmomi_specs as specs
from vmpool.providers.vsphere.adapter import (
    DELTA_DISKS_SNAPSHOT,
    MARK_PREFIX,
    CloneRequest,
    PowerState,
    VMInfo,
)
from vmpool.providers.vsphere.faults import VSphereFault

__all__ = ["PyVmomiAdapter", "as_fault"]

F = TypeVar("F", bound=Callable[..., Any])
PC = vmodl.query.PropertyCollector
VM_PATHS = ["name", "runtime.powerState", "config.extraConfig", "guest.ipAddress"]


def as_fault(fault: Any) -> VSphereFault:
    """A pyVmomi fault (raised, or a failed task's ``info.error``) as a VSphereFault."""
    kinds = [name for c in type(fault).__mro__ if (name := c.__dict__.get("_wsdlName"))]
    kinds = [k for k in kinds if k not in ("DynamicData", "DataObject")]
    message = getattr(fault, "msg", None) or ""
    if not message:
        messages = [m.message for m in getattr(fault, "faultMessage", None) or () if m.message]
        message = "; ".join(messages)
    return VSphereFault(kinds, str(message))


def _faults(method: F) -> F:
    """The method's vCenter faults raised as VSphereFault.

    A stale reference forgets what the session had looked up."""

    @functools.wraps(method)
    def wrapper(self: PyVmomiAdapter, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except vmodl.MethodFault as fault:
            error = as_fault(fault)
            if error.is_a("ManagedObjectNotFound"):
                self.forget()
            raise error from None

    return cast(F, wrapper)


class PyVmomiAdapter:
    """One authenticated session with vCenter (or govmomi's simulator)."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str,
        password: str,
        *,
        insecure: bool = False,
        ca_file: str | None = None,
        timeout: float = 60.0,
        task_timeout: float = 900.0,
    ) -> None:
        self.task_timeout = task_timeout
        context = None if insecure else ssl.create_default_context(cafile=ca_file)
        try:
            self.si = SmartConnect(
                host=host,
                port=port,
                user=username,
                pwd=password,
                sslContext=context,
                disableSslCertValidation=insecure,
                httpConnectionTimeout=timeout,
            )
        except vmodl.MethodFault as fault:
            raise as_fault(fault) from None
        self.content = self.si.RetrieveContent()
        self._found: dict[tuple[str, ...], Any] = {}
        self._views: dict[str, Any] = {}

    def forget(self) -> None:
        self._found.clear()
        self._views.clear()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a session gone already: nothing to close
            Disconnect(self.si)

    # -- reads -----------------------------------------------------------------------------
    @_faults
    def current_time(self) -> float:
        return float(self.si.CurrentTime().timestamp())

    def _retrieve(self, objects: Sequence[Any], kind: Any, paths: list[str]) -> list[Any]:
        """One RetrievePropertiesEx (and one call per further page)."""
        spec = PC.FilterSpec(
            objectSet=list(objects), propSet=[PC.PropertySpec(type=kind, pathSet=paths)]
        )
        collector = self.content.propertyCollector
        result = collector.RetrievePropertiesEx([spec], PC.RetrieveOptions())
        found = list(result.objects) if result else []
        while result is not None and result.token:
            result = collector.ContinueRetrievePropertiesEx(result.token)
            found += list(result.objects)
        return found

    def _props(self, obj: Any, paths: list[str]) -> dict[str, Any]:
        found = self._retrieve([PC.ObjectSpec(obj=obj, skip=False)], type(obj), paths)
        return {p.name: p.val for p in found[0].propSet} if found else {}

    @_faults
    def list_vms(self, datacenter: str | None, folders: Sequence[str]) -> list[VMInfo]:
        views = [v for v in (self._view(datacenter, f) for f in folders) if v is not None]
        if not views:
            return []
        found = self._retrieve([_view_spec(v) for v in views], vim.VirtualMachine, VM_PATHS)
        return [_vm_info(o) for o in found]

    def _view(self, datacenter: str | None, folder: str) -> Any:
        """A container view of the VMs directly in the folder (None if it is missing)."""
        key = f"{datacenter}\0{folder}"
        if key not in self._views:
            found = self._find(datacenter, "vm/" + folder)
            if not isinstance(found, vim.Folder):
                return None
            views = self.content.viewManager
            self._views[key] = views.CreateContainerView(found, [vim.VirtualMachine], False)
        return self._views[key]

    @_faults
    def snapshots(self, ref: str) -> list[str]:
        tree = self._props(self._vm(ref), ["snapshot.rootSnapshotList"])
        return [node.name for node in _walk(tree.get("snapshot.rootSnapshotList") or [])]

    @_faults
    def extra_config(self, ref: str) -> dict[str, str]:
        options = self._props(self._vm(ref), ["config.extraConfig"]).get("config.extraConfig")
        return {o.key: str(o.value) for o in options or ()}

    # -- changes ---------------------------------------------------------------------------
    @_faults
    def clone(self, request: CloneRequest) -> VMInfo:
        dc = request.datacenter
        source = self._find(dc, "vm/" + request.template)
        if not isinstance(source, vim.VirtualMachine):
            raise VSphereFault(["NotFound"], f"template {request.template!r} not found")
        folder = self._folder(dc, request.folder, request.create_folder)
        source_props = self._props(source, ["snapshot.currentSnapshot", "config.hardware.device"])
        snapshot = source_props.get("snapshot.currentSnapshot") if request.linked else None
        if request.linked and snapshot is None and request.template_delta_disks:
            snapshot = self._delta_disks(source)
        if request.linked and snapshot is None:
            raise VSphereFault(
                ["NotFound"], f"template {request.template!r} has no snapshot to link clones to"
            )
        relocate = specs.relocate(
            datastore=self._named(dc, "datastore", request.datastore),
            placement=self._placement(dc, request.clone_target),
            linked=request.linked,
        )
        card = None
        if request.network:
            network = self._named(dc, "network", request.network)
            card = specs.network_card(source_props.get("config.hardware.device") or [], network)
        spec = specs.clone(relocate, request.extra_config, snapshot, card)
        vm = self._wait(source.CloneVM_Task(folder=folder, name=request.name, spec=spec))
        return _vm_info(
            self._retrieve([PC.ObjectSpec(obj=vm, skip=False)], vim.VirtualMachine, VM_PATHS)[0]
        )

    @_faults
    def power_on(self, ref: str) -> None:
        self._wait(self._vm(ref).PowerOnVM_Task())

    @_faults
    def power_off(self, ref: str) -> None:
        self._wait(self._vm(ref).PowerOffVM_Task())

    @_faults
    def destroy(self, ref: str) -> None:
        self._wait(self._vm(ref).Destroy_Task())

    @_faults
    def create_snapshot(self, ref: str, name: str, memory: bool) -> None:
        task = self._vm(ref).CreateSnapshot_Task(
            name=name, description="vmpool", memory=memory, quiesce=False
        )
        self._wait(task)

    @_faults
    def revert_snapshot(self, ref: str, name: str) -> None:
        tree = self._props(self._vm(ref), ["snapshot.rootSnapshotList"])
        found = [
            n.snapshot for n in _walk(tree.get("snapshot.rootSnapshotList") or []) if n.name == name
        ]
        if not found:
            raise VSphereFault(["NotFound"], f"the VM has no snapshot {name!r}")
        self._wait(found[0].RevertToSnapshot_Task())

    @_faults
    def add_disk(
        self,
        ref: str,
        size_gb: int,
        datacenter: str | None,
        datastore: str | None,
        extra_config: Mapping[str, str],
    ) -> None:
        vm = self._vm(ref)
        devices = self._props(vm, ["config.hardware.device"]).get("config.hardware.device") or []
        store = self._named(datacenter, "datastore", datastore)
        spec = specs.add_disk(devices, size_gb, store, datastore, extra_config)
        self._wait(vm.ReconfigVM_Task(spec=spec))

    # -- helpers ---------------------------------------------------------------------------
    def _delta_disks(self, template: Any) -> Any:
        """Snapshot ``template``: every disk gets a delta disk, the base read-only.

        vmpooler's ``create_template_delta_disks`` adds that layer by reconfiguring the
        template; a snapshot makes the same layer, and linked clones start from it. Two
        workers at once make two snapshots, one a child of the other: either serves."""
        name, why = DELTA_DISKS_SNAPSHOT, "vmpool: linked clones"
        self._wait(
            template.CreateSnapshot_Task(name=name, description=why, memory=False, quiesce=False)
        )
        return self._props(template, ["snapshot.currentSnapshot"]).get("snapshot.currentSnapshot")

    def _vm(self, ref: str) -> Any:
        return vim.VirtualMachine(ref, self.si._stub)

    def _wait(self, task: Any) -> Any:
        """The task's result once it succeeded. Its fault raised if it failed."""
        deadline = time.monotonic() + self.task_timeout
        delay = 0.05
        while True:
            info = self._props(task, ["info.state", "info.error", "info.result"])
            state = info.get("info.state")
            if state == "success":
                return info.get("info.result")
            if state == "error":
                raise as_fault(info.get("info.error"))
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {task._moId} still {state} after {self.task_timeout:g}s")
            time.sleep(delay)  # polling a remote task: vCenter has no push on this path
            delay = min(delay * 1.5, 2.0)

    def _datacenter(self, name: str | None) -> dict[str, Any]:
        """The datacenter's name, VM folder and host folder (one read, kept)."""
        key = ("datacenter", name or "")
        if key not in self._found:
            if name:
                found = self.content.searchIndex.FindByInventoryPath(name)
            else:
                found = self._only_datacenter()
            if not isinstance(found, vim.Datacenter):
                raise VSphereFault(["NotFound"], f"datacenter {name!r} not found")
            props = self._props(found, ["name", "vmFolder", "hostFolder"])
            self._found[key] = {"obj": found, **props}
        return cast(dict[str, Any], self._found[key])

    def _in_view(self, root: Any, kinds: list[Any], recursive: bool, path: str) -> list[Any]:
        """``path`` of every object of ``kinds`` under ``root`` (a throwaway view)."""
        view = self.content.viewManager.CreateContainerView(root, kinds, recursive)
        try:
            return self._retrieve([_view_spec(view)], vim.ManagedEntity, [path])
        finally:
            view.DestroyView()

    def _only_datacenter(self) -> Any:
        found = self._in_view(self.content.rootFolder, [vim.Datacenter], True, "name")
        if len(found) != 1:
            raise VSphereFault(
                ["InvalidArgument"],
                f"vCenter has {len(found)} datacenters: set the provider's datacenter",
            )
        return found[0].obj

    def _find(self, datacenter: str | None, path: str) -> Any:
        """The object at ``path`` below the datacenter, or None."""
        key = ("path", datacenter or "", path)
        if key not in self._found:
            name = self._datacenter(datacenter)["name"]
            found = self.content.searchIndex.FindByInventoryPath(f"{name}/{path}")
            if found is None:
                return None
            self._found[key] = found
        return self._found[key]

    def _folder(self, datacenter: str | None, path: str, create: bool) -> Any:
        """The folder at ``path``, made (each missing part) when ``create``."""
        found = self._find(datacenter, "vm/" + path)
        if isinstance(found, vim.Folder):
            return found
        if not create:
            raise VSphereFault(["NotFound"], f"folder {path!r} not found (create_folders: false)")
        parent = self._datacenter(datacenter)["vmFolder"]
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            here = self._find(datacenter, "vm/" + "/".join(parts[:depth]))
            if here is None:
                try:
                    here = parent.CreateFolder(parts[depth - 1])
                except vim.fault.DuplicateName:  # another worker made it meanwhile
                    here = self._find(datacenter, "vm/" + "/".join(parts[:depth]))
            parent = here
        return parent

    def _named(self, datacenter: str | None, kind: str, name: str | None) -> Any:
        """The datacenter's datastore or network called ``name`` (None for None)."""
        if name is None:
            return None
        key = (kind, datacenter or "", name)
        if key not in self._found:
            items = self._props(self._datacenter(datacenter)["obj"], [kind]).get(kind) or []
            objects = [PC.ObjectSpec(obj=i, skip=False) for i in items]
            names = self._retrieve(objects, vim.ManagedEntity, ["name"])
            match = [o.obj for o in names if o.propSet and o.propSet[0].val == name]
            if not match:
                raise VSphereFault(["NotFound"], f"{kind} {name!r} not found")
            self._found[key] = match[0]
        return self._found[key]

    def _placement(self, datacenter: str | None, target: str | None) -> tuple[Any, Any] | None:
        """(resource pool, host or None) of a cluster, standalone host or host's name."""
        if target is None:
            return None
        key = ("placement", datacenter or "", target)
        if key not in self._found:
            self._found[key] = self._find_placement(datacenter, target)
        return cast(tuple[Any, Any], self._found[key])

    def _find_placement(self, datacenter: str | None, target: str) -> tuple[Any, Any]:
        root = self._datacenter(datacenter)["hostFolder"]
        found = self._in_view(root, [vim.ComputeResource, vim.HostSystem], True, "name")
        named = [o.obj for o in found if o.propSet and o.propSet[0].val == target]
        for obj in named:  # a cluster or a standalone host's compute resource first
            if isinstance(obj, vim.ComputeResource):
                return self._props(obj, ["resourcePool"])["resourcePool"], None
        for obj in named:
            parent = self._props(obj, ["parent"])["parent"]
            return self._props(parent, ["resourcePool"])["resourcePool"], obj
        raise VSphereFault(
            ["NotFound"], f"clone_target {target!r}: no cluster or host of that name"
        )


def _view_spec(view: Any) -> Any:
    """An ObjectSpec reaching every object a container view shows."""
    traverse = PC.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)
    return PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])


def _walk(nodes: Sequence[Any]) -> list[Any]:
    """Every node of a snapshot tree."""
    found: list[Any] = []
    for node in nodes:
        found.append(node)
        found += _walk(node.childSnapshotList or [])
    return found


def _vm_info(obj: Any) -> VMInfo:
    props = {p.name: p.val for p in obj.propSet}
    extra = props.get("config.extraConfig") or ()
    marks = {
        o.key[len(MARK_PREFIX) :]: str(o.value) for o in extra if o.key.startswith(MARK_PREFIX)
    }
    state: PowerState = props.get("runtime.powerState") or "poweredOff"
    return VMInfo(obj.obj._moId, props.get("name", ""), state, marks, props.get("guest.ipAddress"))

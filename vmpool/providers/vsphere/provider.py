"""vSphere, vmpooler's main provider: clones from templates in vCenter (pyVmomi).

What the cloud providers do (``cloud/common.py``: look-up before every create, one
list for any number of statuses, retries with backoff, the circuit breaker, the ready
check), on vCenter's terms:

- **Ownership** is marked in the clone spec's extraConfig (``guestinfo.vmpool.fleet``,
  ``.pool``, ``.request``, ``.vm``, ``.created``, ``.template``), so a VM of ours is
  never unmarked. Every VM the provider lists, powers, snapshots or destroys is one
  carrying this fleet's mark. A hand-made VM in the pool's own folder is never touched.
- **Inventory** is one ``RetrievePropertiesEx`` over container views of the pools'
  folders (name, power state, extraConfig, guest address of every VM in them).
- **Create**: look the VM up by its mark, else clone (linked from the template's
  current snapshot when the pool asks), then power on explicitly. A VM found powered off
  (its power-on lost) is powered on. ``DuplicateName`` from a clone is looked up again.
- **Destroy** powers off first (vCenter refuses to destroy a running VM).
- **Snapshots and disks**, idempotent by the name the API chose: a snapshot of that name,
  or a disk whose mark (``guestinfo.vmpool.disk.<name>``, set in the same reconfigure)
  is there already, is not made again.
- **The session** is checked (``CurrentTime``) after a failure or a minute unused, and
  re-established when it is gone (``NotAuthenticated``, vCenter restarted).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from vmpool.providers.base import (
    Disks,
    PermanentProviderError,
    ProviderError,
    ProviderVM,
    ProviderVMState,
    QuotaExceededError,
    Snapshots,
)
from vmpool.providers.cloud.common import (
    TAG_CREATED,
    TAG_KEYS,
    TAG_POOL,
    TAG_VM,
    CloudProvider,
)
from vmpool.providers.cloud.nodes import created_at
from vmpool.providers.vsphere.adapter import MARK_PREFIX, CloneRequest, VMInfo, VSphereAdapter
from vmpool.providers.vsphere.faults import RECONNECT, VSphereFault, classify
from vmpool.providers.vsphere.options import VSphereOptions, VSpherePoolOptions
from vmpool.providers.vsphere.session import Session, connect, credentials

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = ["VSphereProvider"]

T = TypeVar("T")
DISK_MARK = "disk."
_DISK_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class VSphereProvider(CloudProvider, Snapshots, Disks):
    """``provider_class: vsphere``: docs/providers.md, "vSphere"."""

    options_model = VSphereOptions
    provider_class = "vsphere"
    options: VSphereOptions
    pool_model = VSpherePoolOptions  # the pool keys, for CloudProvider's pool checks

    def __init__(
        self,
        redis: Redis | None,
        keys: Keys,
        name: str,
        options: Mapping[str, Any],
        *,
        pools: Mapping[str, Mapping[str, Any]] | None = None,
        connect: Callable[[], VSphereAdapter] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(redis, keys, name, options, pools=pools, sleep=sleep)
        # each pool's keys, as VSpherePoolOptions (CloudProvider checked them: pool_model)
        self.placement = {pool: VSpherePoolOptions(**given) for pool, given in self.pools.items()}
        self.session = Session(name, connect or self.connect, clock, self.calls)

    # -- the session -----------------------------------------------------------------------
    def credentials(self) -> tuple[str, str]:
        return credentials(self.name, self.options)

    def connect(self) -> VSphereAdapter:
        return connect(self.name, self.options)

    @property
    def driver(self) -> VSphereAdapter:
        """The session's adapter (``make_driver`` is not used: the session connects)."""
        return self.session.adapter()

    def _vs(self, call: Callable[[VSphereAdapter], T]) -> T:
        """One adapter call on the session, its failure classified.

        The fault is kept as the error's ``fault``, and the session marked for a health check
        when the failure may have been the session's."""
        try:
            return call(self.driver)
        except Exception as exc:
            fault = exc if isinstance(exc, VSphereFault) else None
            if isinstance(exc, OSError) or (fault and RECONNECT.intersection(fault.kinds)):
                self.session.suspect()
            error = classify(exc)
            error.fault = fault  # type: ignore[attr-defined]
            raise error from exc

    def _retried(self, what: str, call: Callable[[VSphereAdapter], T]) -> T:
        """An adapter call, counted and retried on transient failures."""
        return self._at_most_once(what, what, _nothing, partial(self._vs, call))

    # -- what CloudProvider asks of a cloud ------------------------------------------------
    def list_fleet(self, marks: tuple[str, ...] = ()) -> list[VMInfo]:
        """One listing per datacenter of the pools' folders (one, as a rule).

        Every VM in them: the caller picks those carrying one of the fleet's ``marks``."""
        by_datacenter: dict[str | None, list[str]] = {}
        for options in self.placement.values():
            dc = options.datacenter or self.options.datacenter
            by_datacenter.setdefault(dc, []).append(options.folder)
        found: list[VMInfo] = []
        for dc, folders in by_datacenter.items():
            found += self._vs(partial(_list, datacenter=dc, folders=sorted(set(folders))))
        return found

    def tags_of(self, node: VMInfo) -> Mapping[str, str]:
        return {"vmpool-" + key: value for key, value in node.marks.items()}

    def launch(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> VMInfo:
        """One clone, marked from its start (its hardware is its template's)."""
        request = self.clone_request(pool, template, name, tags)
        try:
            return self._vs(lambda d: d.clone(request))
        except ProviderError as exc:
            if not _is(exc, "DuplicateName"):
                raise
            # A VM of that name is in the folder: ours (a clone whose answer was lost),
            # or someone else's, which vmpool never touches.
            found = self._find(name)
            if found:
                return found[0]
            raise PermanentProviderError(
                f"{exc}: a VM {name!r} in folder {request.folder!r} is not this fleet's"
            ) from None

    def remove(self, node: VMInfo) -> None:
        """Power off (vCenter destroys no running VM), then destroy."""
        self._vs(partial(_destroy, node))

    def _vm(
        self, node: VMInfo, tags: Mapping[str, str] | None = None, *, probe: bool = True
    ) -> ProviderVM:
        """The VM ``node`` is.

        'running' once powered on and, when ``probe``, past the pool's ready check. Its
        hostname the guest's address (VMware Tools), else its name."""
        tags = tags if tags is not None else self.tags_of(node)
        pool, name = tags.get(TAG_POOL, ""), tags.get(TAG_VM, node.name)
        on = node.power_state == "poweredOn"
        ready = on and (not probe or self._answers(pool, name, node.ip))
        return ProviderVM(
            name=name,
            pool=pool,
            template=node.image,
            state=ProviderVMState.RUNNING if ready else ProviderVMState.BOOTING,
            created_at=created_at(tags, TAG_CREATED, node),
            hostname=node.ip or name,
            address=node.ip or "",
        )

    def _answers(self, pool: str, name: str, address: str | None) -> bool:
        """A powered-on VM's ready check.

        With an address from VMware Tools the clouds' (``ready_check: ssh`` connects to
        ``ssh_port``). Without one only ``ready_check: state`` passes (powered on is
        enough)."""
        if address:
            return self._ready(pool, name, address)
        return bool(self.setting(pool, "ready_check") == "state")

    # -- the Provider protocol -------------------------------------------------------------
    def create_vm(self, pool: str, template: str, name: str, request_id: str = "") -> ProviderVM:
        """Find the VM by its mark, else clone it. Then power it on.

        A transient failure is retried after looking again, so a clone whose answer was
        lost is not made twice. A VM found powered off is powered on."""
        marks = self.tags(pool, name, request_id)
        launch = partial(self.launch, pool, template, name, marks)
        node = self._at_most_once("create", name, lambda: _first(self._find(name)), launch)
        if node.power_state != "poweredOn":
            self._retried("power_on", partial(_power, ref=node.ref, on=True))
            node = replace(node, power_state="poweredOn")
        return self._vm(node)

    def clone_request(
        self, pool: str, template: str, name: str, tags: Mapping[str, str]
    ) -> CloneRequest:
        p = self._placement(pool)
        extra = {MARK_PREFIX + key.removeprefix("vmpool-"): tags[key] for key in TAG_KEYS}
        extra[MARK_PREFIX + "template"] = template
        extra["guestinfo.hostname"] = name  # vmpooler's, read in the guest by VMware Tools
        if p.snapshot_mainMem_ioBlockPages is not None:
            extra["mainMem.ioBlockPages"] = str(p.snapshot_mainMem_ioBlockPages)
        if p.snapshot_mainMem_iowait is not None:
            extra["mainMem.iowait"] = str(p.snapshot_mainMem_iowait)
        linked = p.create_linked_clone
        return CloneRequest(
            datacenter=p.datacenter or self.options.datacenter,
            template=template,
            folder=p.folder,
            name=name,
            extra_config=extra,
            datastore=p.datastore,
            clone_target=p.clone_target,
            linked=self.options.create_linked_clones if linked is None else linked,
            network=p.network,
            create_folder=self.options.create_folders,
            template_delta_disks=self.options.create_template_delta_disks,
        )

    # -- snapshots and disks ---------------------------------------------------------------
    def create_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        node = self._owned(name)
        memory = node.power_state == "poweredOn"  # vmpooler's: the running state too

        def taken() -> bool | None:
            return snapshot in self._retried("snapshots", lambda d: d.snapshots(node.ref)) or None

        act = partial(self._vs, lambda d: d.create_snapshot(node.ref, snapshot, memory))
        self._at_most_once("snapshot", name, taken, act)

    def revert_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        node = self._owned(name)
        try:
            self._retried("revert", lambda d: d.revert_snapshot(node.ref, snapshot))
        except ProviderError as exc:
            if _is(exc, "NotFound"):
                raise PermanentProviderError(f"VM {name!r} has no snapshot {snapshot!r}") from None
            raise

    def add_disk(self, pool: str, name: str, size_gb: int, disk: str) -> None:
        if not _DISK_NAME.match(disk) or not 0 < size_gb <= 65536:
            raise PermanentProviderError(f"invalid disk {disk!r} of {size_gb} GB")
        node = self._owned(name)
        mark = MARK_PREFIX + DISK_MARK + disk
        p = self.placement.get(pool)
        dc = (p.datacenter if p else None) or self.options.datacenter

        def added() -> bool | None:
            return mark in self._retried("read", lambda d: d.extra_config(node.ref)) or None

        def add(d: VSphereAdapter) -> None:
            d.add_disk(node.ref, size_gb, dc, p.datastore if p else None, {mark: str(size_gb)})

        self._at_most_once("disk", name, added, partial(self._vs, add))

    # -- helpers ---------------------------------------------------------------------------
    def _at_most_once(
        self, what: str, name: str, done: Callable[[], T | None], act: Callable[[], T]
    ) -> T:
        """``act()`` unless ``done()`` finds its effect.

        A transient failure is retried after looking again, so an act whose answer was
        lost is not done twice. Quota is not retried: capacity frees in minutes, not in a
        backoff."""
        attempt = 0
        while True:
            found = done()
            if found is not None:
                return found
            try:
                return self._call(what, act, 0)
            except ProviderError as exc:
                if (
                    exc.permanent
                    or isinstance(exc, QuotaExceededError)
                    or attempt >= self.options.retries
                ):
                    raise
                self._wait(attempt, exc, f"{what} {name}")
                attempt += 1

    def _find(self, name: str) -> list[VMInfo]:
        """This fleet's VMs called ``name`` (one listing)."""
        return super()._find(name)

    def _owned(self, name: str) -> VMInfo:
        found = self._find(name)
        if not found:
            raise PermanentProviderError(f"VM {name!r} not found in this fleet")
        return found[0]

    def _placement(self, pool: str) -> VSpherePoolOptions:
        options = self.placement.get(pool)
        if options is None:
            raise PermanentProviderError(
                f"configuration error: pool {pool!r} has no vSphere options (folder, ...)"
                f" for provider {self.name!r}"
            )
        return options


def _nothing() -> None:
    return None


def _first(nodes: list[VMInfo]) -> VMInfo | None:
    return nodes[0] if nodes else None


def _list(adapter: VSphereAdapter, *, datacenter: str | None, folders: list[str]) -> list[VMInfo]:
    return adapter.list_vms(datacenter, folders)


def _is(error: ProviderError, kind: str) -> bool:
    """Whether a classified error was vCenter's fault ``kind`` (or one of its kind)."""
    fault = getattr(error, "fault", None)
    return isinstance(fault, VSphereFault) and fault.is_a(kind)


def _power(adapter: VSphereAdapter, *, ref: str, on: bool) -> None:
    """Power on or off. A VM in that state already is no error."""
    try:
        adapter.power_on(ref) if on else adapter.power_off(ref)
    except VSphereFault as fault:
        if not fault.is_a("InvalidPowerState"):
            raise


def _destroy(node: VMInfo, adapter: VSphereAdapter) -> None:
    """Power off unless off, then destroy.

    A VM gone meanwhile is no error, one powered on meanwhile is powered off again."""
    try:
        if node.power_state != "poweredOff":
            _power(adapter, ref=node.ref, on=False)
        try:
            adapter.destroy(node.ref)
        except VSphereFault as fault:
            if not fault.is_a("InvalidPowerState"):
                raise
            _power(adapter, ref=node.ref, on=False)
            adapter.destroy(node.ref)
    except VSphereFault as fault:
        if not fault.is_a("ManagedObjectNotFound"):
            raise

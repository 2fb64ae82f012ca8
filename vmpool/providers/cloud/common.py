"""What the EC2, GCE and OpenStack providers share: options, tags, retries, ready checks.

A cloud provider (docs/providers.md) keeps no state of its own: the cloud is the truth,
and a VM is found by its tags, set at launch (never after, so there is no untagged
window)::

    vmpool-fleet    the fleet's mark (option ``fleet_id``, by default the fleet's
                    identity, made once per Redis: vmpool.state.fleet_identity)
    vmpool-pool     the pool
    vmpool-request  the request the VM was made for
    vmpool-vm       the VM's name (unique in the fleet)
    vmpool-created  the launch time, whole seconds since the epoch

Every listing is filtered by the fleet's marks (:mod:`.marks`): the inventory holds
only this fleet's VMs, so the reconciler never sees, let alone destroys, a VM someone
else launched in the same account. ``statuses`` answers for any number of VMs with one
list call, which is how the pending sweep checks every booting VM of a provider at once.

Cloud calls go through :meth:`CloudProvider._call` (counted in ``calls``, retried on
transient failures with exponential backoff, ``Retry-After`` respected). A create is
retried only after a tag lookup found no VM of that name, and carries an idempotency
token where the cloud has one, so a lost answer never leaves two instances.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError

from vmpool.providers.base import (
    Capacity,
    PermanentProviderError,
    Provider,
    ProviderError,
    ProviderVM,
    ProviderVMState,
    StatusBatch,
    validate_provider_name,
)
from vmpool.providers.cloud.dns import DnsOptions, PoolDns
from vmpool.providers.cloud.errors import backoff_s, classify, is_final
from vmpool.providers.cloud.marks import Marks, ProviderMarks
from vmpool.providers.cloud.nodes import (
    Node,
    alive,
    created_at,
    node_address,
    node_state,
    node_template,
    port_answers,
)
from vmpool.providers.cloud.options import CloudOptions, Secret
from vmpool.providers.cloud.placement import PoolChecks
from vmpool.providers.options import key_path, problems

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = ["TAG_KEYS", "CloudOptions", "CloudProvider", "Node", "Secret"]

log = logging.getLogger(__name__)

T = TypeVar("T")

TAG_FLEET = "vmpool-fleet"
TAG_POOL = "vmpool-pool"
TAG_REQUEST = "vmpool-request"
TAG_VM = "vmpool-vm"
TAG_CREATED = "vmpool-created"
TAG_KEYS = (TAG_FLEET, TAG_POOL, TAG_REQUEST, TAG_VM, TAG_CREATED)
# ssh ready checks run at once by one statuses() call (each waits ssh_timeout at most).
SSH_CHECKS = 32
# A driver holding temporary credentials is built again this long before they expire.
CREDENTIALS_MARGIN_S = 300.0


class CloudProvider(Provider, StatusBatch, Capacity):
    """The shared half of a libcloud provider.

    Subclasses say how to build the driver, launch a node with tags and list the fleet's
    nodes (each one API call)."""

    options_model: ClassVar[type[CloudOptions]] = CloudOptions
    # the keys a pool may set for this provider (ProviderClass.pool_options)
    pool_model: ClassVar[type[BaseModel]] = PoolChecks
    provider_class: ClassVar[str] = ""
    size_key: ClassVar[str] = ""  # the placement key of the instance size (max_cores)
    tags_request_id: ClassVar[bool] = True  # create_vm(..., request_id=) tags it
    circuit_breaker: ClassVar[bool] = True  # failed creates count toward the breaker

    def __init__(
        self,
        redis: Redis | None,
        keys: Keys,
        name: str,
        options: Mapping[str, Any],
        *,
        pools: Mapping[str, Mapping[str, Any]] | None = None,
        driver: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = validate_provider_name(name)
        self.options = self.parse_options(name, options)
        # each pool's own keys for this provider, as the class's pool model reads them
        self.pools: dict[str, dict[str, Any]] = {
            pool: self.parse_pool(pool, raw, options) for pool, raw in (pools or {}).items()
        }
        self.redis = redis
        self.keys = keys
        self.marks = ProviderMarks(redis, keys, self.name, self.options.fleet_id)
        self._driver = driver
        # When the credentials make_driver used expire (Unix time). None: never.
        self.driver_expires_at: float | None = None
        self._cores: dict[str, int] = {}
        self._dns: dict[str, PoolDns | None] = {}
        self._records: dict[str, str] = {}  # DNS records this process made: name -> address
        self.sleep = sleep
        self.calls: Counter[str] = Counter()  # cloud API calls by kind (tests count them)

    @classmethod
    def parse_options(cls, name: str, options: Mapping[str, Any]) -> Any:
        try:
            return cls.options_model.model_validate(dict(options))
        except ValidationError as exc:
            loc, problem = problems(exc)[0]
            raise PermanentProviderError(
                f"configuration error: {key_path(loc, f'providers.{name}')}: {problem}"
            ) from None

    @classmethod
    def parse_pool(
        cls, pool: str, raw: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The keys a pool set, validated by its model (the provider's options as context)."""
        try:
            model = cls.pool_model.model_validate(dict(raw), context={"provider": dict(options)})
        except ValidationError as exc:
            loc, problem = problems(exc)[0]
            raise PermanentProviderError(
                f"configuration error: {key_path(loc, f'pools.{pool}')}: {problem}"
            ) from None
        return model.model_dump(exclude_none=True)

    def setting(self, pool: str, key: str) -> Any:
        """A placement key for ``pool``: the pool's own value, else the provider's."""
        value = self.pools.get(pool, {}).get(key)
        return value if value is not None else getattr(self.options, key, None)

    def limits(self) -> tuple[int, int]:
        """(max_instances, max_cores), 0 for none (the Capacity protocol)."""
        return self.options.max_instances or 0, self.options.max_cores or 0

    def cores(self, pool: str) -> int:
        """The vCPUs of one VM of ``pool``, asked of the cloud once per size and kept."""
        size = str(self.setting(pool, self.size_key))
        if size not in self._cores:
            self._cores[size] = self.size_cores(pool, size)
        return self._cores[size]

    def size_cores(self, pool: str, size: str) -> int:
        """The vCPUs of instance size ``size``, as the cloud says."""
        raise NotImplementedError

    def user_tags(self, pool: str) -> dict[str, str]:
        """The operator's tags for ``pool``'s VMs: the provider's, then the pool's."""
        return {**self.options.tags, **self.pools.get(pool, {}).get("tags", {})}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, options={self.options!r})"

    # -- what each cloud implements --------------------------------------------------------
    def make_driver(self) -> Any:
        raise NotImplementedError

    def launch(self, pool: str, template: str, name: str, tags: Mapping[str, str]) -> Node:
        """One create call (with the pool's placement: :meth:`setting`).

        The node carries ``tags`` (and the operator's, :meth:`user_tags`) from its first
        moment."""
        raise NotImplementedError

    def list_fleet(self, marks: tuple[str, ...]) -> list[Node]:
        """One list call: the nodes tagged with one of ``marks`` (any not terminated)."""
        raise NotImplementedError

    def tags_of(self, node: Node) -> Mapping[str, str]:
        raise NotImplementedError

    def remove(self, node: Node) -> None:
        """One destroy call."""
        self.driver.destroy_node(node)

    def label(self, value: str) -> str:
        """A tag value as the cloud allows it (GCE labels are restricted)."""
        return value

    # -- the Provider protocol -------------------------------------------------------------
    @property
    def fleet_id(self) -> str:
        """The mark new VMs get: the ``fleet_id`` option, else the fleet's identity."""
        return self.marks.now().create

    @property
    def driver(self) -> Any:
        """The libcloud driver, built on first use.

        Built again before the temporary credentials it holds expire (``driver_expires_at``,
        set by ``make_driver``)."""
        expiry = self.driver_expires_at
        if self._driver is None or (
            expiry is not None and time.time() > expiry - CREDENTIALS_MARGIN_S
        ):
            self._driver = self.make_driver()
        return self._driver

    def create_vm(self, pool: str, template: str, name: str, request_id: str = "") -> ProviderVM:
        """Find the VM by its tag, else launch it.

        A transient failure is retried after looking again, so a create whose answer was
        lost is not made twice."""
        tags = self.tags(pool, name, request_id)
        attempt = 0
        while True:
            found = self._find(name)
            if found:
                return self._vm(found[0])
            try:
                launch = partial(self.launch, pool, template, name, tags)
                node = self._call("create", launch, 0)
                return self._vm(node, tags)
            except ProviderError as exc:
                if is_final(exc) or attempt >= self.options.retries:
                    raise
                self._wait(attempt, exc, "create " + name)
                attempt += 1

    def get_vm(self, pool: str, name: str) -> ProviderVM | None:
        return self.statuses([name]).get(name)

    def is_ready(self, pool: str, name: str) -> bool:
        vm = self.get_vm(pool, name)
        return vm is not None and vm.state == ProviderVMState.RUNNING

    def statuses(self, names: Collection[str]) -> dict[str, ProviderVM | None]:
        """Every VM of ``names`` as the cloud sees it now, None for those it does not hold.

        'running' once the pool's ready check passes, 'failed' when the cloud says it never
        will. One list call for all, not retried (the next check asks again, so a sweep never
        waits out a backoff). The ssh checks of the running VMs run side by side,
        ``ssh_timeout`` each."""
        nodes = self._by_name(retries=0)
        held = [nodes[name] for name in names if name in nodes]
        with ThreadPoolExecutor(max_workers=max(1, min(SSH_CHECKS, len(held)))) as pool:
            vms = {vm.name: vm for vm in pool.map(self._vm, held)}
        return {name: vms.get(name) for name in names}

    def destroy_vm(self, pool: str, name: str) -> bool:
        """Destroy the VM's instances and DNS record (a record left fails the destroy)."""
        found = self._find(name)
        for node in found:  # several only if someone else made a copy: none stays
            self._call("destroy", partial(self.remove, node))
            log.info("%s: destroyed %s (%s)", self.name, name, getattr(node, "id", "?"))
        pools = {pool} | {self.tags_of(node).get(TAG_POOL, "") for node in found}
        for dns in filter(None, (self.dns_for(p) for p in pools)):
            self._call("dns", partial(dns.withdraw, name))
            self._records.pop(name, None)
        return bool(found)

    def inventory(self) -> list[ProviderVM]:
        """Every fleet VM the cloud holds: one list call, no ready check (what exists)."""
        marks = self.marks.now()
        owned = {self.label(mark) for mark in marks.owned}
        return [
            replace(self._vm(node, probe=False), owned=self.tags_of(node)[TAG_FLEET] in owned)
            for node in self._by_name(marks=marks).values()
        ]

    # -- helpers ---------------------------------------------------------------------------
    def tags(self, pool: str, name: str, request_id: str) -> dict[str, str]:
        raw = {
            TAG_FLEET: self.fleet_id,
            TAG_POOL: pool,
            TAG_REQUEST: request_id,
            TAG_VM: name,
            TAG_CREATED: str(int(time.time())),
        }
        return {key: self.label(value) for key, value in raw.items()}

    def _fleet_nodes(self, retries: int | None = None, marks: Marks | None = None) -> list[Node]:
        listed = (marks or self.marks.now()).listed
        labels = {self.label(mark) for mark in listed}
        nodes = self._call("list", partial(self.list_fleet, listed), retries)
        return [n for n in nodes if self.tags_of(n).get(TAG_FLEET) in labels and alive(n)]

    def _by_name(self, retries: int | None = None, marks: Marks | None = None) -> dict[str, Node]:
        nodes = self._fleet_nodes(retries, marks)
        return {self.tags_of(n)[TAG_VM]: n for n in nodes if self.tags_of(n).get(TAG_VM)}

    def _find(self, name: str) -> list[Node]:
        return [n for n in self._fleet_nodes() if self.tags_of(n).get(TAG_VM) == name]

    def _call(self, what: str, call: Callable[[], T], retries: int | None = None) -> T:
        """One cloud call, counted. Transient failures retried with backoff."""
        limit = self.options.retries if retries is None else retries
        attempt = 0
        while True:
            self.calls[what] += 1
            try:
                return call()
            except Exception as exc:
                error = classify(exc)
                if is_final(error) or attempt >= limit:
                    raise error from exc
                self._wait(attempt, error, what)
                attempt += 1

    def _wait(self, attempt: int, error: ProviderError, what: str) -> None:
        delay = backoff_s(attempt, error, self.options.backoff, self.options.max_backoff)
        log.info("%s: %s failed (%s); retry in %.1fs", self.name, what, error, delay)
        self.sleep(delay)

    def failure(self, node: Node) -> str:
        """The cloud's words when ``node`` will never boot (ERROR, stopped booting), else ''."""
        return ""

    def _vm(
        self, node: Node, tags: Mapping[str, str] | None = None, *, probe: bool = True
    ) -> ProviderVM:
        """The VM ``node`` is.

        ``probe``: run the pool's ready check on a running one (else 'running' is what the
        cloud says)."""
        tags = tags if tags is not None else self.tags_of(node)
        pool = tags.get(TAG_POOL, "")
        address = node_address(node)
        error = self.failure(node)
        if error:
            state = ProviderVMState.FAILED
        elif node_state(node) == "running" and address:
            ready = not probe or self._ready(pool, tags.get(TAG_VM, ""), address)
            state = ProviderVMState.RUNNING if ready else ProviderVMState.BOOTING
        else:
            state = ProviderVMState.BOOTING
        return ProviderVM(
            name=tags.get(TAG_VM, str(getattr(node, "name", ""))),
            pool=pool,
            template=node_template(node),
            state=state,
            created_at=created_at(tags, TAG_CREATED, node),
            hostname=address or tags.get(TAG_VM, ""),
            address=address or "",
            error=error,
        )

    def _ready(self, pool: str, name: str, address: str) -> bool:
        """The pool's ready check of a running VM with an address, then its DNS record.

        The record is checked when the pool has ``dns``: a VM whose name does not resolve is
        not ready."""
        if self.setting(pool, "ready_check") != "state":
            port = self.setting(pool, "ssh_port")
            if not port_answers(address, port, self.options.ssh_timeout):
                return False
        return self._published(pool, name, address)

    def dns_for(self, pool: str) -> PoolDns | None:
        """The DNS records of ``pool``'s VMs, None when the pool has no ``dns``."""
        if pool not in self._dns:
            keys = self.pools.get(pool, {})
            dns = keys.get("dns")
            self._dns[pool] = (
                PoolDns(DnsOptions.model_validate(dns), keys.get("domain") or "") if dns else None
            )
        return self._dns[pool]

    def _published(self, pool: str, name: str, address: str) -> bool:
        dns = self.dns_for(pool)
        if dns is None or not name or self._records.get(name) == address:
            return True
        try:
            self._call("dns", partial(dns.publish, name, address), 0)
        except Exception as exc:  # the next check tries again
            log.warning("%s: DNS record of %s not made yet: %s", self.name, name, exc)
            return False
        self._records[name] = address
        return True

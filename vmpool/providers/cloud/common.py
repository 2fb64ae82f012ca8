"""What the EC2, GCE and OpenStack providers share: options, tags, retries, ready checks.

A cloud provider (docs/providers.md) keeps no state of its own: the cloud is the truth,
and a VM is found by its tags, set at launch (never after, so there is no untagged
window)::

    vmpool-fleet    the fleet id (option ``fleet_id``; default: the Redis key prefix)
    vmpool-pool     the pool
    vmpool-request  the request the VM was made for
    vmpool-vm       the VM's name (unique in the fleet)
    vmpool-created  the launch time, whole seconds since the epoch

Every listing is filtered by the fleet tag: the inventory holds only this fleet's VMs,
so the reconciler never sees, let alone destroys, a VM someone else launched in the
same account. ``statuses`` answers for any number of VMs with one list call, which is
how the pending sweep checks every booting VM of a provider at once.

Cloud calls go through :meth:`CloudProvider._call` (counted in ``calls``, retried on
transient failures with exponential backoff, ``Retry-After`` respected); a create is
retried only after a tag lookup found no VM of that name, and carries an idempotency
token where the cloud has one, so a lost answer never leaves two instances.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationError

from vmpool.providers.base import (
    PermanentProviderError,
    ProviderError,
    ProviderVM,
    validate_provider_name,
)
from vmpool.providers.cloud.errors import classify, retry_after_of
from vmpool.providers.options import expect, integer, key_path, number, problems

if TYPE_CHECKING:
    from redis import Redis

    from vmpool.state.keys import Keys

__all__ = ["TAG_KEYS", "CloudOptions", "CloudProvider", "Node", "Secret"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Node = Any  # a libcloud Node; typed loosely so libcloud stays an optional import

TAG_FLEET = "vmpool-fleet"
TAG_POOL = "vmpool-pool"
TAG_REQUEST = "vmpool-request"
TAG_VM = "vmpool-vm"
TAG_CREATED = "vmpool-created"
TAG_KEYS = (TAG_FLEET, TAG_POOL, TAG_REQUEST, TAG_VM, TAG_CREATED)
# ssh ready checks run at once by one statuses() call (each waits ssh_timeout at most).
SSH_CHECKS = 32



def _secret_text(value: Any) -> Any:
    """A number given for a secret is its text: never a type error that would quote it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


# A secret option: shown as '**********' by any repr, log line or error message.
Secret = Annotated[SecretStr, BeforeValidator(_secret_text)]
Seconds = Annotated[
    float,
    Field(ge=0, le=3600, allow_inf_nan=False),
    expect("a number of seconds from 0 to 3600", number),
]
Retries = Annotated[int, Field(ge=0, le=20), expect("an integer from 0 to 20", integer)]
ReadyCheck = Annotated[Literal["ssh", "state"], expect("ssh or state")]
PortNumber = Annotated[int, Field(ge=1, le=65535), expect("a port from 1 to 65535", integer)]


class CloudOptions(BaseModel):
    """Options every cloud provider takes (each cloud adds its own). Secrets are
    ``SecretStr``: a repr, a log line or ``vmpool config show`` never shows them."""

    model_config = ConfigDict(frozen=True, extra="ignore", hide_input_in_errors=True)

    fleet_id: str | None = Field(
        None, description="The fleet tag's value (default: the Redis key prefix)"
    )
    ready_check: ReadyCheck = Field(
        "ssh",
        description="ssh: TCP connect to ssh_port (vmpooler's check); state: running with"
        " an address",
    )
    ssh_port: PortNumber = Field(22, description="The port the ssh ready check connects to")
    ssh_timeout: Seconds = Field(2.0, description="How long one ssh ready check waits")
    retries: Retries = Field(4, description="Retries of a call that failed transiently")
    backoff: Seconds = Field(1.0, description="The first retry's delay; doubled each time")
    max_backoff: Seconds = Field(60.0, description="The longest wait (Retry-After included)")


class CloudProvider:
    """The shared half of a libcloud provider; subclasses say how to build the driver,
    launch a node with tags and list the fleet's nodes (each one API call)."""

    options_model: ClassVar[type[CloudOptions]] = CloudOptions
    provider_class: ClassVar[str] = ""
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
        # each pool's own keys for this provider (the class's pool model validated them)
        self.pools: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (pools or {}).items()}
        self.fleet_id = self.options.fleet_id or keys.prefix
        self._driver = driver
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, options={self.options!r})"

    # -- what each cloud implements --------------------------------------------------------
    def make_driver(self) -> Any:
        raise NotImplementedError

    def launch(
        self, pool: str, template: str, name: str, tags: Mapping[str, str], size: str | None
    ) -> Node:
        """One create call; the node carries ``tags`` from its first moment. ``size``:
        the pool's instance size, None for the provider's option."""
        raise NotImplementedError

    def list_fleet(self) -> list[Node]:
        """One list call: the nodes tagged with this fleet (any not terminated)."""
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
    def driver(self) -> Any:
        if self._driver is None:
            self._driver = self.make_driver()
        return self._driver

    def create_vm(
        self, pool: str, template: str, name: str, request_id: str = "", size: str | None = None
    ) -> ProviderVM:
        """Find the VM by its tag, else launch it; a transient failure is retried after
        looking again, so a create whose answer was lost is not made twice."""
        tags = self.tags(pool, name, request_id)
        attempt = 0
        while True:
            found = self._find(name)
            if found:
                return self._vm(found[0])
            try:
                launch = partial(self.launch, pool, template, name, tags, size)
                node = self._call("create", launch, 0)
                return self._vm(node, tags)
            except ProviderError as exc:
                if exc.permanent or attempt >= self.options.retries:
                    raise
                self._wait(attempt, exc, "create " + name)
                attempt += 1

    def get_vm(self, pool: str, name: str) -> ProviderVM | None:
        return self.statuses([name]).get(name)

    def is_ready(self, pool: str, name: str) -> bool:
        vm = self.get_vm(pool, name)
        return vm is not None and vm.state == "running"

    def statuses(self, names: Collection[str]) -> dict[str, ProviderVM | None]:
        """Every VM of ``names`` as the cloud sees it now ('running' once the ready
        check passes), None for those it does not hold: one list call for all, not
        retried (the next check asks again, so a sweep never waits out a backoff).
        The ssh checks of the running VMs run side by side, ``ssh_timeout`` each."""
        nodes = self._by_name(retries=0)
        held = [nodes[name] for name in names if name in nodes]
        with ThreadPoolExecutor(max_workers=max(1, min(SSH_CHECKS, len(held)))) as pool:
            vms = dict(zip((id(n) for n in held), pool.map(self._vm, held), strict=True))
        return {name: vms[id(nodes[name])] if name in nodes else None for name in names}

    def destroy_vm(self, pool: str, name: str) -> bool:
        found = self._find(name)
        for node in found:  # several only if someone else made a copy: none stays
            self._call("destroy", partial(self.remove, node))
            log.info("%s: destroyed %s (%s)", self.name, name, getattr(node, "id", "?"))
        return bool(found)

    def inventory(self) -> list[ProviderVM]:
        return [self._vm(node) for node in self._by_name().values()]

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

    def _fleet_nodes(self, retries: int | None = None) -> list[Node]:
        fleet = self.label(self.fleet_id)
        nodes = self._call("list", self.list_fleet, retries)
        return [n for n in nodes if self.tags_of(n).get(TAG_FLEET) == fleet and _alive(n)]

    def _by_name(self, retries: int | None = None) -> dict[str, Node]:
        nodes = self._fleet_nodes(retries)
        return {self.tags_of(n)[TAG_VM]: n for n in nodes if self.tags_of(n).get(TAG_VM)}

    def _find(self, name: str) -> list[Node]:
        return [n for n in self._fleet_nodes() if self.tags_of(n).get(TAG_VM) == name]

    def _call(self, what: str, call: Callable[[], T], retries: int | None = None) -> T:
        """One cloud call, counted; transient failures retried with backoff."""
        limit = self.options.retries if retries is None else retries
        attempt = 0
        while True:
            self.calls[what] += 1
            try:
                return call()
            except Exception as exc:
                error = classify(exc)
                if error.permanent or attempt >= limit:
                    raise error from exc
                self._wait(attempt, error, what)
                attempt += 1

    def _wait(self, attempt: int, error: ProviderError, what: str) -> None:
        delay = self.options.backoff * (2**attempt)
        asked = retry_after_of(error)
        if asked is not None:
            delay = max(delay, asked)
        delay = min(delay, self.options.max_backoff)
        log.info("%s: %s failed (%s); retry in %.1fs", self.name, what, error, delay)
        self.sleep(delay)

    def _vm(self, node: Node, tags: Mapping[str, str] | None = None) -> ProviderVM:
        tags = tags if tags is not None else self.tags_of(node)
        address = _address(node)
        return ProviderVM(
            name=tags.get(TAG_VM, str(getattr(node, "name", ""))),
            pool=tags.get(TAG_POOL, ""),
            template=_template(node),
            state="running" if self._ready(node, address) else "booting",
            created_at=_created(tags),
            hostname=address or tags.get(TAG_VM, ""),
        )

    def _ready(self, node: Node, address: str | None) -> bool:
        if _state(node) != "running" or not address:
            return False
        if self.options.ready_check == "state":
            return True
        try:
            with socket.create_connection(
                (address, self.options.ssh_port), timeout=self.options.ssh_timeout
            ):
                return True
        except OSError:
            return False


def _template(node: Node) -> str:
    extra = getattr(node, "extra", None) or {}
    image = getattr(node, "image", None) or extra.get("image_id") or extra.get("imageId") or ""
    return str(getattr(image, "id", image) if not isinstance(image, str) else image)


def _state(node: Node) -> str:
    return str(getattr(node, "state", "")).lower()


def _alive(node: Node) -> bool:
    return _state(node) not in ("terminated", "terminating", "shutting-down")


def _address(node: Node) -> str | None:
    for ips in (getattr(node, "public_ips", None), getattr(node, "private_ips", None)):
        for ip in ips or ():
            if ip:
                return str(ip)
    return None


def _created(tags: Mapping[str, str]) -> float:
    """The launch time from the tag; a node without it counts as just made, so the
    reconciler's grace protects it rather than a zero that would not."""
    try:
        return float(tags[TAG_CREATED])
    except (KeyError, ValueError):
        return time.time()

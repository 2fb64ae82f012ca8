"""A fake cloud whose VMs live in Redis, so workers, the API and the auditor share one view.

Why Redis and not process memory: vmpool runs many worker processes (maybe on several
machines). A VM one of them created must be visible to the one that destroys it and to the
reconciler that audits the inventory. Why the server's clock (``TIME``) and not the local
one: processes on different machines must agree on when a VM finished booting.

Why deterministic: every random decision about a VM (its boot time, whether its create
fails, whether it never becomes ready, whether the n-th destroy attempt fails) comes from
``random.Random(f"{seed}:{provider}:{name}:{what}")``. A seeded chaos run therefore
repeats exactly whatever order the workers happen to run in, and no global random state
is touched.

Storage (see vmpool/state/keys.py)::

    keys.sim_vm(provider, name)      hash  name, pool, template, state, created_at,
                                           ready_at, never_ready, destroy_attempts
    keys.sim_inventory(provider)     set   every name the provider holds

Invariant: a name is in the inventory set if and only if its hash exists. Create and
destroy keep it by writing both in one Lua script. Nothing else writes these keys.

The stored ``state`` field is always ``booting``. The state a reader sees is derived from
``ready_at`` against the server clock at read time, so no process has to flip it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from vmpool.ids import validate_pool_name, validate_vm_name
from vmpool.providers.base import (
    CreateBatch,
    CreateOrder,
    Disks,
    InstantCreates,
    PermanentProviderError,
    Provider,
    ProviderVM,
    ProviderVMState,
    Snapshots,
    StatusBatch,
    TransientProviderError,
    validate_provider_name,
)
from vmpool.providers.simulated_options import SimulatedOptions
from vmpool.providers.simulated_records import created_vm, decoded, listed_vm, seconds, text, vm_of
from vmpool.state.lua import ScriptCall, read_script, run_pipelined

if TYPE_CHECKING:
    from redis import Redis
    from redis.commands.core import Script

    from vmpool.state.keys import Keys

__all__ = [
    "ListingSimulatedProvider",
    "SimulatedOptions",
    "SimulatedProvider",
    "simulated_provider",
]

log = logging.getLogger(__name__)

# -- Lua scripts (next to this module, each file's header giving keys, args, returns and
# the invariant it protects) ----------------------------------------------------------------


def _lua(name: str) -> str:
    return read_script("vmpool.providers", name)


_CREATE_LUA = _lua("simulated_create.lua")
_DESTROY_ATTEMPT_LUA = _lua("simulated_destroy_attempt.lua")
_DESTROY_LUA = _lua("simulated_destroy.lua")
_ANNOTATE_LUA = _lua("simulated_annotate.lua")
_LIST_LUA = _lua("simulated_list.lua")

# VMs per call of the list (a cloud's page: EC2's DescribeInstances returns up to 1000).
LIST_PAGE: Final = 1000


class SimulatedProvider(Provider, CreateBatch, InstantCreates, Snapshots, Disks):
    """A provider whose cloud is a pair of Redis keys per instance name.

    Names are unique within one provider instance (as hostnames are in a real cloud), so
    lookups go by name alone. The ``pool`` argument of get/ready/destroy is accepted for
    the provider interface and not used as a filter, so a caller that recorded a VM under
    the wrong pool can still find and destroy it.
    """

    # no tags to put a request id in. Its failures are the chaos tests' input, not an outage
    tags_request_id: ClassVar[bool] = False
    circuit_breaker: ClassVar[bool] = False

    def __init__(
        self, redis: Redis, keys: Keys, name: str, options: Mapping[str, Any] | None = None
    ) -> None:
        self.name = validate_provider_name(name)
        self.options = SimulatedOptions.parse(options or {})
        self._redis = redis
        self._keys = keys
        self._create_script = redis.register_script(_CREATE_LUA)
        self._destroy_attempt_script = redis.register_script(_DESTROY_ATTEMPT_LUA)
        self._destroy_script = redis.register_script(_DESTROY_LUA)
        self._annotate_script = redis.register_script(_ANNOTATE_LUA)

    def __repr__(self) -> str:
        return f"SimulatedProvider(name={self.name!r}, options={self.options!r})"

    def creates_at_once(self) -> bool:
        """Its creates are a script on Redis: at once, unless a create latency is set."""
        return self.options.create_latency_s == 0

    @property
    def scripts(self) -> list[Script]:
        """Its scripts on the simulated cloud's Redis (loaded as a worker starts)."""
        return [
            self._create_script,
            self._destroy_attempt_script,
            self._destroy_script,
            self._annotate_script,
        ]

    # -- deterministic decisions -----------------------------------------------------------
    def _rng(self, vm_name: str, what: str) -> random.Random:
        """The one source of randomness for a decision about one VM: seeded, never global."""
        return random.Random(f"{self.options.seed}:{self.name}:{vm_name}:{what}")

    def _roll(self, vm_name: str, what: str, percent: float) -> bool:
        # random() is in [0, 1): 0% never fires, 100% always does.
        return percent > 0 and self._rng(vm_name, what).random() * 100 < percent

    def boot_seconds_for(self, vm_name: str) -> float:
        """How long VM ``vm_name`` takes to boot under this provider's seed."""
        low, high = self.options.boot_min_s, self.options.boot_max_s
        if low == high:
            return low
        return self._rng(vm_name, "boot").uniform(low, high)

    def create_fails_for(self, vm_name: str) -> bool:
        """Whether creating VM ``vm_name`` fails (create_fail_percent), under this seed."""
        return self._roll(vm_name, "create", self.options.create_fail_percent)

    def never_ready_for(self, vm_name: str) -> bool:
        """Whether VM ``vm_name`` never becomes ready (ready_fail_percent), under this seed."""
        return self._roll(vm_name, "ready", self.options.ready_fail_percent)

    def destroy_fails_for(self, vm_name: str, attempt: int) -> bool:
        """Whether the ``attempt``-th destroy of VM ``vm_name`` fails (destroy_fail_percent)."""
        return self._roll(vm_name, f"destroy:{attempt}", self.options.destroy_fail_percent)

    # -- the provider interface ------------------------------------------------------------
    def create_vm(self, pool: str, template: str, name: str, request_id: str = "") -> ProviderVM:
        """Create VM ``name`` in ``pool`` from ``template``, or return it if it exists.

        Raises PermanentProviderError for a template listed in ``permanent_fail_templates``
        and TransientProviderError for a seeded create failure. Neither leaves anything in
        the inventory.
        """
        answer = self._before_write(CreateOrder(pool, template, name, request_id))
        if isinstance(answer, Exception):
            raise answer
        if answer is not None:
            return answer
        return self._write(
            pool, template, name, self.boot_seconds_for(name), self.never_ready_for(name)
        )

    def create_vms(self, orders: Sequence[CreateOrder]) -> list[ProviderVM | Exception]:
        """:meth:`create_vm` for each order, the writes of all in one round trip (a cloud's
        bulk create): each VM written by its own script, failing alone."""
        answers = [self._before_write(order) for order in orders]
        writes = [order for order, answer in zip(orders, answers, strict=True) if answer is None]
        calls = [self._write_call(o.pool, o.template, o.name) for o in writes]
        written = iter(run_pipelined(self._redis, calls))
        out: list[ProviderVM | Exception] = []
        for answer in answers:
            if answer is None:
                reply = next(written)
                answer = reply if isinstance(reply, Exception) else created_vm(reply)
            out.append(answer)
        return out

    def _before_write(self, order: CreateOrder) -> ProviderVM | Exception | None:
        """What a create of ``order`` answers before any write: its error, or a VM planted
        under its name; None when it is to be written."""
        name, pool, template = order.name, order.pool, order.template
        try:
            validate_vm_name(name)
            validate_pool_name(pool)
        except Exception as exc:
            return exc
        if template in self.options.permanent_fail_templates:
            return PermanentProviderError(
                f"simulated provider {self.name!r}: template {template!r} not found"
            )
        if self.options.create_latency_s > 0:
            time.sleep(self.options.create_latency_s)
        if self.create_fails_for(name):
            # A VM planted under this name (leak_vm) still exists: idempotence wins.
            existing = self.get_vm(pool, name)
            if existing is not None:
                return existing
            return TransientProviderError(
                f"simulated create failure for VM {name!r} in pool {pool!r}"
                f" (provider {self.name!r})"
            )
        return None

    def is_ready(self, pool: str, name: str) -> bool:
        """True once the VM's boot time has passed on the server clock.

        A VM that does not exist is not ready (False, not an error): the worker's boot
        timeout then fails it, as vmpooler's failed socket check does.
        """
        vm = self.get_vm(pool, name)
        return vm is not None and vm.state == ProviderVMState.RUNNING

    def destroy_vm(self, pool: str, name: str) -> bool:
        """Destroy the VM. True if one was destroyed, False if there was none.

        A seeded failure (destroy_fail_percent) raises TransientProviderError and leaves
        the VM in place. Each attempt is counted in the VM's hash so the n-th retry gets
        its own decision and a retried destroy eventually succeeds.
        """
        vm_key = self._keys.sim_vm(self.name, name)
        attempt = int(self._destroy_attempt_script(keys=[vm_key]))
        if attempt == 0:
            return False
        if self.destroy_fails_for(name, attempt):
            raise TransientProviderError(
                f"simulated destroy failure for VM {name!r} (attempt {attempt},"
                f" provider {self.name!r})"
            )
        destroyed = self._destroy_script(
            keys=[vm_key, self._keys.sim_inventory(self.name)], args=[name]
        )
        return bool(int(destroyed))

    def get_vm(self, pool: str, name: str) -> ProviderVM | None:
        """The VM as of the server's clock now, or None if the provider holds no such VM."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hgetall(self._keys.sim_vm(self.name, name))
        pipe.time()
        fields, server_time = pipe.execute()
        if not fields:
            return None
        return vm_of(decoded(fields), seconds(server_time))

    def inventory(self) -> list[ProviderVM]:
        """Every VM this provider instance holds, all pools, sorted by name."""
        members = self._redis.smembers(self._keys.sim_inventory(self.name))
        names = sorted(text(member) for member in members)
        if not names:
            return []
        pipe = self._redis.pipeline(transaction=True)
        for name in names:
            pipe.hgetall(self._keys.sim_vm(self.name, name))
        pipe.time()
        *records, server_time = pipe.execute()
        now = seconds(server_time)
        # A name destroyed between SMEMBERS and the pipeline has an empty hash: skip it.
        return [vm_of(decoded(fields), now) for fields in records if fields]

    # -- snapshots and disks (vmpool.providers.Snapshots, Disks) ----------------------------
    def create_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        """Take snapshot ``snapshot`` of VM ``name`` (nothing if it was taken already)."""
        self._annotate(name, f"snapshot:{snapshot}", "taken", "add")

    def revert_snapshot(self, pool: str, name: str, snapshot: str) -> None:
        """Revert VM ``name`` to ``snapshot``. PermanentProviderError if it has none."""
        self._annotate(name, f"snapshot:{snapshot}", "", "revert")

    def add_disk(self, pool: str, name: str, size_gb: int, disk: str) -> None:
        """Attach disk ``disk`` of ``size_gb`` GB to VM ``name`` (once per label)."""
        if size_gb < 1:
            raise PermanentProviderError(f"configuration error: disk size {size_gb} GB")
        self._annotate(name, f"disk:{disk}", str(int(size_gb)), "add")

    def annotations(self, name: str) -> dict[str, str]:
        """For tests: the snapshots, disks and ``reverted_to`` of VM ``name``.

        Snapshots as ``snapshot:<id>``, disks as ``disk:<label>`` -> GB."""
        fields = decoded(self._redis.hgetall(self._keys.sim_vm(self.name, name)))
        wanted = ("snapshot:", "disk:", "reverted_to")
        return {k: v for k, v in fields.items() if k.startswith(wanted)}

    def _annotate(self, name: str, field: str, value: str, mode: str) -> None:
        key = self._keys.sim_vm(self.name, validate_vm_name(name))
        code = int(self._annotate_script(keys=[key], args=[field, value, mode]))
        if code == 0:
            raise PermanentProviderError(f"simulated provider {self.name!r}: VM {name!r} not found")
        if code == 3:
            raise PermanentProviderError(
                f"simulated provider {self.name!r}: VM {name!r} has no {field}"
            )

    # -- test and chaos hooks --------------------------------------------------------------
    def leak_vm(self, pool: str, template: str, name: str) -> ProviderVM:
        """For tests and chaos runs: plant a VM nobody asked for, as a real cloud leaks one.

        It skips every seeded failure and boots at once, so a reconciler test sees a
        running VM that no vmpool record mentions.
        """
        validate_vm_name(name)
        validate_pool_name(pool)
        return self._write(pool, template, name, 0.0, False)

    def count(self) -> int:
        """For tests and chaos runs: how many VMs this provider holds."""
        return int(self._redis.scard(self._keys.sim_inventory(self.name)))

    # -- internals -------------------------------------------------------------------------
    def _write_call(
        self,
        pool: str,
        template: str,
        name: str,
        boot_s: float | None = None,
        never_ready: bool | None = None,
    ) -> ScriptCall:
        """simulated_create.lua's call for VM ``name`` (its boot under this seed unless told)."""
        boot_s = self.boot_seconds_for(name) if boot_s is None else boot_s
        never_ready = self.never_ready_for(name) if never_ready is None else never_ready
        return ScriptCall(
            self._create_script,
            [self._keys.sim_vm(self.name, name), self._keys.sim_inventory(self.name)],
            [name, pool, template, f"{boot_s:.6f}", "1" if never_ready else "0"],
        )

    def _write(
        self, pool: str, template: str, name: str, boot_s: float, never_ready: bool
    ) -> ProviderVM:
        reply = self._write_call(pool, template, name, boot_s, never_ready).run()
        return created_vm(reply)


class ListingSimulatedProvider(SimulatedProvider, StatusBatch):
    """The simulated provider with a list call, as the clouds have.

    A :class:`~vmpool.providers.StatusBatch`: what ``provider_class: simulated`` builds
    unless its option ``batch_status`` is false."""

    # The simulated cloud's answers are its Redis keys, so a VM it created is in its
    # next list at once: a VM missing from a list vanished (no grace, as a real cloud's
    # eventually consistent list needs: ``vmpool.lifecycle.pending.list_lag_s``).
    list_lag_s = 0.0

    def __init__(
        self, redis: Redis, keys: Keys, name: str, options: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(redis, keys, name, options)
        self._list_script = redis.register_script(_LIST_LUA)

    @property
    def scripts(self) -> list[Script]:
        return [*super().scripts, self._list_script]

    def statuses(self, names: Collection[str]) -> dict[str, ProviderVM | None]:
        """Each of ``names`` as of the server's clock now, None for a VM not held.

        One call per page of :data:`LIST_PAGE` names, read on the server
        (simulated_list.lua), as a cloud's list call is one per page: the pending sweep
        checks every booting VM of this provider at once and takes a lock only for those
        whose answer changes something."""
        ordered = list(dict.fromkeys(names))
        out: dict[str, ProviderVM | None] = {}
        vm_key = self._keys.sim_vm
        for start in range(0, len(ordered), LIST_PAGE):
            page = ordered[start : start + LIST_PAGE]
            now_s, *lines = self._list_script(keys=[vm_key(self.name, n) for n in page])
            now = float(text(now_s))
            for name, line in zip(page, lines, strict=True):
                out[name] = listed_vm(name, text(line), now) if line else None
        return out


def simulated_provider(
    redis: Redis,
    keys: Keys,
    name: str,
    options: Mapping[str, Any] | None = None,
    *,
    pools: Mapping[str, Mapping[str, Any]] | None = None,
) -> SimulatedProvider:
    """The simulated provider that ``options`` ask for (``batch_status``).

    It reads no pool-level keys (``pools``)."""
    if SimulatedOptions.parse(options or {}).batch_status:
        return ListingSimulatedProvider(redis, keys, name, options)
    return SimulatedProvider(redis, keys, name, options)

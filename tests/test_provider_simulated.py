"""The simulated provider against a real Redis: idempotence, atomicity, determinism.

Two provider objects on the same Redis stand for two processes; threads stand for racing
workers. Waiting for a boot polls with a deadline, never a bare sleep.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from vmpool.ids import InvalidIdentifier
from vmpool.providers import (
    PermanentProviderError,
    Provider,
    ProviderError,
    ProviderVM,
    SimulatedOptions,
    SimulatedProvider,
    TransientProviderError,
    is_permanent_error,
    make_provider,
    providers_from_config,
    simulated,
)
from vmpool.providers.registry import DEFAULT_PROVIDER, PROVIDER_CLASSES, provider_class
from vmpool.providers.simulated import ListingSimulatedProvider
from vmpool.state.keys import Keys

FAST: dict[str, Any] = {"boot_seconds": 0}


def sim(
    redis_client: redis.Redis, keys: Keys, name: str = "sim", **options: Any
) -> SimulatedProvider:
    return SimulatedProvider(redis_client, keys, name, {**FAST, **options})


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def server_now(redis_client: redis.Redis) -> float:
    seconds, micros = redis_client.time()
    return float(seconds) + float(micros) / 1_000_000


# -- create / get / ready ------------------------------------------------------------------


def test_create_then_get_then_ready_after_boot(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, boot_seconds=0.2)
    before = server_now(redis_client)
    vm = provider.create_vm("centos-7", "tmpl-centos", "vm-a")
    assert (vm.name, vm.pool, vm.template, vm.hostname) == (
        "vm-a",
        "centos-7",
        "tmpl-centos",
        "vm-a",
    )
    # created_at is the server's clock, not this process's.
    assert before - 0.01 <= vm.created_at <= server_now(redis_client) + 0.01
    assert provider.get_vm("centos-7", "vm-a") is not None
    assert wait_for(lambda: provider.is_ready("centos-7", "vm-a"))
    got = provider.get_vm("centos-7", "vm-a")
    assert got is not None and got.state == "running"
    assert server_now(redis_client) >= vm.created_at + 0.2


def test_vm_is_booting_until_boot_time_passes(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, boot_seconds=600)
    vm = provider.create_vm("pool", "tmpl", "vm-slow")
    assert vm.state == "booting"
    assert not provider.is_ready("pool", "vm-slow")
    got = provider.get_vm("pool", "vm-slow")
    assert got is not None and got.state == "booting"


def test_boot_zero_is_running_at_once(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys)
    assert provider.create_vm("pool", "tmpl", "vm-0").state == "running"
    assert provider.is_ready("pool", "vm-0")


def test_boot_range_is_within_bounds(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, boot_seconds=[2, 5])
    boots = {provider.boot_seconds_for(f"vm-{i}") for i in range(50)}
    assert all(2 <= boot <= 5 for boot in boots)
    assert len(boots) > 1
    vm = provider.create_vm("pool", "tmpl", "vm-1")
    ready_at = float(redis_client.hget(keys.sim_vm("sim", "vm-1"), "ready_at") or "nan")
    assert ready_at == pytest.approx(vm.created_at + provider.boot_seconds_for("vm-1"), abs=1e-5)


def test_missing_vm(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys)
    assert provider.get_vm("pool", "vm-nope") is None
    assert provider.is_ready("pool", "vm-nope") is False
    assert provider.destroy_vm("pool", "vm-nope") is False
    # Asking about a missing VM must not create its hash.
    assert not redis_client.exists(keys.sim_vm("sim", "vm-nope"))


# -- idempotence and atomicity -------------------------------------------------------------


def test_create_is_idempotent(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, boot_seconds=600)
    first = provider.create_vm("pool", "tmpl", "vm-a")
    second = provider.create_vm("pool", "tmpl", "vm-a")
    assert first == second
    assert provider.count() == 1
    assert [vm.name for vm in provider.inventory()] == ["vm-a"]


def test_concurrent_creates_make_one_vm(redis_client: redis.Redis, keys: Keys) -> None:
    threads_n = 16
    barrier = threading.Barrier(threads_n)
    results: list[ProviderVM] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def create() -> None:
        # Each thread its own provider object, as each worker process has its own.
        provider = sim(redis_client, keys, boot_seconds=600)
        barrier.wait()
        try:
            vm = provider.create_vm("pool", "tmpl", "vm-race")
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            results.append(vm)

    threads = [threading.Thread(target=create) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert not errors
    assert len(results) == threads_n
    # Every racer got the one VM the winner wrote, creation time and all.
    assert len({vm.created_at for vm in results}) == 1
    assert sim(redis_client, keys).count() == 1


def test_destroy_twice(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys)
    provider.create_vm("pool", "tmpl", "vm-a")
    assert provider.destroy_vm("pool", "vm-a") is True
    assert provider.destroy_vm("pool", "vm-a") is False
    assert provider.get_vm("pool", "vm-a") is None
    assert provider.count() == 0
    assert not redis_client.exists(keys.sim_vm("sim", "vm-a"))
    assert not redis_client.exists(keys.sim_inventory("sim"))


def test_concurrent_destroys_destroy_once(redis_client: redis.Redis, keys: Keys) -> None:
    sim(redis_client, keys).create_vm("pool", "tmpl", "vm-d")
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    outcomes: list[bool] = []
    lock = threading.Lock()

    def destroy() -> None:
        provider = sim(redis_client, keys)
        barrier.wait()
        outcome = provider.destroy_vm("pool", "vm-d")
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=destroy) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(outcomes) == [False] * (threads_n - 1) + [True]
    assert not redis_client.exists(keys.sim_vm("sim", "vm-d"))


def test_inventory_is_shared_between_provider_objects(
    redis_client: redis.Redis, keys: Keys
) -> None:
    worker = sim(redis_client, keys)
    auditor = sim(redis_client, keys)
    other = sim(redis_client, keys, name="other")
    worker.create_vm("pool-a", "tmpl-a", "vm-1")
    worker.create_vm("pool-b", "tmpl-b", "vm-2")
    other.create_vm("pool-a", "tmpl-a", "vm-3")
    seen = {(vm.name, vm.pool, vm.template) for vm in auditor.inventory()}
    assert seen == {("vm-1", "pool-a", "tmpl-a"), ("vm-2", "pool-b", "tmpl-b")}
    assert auditor.count() == 2
    # One process destroys, the other sees it gone.
    assert auditor.destroy_vm("pool-a", "vm-1") is True
    assert [vm.name for vm in worker.inventory()] == ["vm-2"]
    assert [vm.name for vm in other.inventory()] == ["vm-3"]


def test_leak_vm_plants_a_running_vm(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, boot_seconds=600, create_fail_percent=100)
    leaked = provider.leak_vm("pool", "tmpl", "vm-leak")
    assert leaked.state == "running"
    assert [vm.name for vm in provider.inventory()] == ["vm-leak"]
    # create of a name that exists returns it, even where a fresh create would fail.
    assert provider.create_vm("pool", "tmpl", "vm-leak") == leaked


# -- failures ------------------------------------------------------------------------------


def test_create_failure_leaves_nothing(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, create_fail_percent=100)
    with pytest.raises(TransientProviderError, match="simulated create failure") as info:
        provider.create_vm("pool", "tmpl", "vm-a")
    assert not is_permanent_error(info.value)
    assert provider.count() == 0
    assert provider.inventory() == []
    assert redis_client.keys("*") == []


def test_partial_create_failures_follow_the_seeded_decision(
    redis_client: redis.Redis, keys: Keys
) -> None:
    provider = sim(redis_client, keys, create_fail_percent=50, seed=7)
    created = set()
    for i in range(40):
        name = f"vm-{i}"
        try:
            provider.create_vm("pool", "tmpl", name)
            created.add(name)
        except TransientProviderError:
            assert provider.create_fails_for(name)
    assert {vm.name for vm in provider.inventory()} == created
    assert 0 < len(created) < 40


def test_ready_fail_vms_never_become_ready(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, ready_fail_percent=100)
    vm = provider.create_vm("pool", "tmpl", "vm-a")
    assert vm.state == "booting"
    # Boot time is 0: by the time the server clock has moved on it would be ready.
    assert wait_for(lambda: server_now(redis_client) > vm.created_at + 0.05)
    assert not provider.is_ready("pool", "vm-a")
    got = provider.get_vm("pool", "vm-a")
    assert got is not None and got.state == "booting"
    assert provider.destroy_vm("pool", "vm-a") is True


def test_permanent_template_failure(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, permanent_fail_templates=["gone-tmpl"])
    with pytest.raises(PermanentProviderError, match=r"template .*not found") as info:
        provider.create_vm("pool", "gone-tmpl", "vm-a")
    assert is_permanent_error(info.value)
    assert provider.count() == 0
    assert provider.create_vm("pool", "ok-tmpl", "vm-b").template == "ok-tmpl"


def test_destroy_failures_are_transient_and_counted(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, destroy_fail_percent=100)
    provider.create_vm("pool", "tmpl", "vm-a")
    for attempt in (1, 2):
        with pytest.raises(TransientProviderError, match="simulated destroy failure"):
            provider.destroy_vm("pool", "vm-a")
        assert redis_client.hget(keys.sim_vm("sim", "vm-a"), "destroy_attempts") == str(attempt)
    assert provider.count() == 1


def test_retried_destroy_eventually_succeeds(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, destroy_fail_percent=50, seed=3)
    provider.create_vm("pool", "tmpl", "vm-a")
    attempts = 0
    while True:
        attempts += 1
        assert attempts < 100
        try:
            assert provider.destroy_vm("pool", "vm-a") is True
            break
        except TransientProviderError:
            assert provider.destroy_fails_for("vm-a", attempts)
    assert not provider.destroy_fails_for("vm-a", attempts)
    assert provider.count() == 0


def test_invalid_names_are_refused(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys)
    with pytest.raises(InvalidIdentifier):
        provider.create_vm("pool", "tmpl", "Bad Name")
    with pytest.raises(InvalidIdentifier):
        provider.create_vm("bad pool", "tmpl", "vm-a")
    assert provider.count() == 0


# -- determinism ---------------------------------------------------------------------------

NAMES = [f"vm-{i:03d}" for i in range(100)]
CHAOS: dict[str, Any] = {
    "boot_seconds": [1, 10],
    "create_fail_percent": 50,
    "ready_fail_percent": 50,
    "destroy_fail_percent": 50,
}


def decisions(provider: SimulatedProvider) -> list[tuple[float, bool, bool, bool]]:
    return [
        (
            provider.boot_seconds_for(name),
            provider.create_fails_for(name),
            provider.never_ready_for(name),
            provider.destroy_fails_for(name, 1),
        )
        for name in NAMES
    ]


def test_same_seed_same_decisions(redis_client: redis.Redis, keys: Keys) -> None:
    one = SimulatedProvider(redis_client, keys, "sim", {**CHAOS, "seed": 42})
    two = SimulatedProvider(redis_client, keys, "sim", {**CHAOS, "seed": 42})
    assert decisions(one) == decisions(two)


def test_same_seed_same_outcomes_end_to_end(redis_client: redis.Redis, keys: Keys) -> None:
    def run(provider_name: str) -> list[str]:
        provider = SimulatedProvider(
            redis_client, keys, provider_name, {**CHAOS, "boot_seconds": 0, "seed": 9}
        )
        outcome = []
        for name in NAMES[:30]:
            try:
                vm = provider.create_vm("pool", "tmpl", name)
                outcome.append(vm.state)
            except TransientProviderError:
                outcome.append("create-failed")
        return outcome

    # Decisions hang on the provider name too, so rerun under the same name after a reset.
    first = run("sim")
    redis_client.flushdb()
    assert run("sim") == first
    assert {"create-failed", "booting", "running"} == set(first)


def test_different_seed_different_decisions(redis_client: redis.Redis, keys: Keys) -> None:
    one = SimulatedProvider(redis_client, keys, "sim", {**CHAOS, "seed": 1})
    two = SimulatedProvider(redis_client, keys, "sim", {**CHAOS, "seed": 2})
    a, b = decisions(one), decisions(two)
    assert a != b
    for column in range(4):
        assert [row[column] for row in a] != [row[column] for row in b]


def test_decisions_do_not_touch_global_random(redis_client: redis.Redis, keys: Keys) -> None:
    import random

    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    provider = SimulatedProvider(redis_client, keys, "sim", {**CHAOS, "seed": 5})
    decisions(provider)
    for name in NAMES[:10]:
        with contextlib.suppress(TransientProviderError):
            provider.create_vm("pool", "tmpl", name)
    assert random.random() == expected


# -- options -------------------------------------------------------------------------------


def test_default_options(redis_client: redis.Redis, keys: Keys) -> None:
    options = SimulatedProvider(redis_client, keys, "sim").options
    assert (options.boot_min_s, options.boot_max_s) == (1.0, 3.0)
    assert options.create_fail_percent == options.ready_fail_percent == 0
    assert options.destroy_fail_percent == options.create_latency_s == 0
    assert options.seed == 0
    assert options.permanent_fail_templates == frozenset()


@pytest.mark.parametrize(
    "options",
    [
        {"boot_seconds": -1},
        {"boot_seconds": [3, 1]},
        {"boot_seconds": [1, 2, 3]},
        {"boot_seconds": "fast"},
        {"create_fail_percent": 101},
        {"ready_fail_percent": -5},
        {"destroy_fail_percent": True},
        {"seed": "x"},
        {"seed": 1.5},
        {"create_latency_seconds": float("inf")},
        {"permanent_fail_templates": "tmpl"},
        {"permanent_fail_templates": [1]},
    ],
)
def test_bad_options_are_permanent_configuration_errors(
    redis_client: redis.Redis, keys: Keys, options: Mapping[str, Any]
) -> None:
    with pytest.raises(PermanentProviderError, match="configuration error") as info:
        SimulatedProvider(redis_client, keys, "sim", options)
    assert is_permanent_error(info.value)


def test_create_latency_is_honoured(redis_client: redis.Redis, keys: Keys) -> None:
    provider = sim(redis_client, keys, create_latency_seconds=0.05)
    started = time.monotonic()
    provider.create_vm("pool", "tmpl", "vm-a")
    assert time.monotonic() - started >= 0.05


# -- is_permanent_error --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "permanent"),
    [
        (PermanentProviderError("anything"), True),
        (TransientProviderError("timeout talking to the cloud"), False),
        (ProviderError("flagged", permanent=True), True),
        (ProviderError("unflagged"), False),
        (RuntimeError("Template centos-7 was not found"), True),
        (RuntimeError("TEMPLATE NOT FOUND"), True),
        (RuntimeError("invalid folder path /dc/vm"), True),
        (RuntimeError("Permission to clone denied"), True),
        (RuntimeError("Authentication has failed for user"), True),
        (RuntimeError("configuration error: no datastore"), True),
        (TransientProviderError("wrapped: template tmpl not found"), True),
        (TypeError("bad argument"), True),
        (AttributeError("no method"), True),
        (NameError("undefined"), True),
        (ValueError("bad value"), True),
        (InvalidIdentifier("bad name"), True),
        (RuntimeError("connection reset by peer"), False),
        (TimeoutError("timed out"), False),
        (ConnectionError("refused"), False),
        (OSError("no route to host"), False),
    ],
)
def test_is_permanent_error(exc: BaseException, permanent: bool) -> None:
    assert is_permanent_error(exc) is permanent


def test_provider_error_attribute() -> None:
    assert PermanentProviderError("x").permanent is True
    assert TransientProviderError("x").permanent is False
    assert isinstance(PermanentProviderError("x"), ProviderError)
    assert isinstance(TransientProviderError("x"), ProviderError)


# -- factory -------------------------------------------------------------------------------


def test_make_provider_builds_a_simulated_provider(redis_client: redis.Redis, keys: Keys) -> None:
    provider = make_provider(redis_client, keys, "sim-1", "simulated", {"seed": 3})
    assert isinstance(provider, SimulatedProvider)
    assert isinstance(provider, Provider)
    assert provider.name == "sim-1"
    assert provider.options.seed == 3


def test_make_provider_unknown_class(redis_client: redis.Redis, keys: Keys) -> None:
    with pytest.raises(PermanentProviderError, match="unknown provider_class 'proxmox'") as info:
        make_provider(redis_client, keys, "px", "proxmox", {})
    assert is_permanent_error(info.value)


@pytest.mark.parametrize("name", ["", "has space", "a:b", "x*", "-lead"])
def test_make_provider_bad_name(redis_client: redis.Redis, keys: Keys, name: str) -> None:
    with pytest.raises(PermanentProviderError, match="configuration error"):
        make_provider(redis_client, keys, name, "simulated", {})


def test_registry_pairs_each_class_with_its_options_model() -> None:
    simulated = provider_class("simulated")
    assert simulated is not None
    assert simulated.options is SimulatedOptions
    from vmpool.providers.simulated import ListingSimulatedProvider, simulated_provider

    assert simulated.build is simulated_provider
    client = redis.Redis()  # never connected: building registers scripts lazily
    listing = simulated.build(client, Keys(), "sim", {})
    per_vm = simulated.build(client, Keys(), "sim", {"batch_status": False})
    assert type(listing) is ListingSimulatedProvider  # the default: the sweep lists
    assert type(per_vm) is SimulatedProvider
    assert provider_class("proxmox") is None
    assert DEFAULT_PROVIDER in PROVIDER_CLASSES


def test_options_model_wording_and_defaults() -> None:
    assert SimulatedOptions.parse({"boot_seconds": 4}).boot_seconds == (4.0, 4.0)
    assert SimulatedOptions.parse({"seed": None}).seed == 0  # null is absent
    with pytest.raises(PermanentProviderError) as info:
        SimulatedOptions.parse({"boot_seconds": [1, 2, 3]})
    assert str(info.value) == (
        "configuration error: simulated provider: boot_seconds: must be a number or"
        " [min, max], got [1, 2, 3]"
    )


@dataclass(frozen=True)
class FakeProviderConfig:
    name: str
    provider_class: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FakeConfig:
    providers: Mapping[str, FakeProviderConfig]
    pools: Mapping[str, Any] = field(default_factory=dict)


def test_providers_from_config(redis_client: redis.Redis, keys: Keys) -> None:
    config = FakeConfig(
        providers={
            "simulated": FakeProviderConfig("simulated", "simulated"),
            "chaos": FakeProviderConfig("chaos", "simulated", {"create_fail_percent": 100}),
        }
    )
    providers = providers_from_config(redis_client, keys, config)
    assert set(providers) == {"simulated", "chaos"}
    assert providers["chaos"].name == "chaos"
    with pytest.raises(TransientProviderError):
        providers["chaos"].create_vm("pool", "tmpl", "vm-a")
    # Instances of one class with different names hold separate inventories.
    providers["simulated"].create_vm("pool", "tmpl", "vm-a")
    assert [vm.name for vm in providers["simulated"].inventory()] == ["vm-a"]
    assert providers["chaos"].inventory() == []


def test_providers_from_config_unknown_class(redis_client: redis.Redis, keys: Keys) -> None:
    config = FakeConfig(providers={"px": FakeProviderConfig("px", "proxmox")})
    with pytest.raises(PermanentProviderError):
        providers_from_config(redis_client, keys, config)


# -- the list call ------------------------------------------------------------------------


def test_the_list_call_answers_as_get_vm_page_by_page(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis, keys: Keys
) -> None:
    """Proves: the listing provider's statuses, read on the server one page at a time
    (simulated_list.lua), answer for every name as get_vm does, across page boundaries,
    in the order asked, a name given twice once: booted, booting, never ready, and not
    held (None). Fails if a page drops, shifts or misreads a VM."""
    monkeypatch.setattr(simulated, "LIST_PAGE", 4)
    booted = ListingSimulatedProvider(redis_client, keys, "sim", {"boot_seconds": 0})
    booting = ListingSimulatedProvider(redis_client, keys, "sim", {"boot_seconds": 3600})
    never = ListingSimulatedProvider(
        redis_client, keys, "sim", {"boot_seconds": 0, "ready_fail_percent": 100}
    )
    names = []
    for i, provider in enumerate([booted, booting, never] * 3):
        names.append(provider.create_vm("p", "t", f"vm-{i}").name)
    asked = [*names[:5], "vm-absent", *names[5:], "vm-0", "vm-gone"]
    seen = booted.statuses(asked)
    assert list(seen) == list(dict.fromkeys(asked))
    assert seen == {name: booted.get_vm("p", name) for name in seen}
    assert [seen[n].state for n in names[:3]] == ["running", "booting", "booting"]  # type: ignore[union-attr]
    assert seen["vm-absent"] is None

"""`vmpool audit` reports each kind of violation.

Each test breaks the state ON PURPOSE by writing Redis directly (the only place in the
project where a status is written outside the store) and checks that the audit names
the invariant. A clean system audits clean, so the report is not a constant.
"""

from __future__ import annotations

import json

import pytest
import redis
from click.testing import CliRunner

from vmpool.cli.main import cli
from vmpool.providers.simulated import SimulatedProvider
from vmpool.state.audit import audit_state
from vmpool.state.keys import Keys
from vmpool.state.store import Store

from storehelp import ACTOR, make_request, wait_until


@pytest.fixture
def store(redis_client: redis.Redis, keys: Keys) -> Store:
    return Store(redis_client, keys)


@pytest.fixture
def provider(redis_client: redis.Redis, keys: Keys) -> SimulatedProvider:
    return SimulatedProvider(redis_client, keys, "simulated", {"boot_seconds": 0})


def invariants(store: Store, provider: SimulatedProvider) -> set[int]:
    # storehelp records its VMs under the provider name "sim": the same fake cloud
    providers = {"simulated": provider, "sim": provider}
    return {v.invariant for v in audit_state(store, providers, sweep_interval_s=0.5)}


def forge(store: Store, rid: str, entity: str, src: str, dst: str, *, skip: int = 0) -> None:
    """Test-only corruption: append an audit entry and set the status, bypassing the
    store, as a buggy writer (vmpooler's API, say) would."""
    key = store.keys.request(rid)
    version = int(store.redis.hget(key, "version") or 0) + 1 + skip
    store.redis.hset(key, "version", version)
    if entity == "request":
        store.redis.hset(key, "status", dst)
    store.redis.rpush(
        store.keys.request_audit(rid),
        json.dumps([entity, src, dst, version, "forger", "test", "0"]),
    )


def ready_request(store: Store, provider: SimulatedProvider, rid: str) -> list[str]:
    names = make_request(store, rid, 2)
    for name in names:
        provider.create_vm("debian", "t", name)
        assert store.vm_ready(name, actor=ACTOR).ok
    return names


def test_clean_state_audits_clean(store: Store, provider: SimulatedProvider) -> None:
    ready_request(store, provider, "ok1")
    make_request(store, "ok2", 1)
    assert invariants(store, provider) == set()


def test_reports_a_resurrected_terminal_request(store: Store, provider: SimulatedProvider) -> None:
    make_request(store, "r1", 1)
    store.delete_request("r1", actor=ACTOR)
    forge(store, "r1", "request", "deleted", "ready")
    assert 1 in invariants(store, provider)


def test_reports_a_ready_request_failed(store: Store, provider: SimulatedProvider) -> None:
    ready_request(store, provider, "r1")
    forge(store, "r1", "request", "ready", "failed")
    assert 2 in invariants(store, provider)


def test_reports_a_ready_requests_vm_released_early(
    store: Store, provider: SimulatedProvider
) -> None:
    names = ready_request(store, provider, "r1")
    forge(store, "r1", f"vm:{names[0]}", "running", "completed")
    assert 2 in invariants(store, provider)


def test_reports_a_leaked_vm(store: Store, provider: SimulatedProvider) -> None:
    provider.leak_vm("debian", "t", "nobody-owns-me")
    assert invariants(store, provider) == {3}


def test_reports_a_vm_in_two_requests(store: Store, provider: SimulatedProvider) -> None:
    names = ready_request(store, provider, "r1")
    make_request(store, "r2", 1)
    store.redis.sadd(store.keys.request_vms("r2"), names[0])
    assert 3 in invariants(store, provider)


def test_reports_a_destroyed_vm_the_provider_still_holds(
    store: Store, provider: SimulatedProvider
) -> None:
    names = ready_request(store, provider, "r1")
    store.delete_request("r1", actor=ACTOR)
    store.vm_destroyed(names[0], actor=ACTOR)  # recorded destroyed, provider never asked
    assert 3 in invariants(store, provider)


def test_reports_a_request_that_never_settles(store: Store, provider: SimulatedProvider) -> None:
    make_request(store, "r1", 1, ttl_s=0.05)
    rec = store.get_request("r1")
    assert rec is not None
    wait_until(lambda: store.server_time() > rec.fail_at + 0.6)
    assert 4 in invariants(store, provider)


def test_reports_a_version_gap(store: Store, provider: SimulatedProvider) -> None:
    names = make_request(store, "r1", 1)
    forge(store, "r1", f"vm:{names[0]}", "pending", "completed", skip=3)
    assert 5 in invariants(store, provider)


def test_reports_a_transition_not_in_the_table(store: Store, provider: SimulatedProvider) -> None:
    names = make_request(store, "r1", 1)
    forge(store, "r1", f"vm:{names[0]}", "pending", "destroyed")
    assert 5 in invariants(store, provider)


def test_cli_audit_exit_codes(redis_url: str, store: Store, provider: SimulatedProvider) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["audit", "--redis-url", redis_url])
    assert ok.exit_code == 0, ok.output
    assert "clean" in ok.output
    provider.leak_vm("debian-12-x86_64", "t", "leaky-vm")
    bad = runner.invoke(cli, ["audit", "--redis-url", redis_url])
    assert bad.exit_code == 1
    assert "invariant 3: vm leaky-vm" in bad.output
    as_json = runner.invoke(cli, ["audit", "--json", "--redis-url", redis_url])
    assert as_json.exit_code == 1 and '"invariant": 3' in as_json.output


def test_reports_a_vm_whose_provider_is_not_configured(
    redis_url: str, store: Store, provider: SimulatedProvider
) -> None:
    """A VM whose provider left the config can be neither checked nor destroyed: the
    audit names it, its provider and why (red before: the audit skipped it silently and
    exited 0, while the VM ran on at a provider nobody asks any more)."""
    [name] = make_request(store, "r1", 1)  # recorded under the provider "sim"
    found = audit_state(store, {"simulated": provider}, sweep_interval_s=60)
    assert [v.line() for v in found] == [
        f"invariant 3: vm {name}: its provider 'sim' is not configured: it cannot be"
        " checked or destroyed"
    ]
    assert audit_state(store, {"simulated": provider, "sim": provider}, sweep_interval_s=60) == []
    result = CliRunner().invoke(cli, ["audit", "--redis-url", redis_url])  # the demo config
    assert result.exit_code == 1, result.output
    assert f"vm {name}: its provider 'sim' is not configured" in result.output


def test_destroyed_vms_of_an_unconfigured_provider_are_not_reported(
    store: Store, provider: SimulatedProvider
) -> None:
    [name] = make_request(store, "r1", 1)
    store.delete_request("r1", actor=ACTOR)
    assert store.vm_destroyed(name, actor=ACTOR).ok
    assert audit_state(store, {"simulated": provider}, sweep_interval_s=60) == []


def test_the_audit_reports_the_clone_limit_as_recorded(redis_url: str, store: Store) -> None:
    """The audit shows whether the fleet ever ran more clones at once than its limit
    (the semaphore's peak and overruns), in its report and its JSON."""
    from vmpool.state.semaphore import CloneSemaphore

    sem = CloneSemaphore(store.redis, store.keys, limit=1, lease_s=60)
    assert sem.acquire("vm-a", 1)
    store.redis.zadd(store.keys.clone_slots, {"vm-a": 1}, xx=True)  # its lease lapsed
    assert sem.acquire("vm-b", 1)
    assert sem._renew(("vm-a", 1))  # vm-a's create went on: an overrun
    runner = CliRunner()
    result = runner.invoke(cli, ["audit", "--redis-url", redis_url])
    assert "clone slots: 2 live" in result.stderr and "overruns 1" in result.stderr
    as_json = runner.invoke(cli, ["audit", "--json", "--redis-url", redis_url])
    report = json.loads(as_json.stdout)
    assert report["clone_slots"]["peak"] == 2 and report["clone_slots"]["overruns"] == 1


def _alice_reserves(store: Store, n: int) -> list[str]:
    """``n`` one-VM requests of alice, each reserved with no quota given (so none refused)."""
    from vmpool.state.records import Slot

    from storehelp import settings

    names = []
    for i in range(n):
        rid = f"alice-{i}"
        ok = store.create_request(rid, [Slot("deb", "debian", 1)], settings(), actor=ACTOR,
                                  token_user="alice").ok  # fmt: skip
        assert ok
        name = f"alice-vm{i}"
        assert store.reserve_vm(rid, name=name, alias="deb", pool="debian", template="t",
                                provider="sim", domain=None, actor=ACTOR).ok  # fmt: skip
        names.append(name)
    return names


def _quota_lines(store: Store, max_vms: int) -> list[str]:
    found = audit_state(store, {}, sweep_interval_s=60, quota_of=lambda u: (max_vms, None))
    return [v.line() for v in found if v.invariant == 11]


def test_the_audit_finds_a_user_above_quota_now_and_in_the_trails(store: Store) -> None:
    """Invariant 11, two ways: the VMs that name alice now, and the most she held at once
    by replaying the trails (which remember after the VMs are gone). Held within her
    quota: clean."""
    _alice_reserves(store, 3)
    assert _quota_lines(store, 3) == []
    assert _quota_lines(store, 2) == [
        "invariant 11: user alice: holds 3 VMs, above max_vms 2",
        "invariant 11: user alice: held at once (trails) 3 VMs, above max_vms 2",
    ]
    assert store.delete_request("alice-0", actor=ACTOR).ok
    assert _quota_lines(store, 2) == [
        "invariant 11: user alice: held at once (trails) 3 VMs, above max_vms 2"
    ]


def test_the_audit_finds_a_count_out_of_step_with_the_records(store: Store) -> None:
    _alice_reserves(store, 1)
    assert _quota_lines(store, 5) == []
    store.redis.hincrby(store.keys.quota_vms, "alice", 1)  # a count no transition made
    assert _quota_lines(store, 5) == [
        "invariant 11: user alice: counted 2 VMs/1 cores, holds 1 VMs/1 cores"
    ]


def test_vmpool_audit_reports_each_users_peak(redis_url: str, store: Store) -> None:
    names = _alice_reserves(store, 2)
    assert store.vm_created(names[0], actor=ACTOR).ok
    assert store.vm_failed(names[0], "boom", actor=ACTOR).ok  # freed: 1 held, peak 2
    runner = CliRunner()
    result = runner.invoke(cli, ["audit", "--redis-url", redis_url])  # the demo: no quota
    line = "quota: user alice holds 1 VMs (1 cores), peak 2 VMs (2 cores) by the trails"
    assert line in result.stderr, result.stderr
    report = json.loads(runner.invoke(cli, ["audit", "--json", "--redis-url", redis_url]).stdout)
    assert report["quotas"]["alice"] == {
        "vms": 1, "cores": 1, "peak_vms": 2, "peak_cores": 2, "max_vms": None, "max_cores": None,
    }  # fmt: skip

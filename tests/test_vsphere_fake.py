"""The vSphere provider on an in-memory vCenter (tests/vspherefake.py) with injected
faults: what the simulator cannot show (it allows two VMs of one name in a folder and
never fails on demand).

What it proves: a create is at most one clone whatever is lost or refused on the way
(a lost answer, DuplicateName, a power-on refused for want of resources); a VM that is
not this fleet's is never listed, powered, snapshotted or destroyed; vCenter's faults
are sorted into transient (retried with backoff), permanent (at once, vCenter's words)
and quota; the session is re-established when it expired; snapshots and disks are
idempotent by the name the API chose; secrets are never shown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from vmpool.providers import (
    PermanentProviderError,
    QuotaExceededError,
    TransientProviderError,
    uses_circuit,
)
from vmpool.providers.vsphere import VSphereProvider
from vmpool.providers.vsphere.faults import VSphereFault, classify
from vmpool.state.keys import Keys

from vspherefake import FAULT_ANCESTORS, FakeVCenter, fault

POOLS = {
    "debian": {"folder": "vmpooler/debian-12", "datastore": "ds-1", "clone_target": "cluster-1"},
    "linked": {"folder": "vmpooler/linked", "create_linked_clone": True},
}
TEMPLATE = "templates/debian-12"


@dataclass
class Subject:
    provider: VSphereProvider
    vc: FakeVCenter
    slept: list[float] = field(default_factory=list)
    now: list[float] = field(default_factory=lambda: [0.0])


def make(vc: FakeVCenter | None = None, fleet: str = "fleet-a", **options: Any) -> Subject:
    vc = vc or FakeVCenter()
    vc.folders.add("vmpooler/linked")
    s = Subject(None, vc)  # type: ignore[arg-type]
    opts = {
        "server": "vc.example",
        "username": "u",
        "password": "p",
        "fleet_id": fleet,
        "ready_check": "state",
        "backoff": 0.5,
        **options,
    }
    s.provider = VSphereProvider(
        None,
        Keys("k"),
        "vc",
        opts,
        pools=POOLS,
        connect=vc.session,
        sleep=s.slept.append,
        clock=lambda: s.now[0],
    )
    return s


@pytest.fixture
def s() -> Iterator[Subject]:
    yield make()


# -- create: placement, marks, idempotency -------------------------------------------------


def test_clone_lands_where_the_pool_says_marked_and_powered_on(s: Subject) -> None:
    vm = s.provider.create_vm("debian", TEMPLATE, "vm-one", request_id="r-1")  # type: ignore[call-arg]
    assert vm.name == "vm-one" and vm.pool == "debian" and vm.state == "running"
    (made,) = s.vc.named("vm-one")
    assert (made.folder, made.datastore, made.target) == ("vmpooler/debian-12", "ds-1", "cluster-1")
    assert made.power == "poweredOn" and not made.linked
    marks = {k: v for k, v in made.extra.items() if k.startswith("guestinfo.vmpool.")}
    assert marks == {
        "guestinfo.vmpool.fleet": "fleet-a",
        "guestinfo.vmpool.pool": "debian",
        "guestinfo.vmpool.request": "r-1",
        "guestinfo.vmpool.vm": "vm-one",
        "guestinfo.vmpool.created": marks["guestinfo.vmpool.created"],
        "guestinfo.vmpool.template": TEMPLATE,
    }
    assert made.extra["guestinfo.hostname"] == "vm-one"
    assert s.vc.calls["clone"] == 1 and s.vc.calls["power_on"] == 1


def test_linked_clone_when_the_pool_asks(s: Subject) -> None:
    s.provider.create_vm("linked", TEMPLATE, "vm-linked")
    assert s.vc.named("vm-linked")[0].linked
    with pytest.raises(PermanentProviderError, match="no snapshot"):
        s.provider.create_vm("linked", "templates/bare", "vm-nosnap")


def test_template_delta_disks_give_a_bare_template_its_snapshot() -> None:
    """vmpooler's create_template_delta_disks: a linked clone of a template without a
    snapshot snapshots it once, then links to it (it failed: no snapshot)."""
    s = make(create_template_delta_disks=True)
    s.provider.create_vm("linked", "templates/bare", "vm-delta")
    s.provider.create_vm("linked", "templates/bare", "vm-delta-2")
    assert s.vc.templates["templates/bare"].snapshots == ["vmpool-delta-disks"]
    assert s.vc.named("vm-delta")[0].linked and s.vc.named("vm-delta-2")[0].linked


def test_create_is_idempotent_by_name(s: Subject) -> None:
    first = s.provider.create_vm("debian", TEMPLATE, "vm-one")
    again = s.provider.create_vm("debian", TEMPLATE, "vm-one")
    assert first.name == again.name and len(s.vc.named("vm-one")) == 1
    assert s.vc.calls["clone"] == 1 and s.vc.calls["power_on"] == 1


@pytest.mark.parametrize("kind", ["TaskInProgress", "SystemError", "HostCommunication"])
def test_a_lost_clone_answer_makes_no_second_vm(s: Subject, kind: str) -> None:
    """The clone happened but its answer was a fault: the retry looks the VM up by its
    mark first, finds it, and powers it on."""
    s.vc.fail("clone", kind, effect=True)
    vm = s.provider.create_vm("debian", TEMPLATE, "vm-lost")
    assert vm.name == "vm-lost" and len(s.vc.named("vm-lost")) == 1
    assert s.vc.calls["clone"] == 1 and s.vc.named("vm-lost")[0].power == "poweredOn"
    assert s.slept == [0.5]


def test_duplicate_name_of_our_vm_is_found_not_cloned_again(s: Subject) -> None:
    """A real vCenter refuses a second VM of a name in a folder: when that VM is ours
    (the lookup raced the first clone), it is the answer."""
    s.provider.create_vm("debian", TEMPLATE, "vm-dup")
    real_find = s.provider._find
    misses = [True]  # the next look-up misses it, as one made just before the clone landed

    def find(name: str) -> list[Any]:
        return [] if misses and misses.pop() else real_find(name)

    s.provider._find = find  # type: ignore[method-assign]
    vm = s.provider.create_vm("debian", TEMPLATE, "vm-dup")
    assert vm.name == "vm-dup" and len(s.vc.named("vm-dup")) == 1
    assert s.vc.calls["clone"] == 2  # the second one answered DuplicateName


def test_duplicate_name_of_someone_elses_vm_fails_and_leaves_it(s: Subject) -> None:
    theirs = s.vc.add_vm("vm-taken", "vmpooler/debian-12")  # hand-made, unmarked
    with pytest.raises(PermanentProviderError, match="not this fleet's"):
        s.provider.create_vm("debian", TEMPLATE, "vm-taken")
    assert s.vc.vms[theirs.ref].power == "poweredOn" and s.vc.calls["power_off"] == 0
    assert s.slept == []


def test_a_vm_found_powered_off_is_powered_on(s: Subject) -> None:
    """A worker killed between clone and power-on left the VM off: the next create
    finds it by its mark and powers it on, no second clone."""
    s.vc.fail("power_on", "InsufficientCpuResourcesFault")
    with pytest.raises(QuotaExceededError, match="InsufficientCpuResourcesFault"):
        s.provider.create_vm("debian", TEMPLATE, "vm-quota")
    assert s.vc.named("vm-quota")[0].power == "poweredOff"
    vm = s.provider.create_vm("debian", TEMPLATE, "vm-quota")
    assert vm.state == "running" and s.vc.calls["clone"] == 1
    assert s.vc.named("vm-quota")[0].power == "poweredOn"


# -- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["NoPermission", "NotFound", "InvalidLogin", "DuplicateName"])
def test_permanent_faults_fail_at_once_with_vcenters_words(s: Subject, kind: str) -> None:
    s.vc.fail("clone", kind)
    s.vc.add_vm("vm-x", "elsewhere") if kind == "DuplicateName" else None
    with pytest.raises(PermanentProviderError, match=kind) as info:
        s.provider.create_vm("debian", TEMPLATE, "vm-x")
    assert info.value.permanent and s.vc.calls["clone"] == 1 and s.slept == []


def test_missing_template_folder_or_datastore_is_permanent(s: Subject) -> None:
    with pytest.raises(PermanentProviderError, match="template 'templates/nope' not found"):
        s.provider.create_vm("debian", "templates/nope", "vm-a")
    s.vc.datastores.discard("ds-1")
    with pytest.raises(PermanentProviderError, match="datastore 'ds-1'"):
        s.provider.create_vm("debian", TEMPLATE, "vm-b")
    s.vc.folders.discard("vmpooler/linked")
    with pytest.raises(PermanentProviderError, match="folder 'vmpooler/linked'"):
        s.provider.create_vm("linked", TEMPLATE, "vm-c")
    assert s.slept == [] and not s.vc.vms
    folders = make(create_folders=True)
    folders.vc.folders.discard("vmpooler/linked")
    folders.provider.create_vm("linked", TEMPLATE, "vm-c")
    assert folders.vc.named("vm-c")[0].folder == "vmpooler/linked"


@pytest.mark.parametrize("kind", ["TaskInProgress", "InvalidState", "SystemError"])
def test_transient_faults_are_retried_with_backoff(s: Subject, kind: str) -> None:
    s.vc.fail("clone", kind, times=2)
    s.vc.fail("list_vms", kind, times=1)
    vm = s.provider.create_vm("debian", TEMPLATE, "vm-slow")
    assert vm.name == "vm-slow" and len(s.vc.vms) == 1
    assert s.slept == [0.5, 0.5, 1.0]  # the listing's retry, then the clone's two


def test_retries_are_bounded(s: Subject) -> None:
    limited = make(retries=2, backoff=0.1)
    limited.vc.fail("list_vms", "TaskInProgress", times=10)
    with pytest.raises(TransientProviderError):
        limited.provider.inventory()
    assert limited.slept == [0.1, 0.2] and limited.vc.calls["list_vms"] == 3


def test_quota_faults_are_their_own_kind(s: Subject) -> None:
    s.vc.fail("clone", "InsufficientResourcesFault")
    with pytest.raises(QuotaExceededError) as info:
        s.provider.create_vm("debian", TEMPLATE, "vm-q")
    assert not info.value.permanent and s.slept == []


@pytest.mark.parametrize(
    ("kinds", "verdict"),
    [
        (("NotAuthenticated", *FAULT_ANCESTORS["NotAuthenticated"]), "transient"),
        (("NoPermission", *FAULT_ANCESTORS["NoPermission"]), "permanent"),
        (("ManagedObjectNotFound", "RuntimeFault"), "transient"),
        (("InvalidPowerState", "InvalidState", "VimFault"), "transient"),
        (("InsufficientMemoryResourcesFault", "InsufficientResourcesFault", "VimFault"), "quota"),
        (("NotEnoughLicenses", "RuntimeFault"), "quota"),
        (("SomeNewFault", "VimFault"), "permanent"),
        (("SomeNewSystemFault", "RuntimeFault"), "transient"),
    ],
)
def test_classification_by_the_most_specific_kind(kinds: tuple[str, ...], verdict: str) -> None:
    error = classify(VSphereFault(kinds, "words"))
    seen = (
        "quota"
        if isinstance(error, QuotaExceededError)
        else "permanent"
        if error.permanent
        else "transient"
    )
    assert seen == verdict and "words" in str(error)


def test_connection_errors_are_transient_a_bad_certificate_permanent() -> None:
    import ssl

    assert not classify(ConnectionResetError("reset")).permanent
    assert not classify(TimeoutError("slow")).permanent
    assert classify(ssl.SSLCertVerificationError("self-signed")).permanent


def test_fake_fault_ancestry_is_vsphere_s() -> None:
    """The fake's fault hierarchy is pyVmomi's (the classification relies on it)."""
    pytest.importorskip("pyVmomi", reason="needs the vsphere extra (pyvmomi)")
    from pyVmomi import vim, vmodl

    from vmpool.providers.vsphere.pyvmomi_adapter import as_fault

    for kind, ancestors in FAULT_ANCESTORS.items():
        cls = getattr(vim.fault, kind, None) or getattr(vmodl.fault, kind)
        assert as_fault(cls(msg="m")).kinds == (kind, *ancestors), kind


# -- ownership -----------------------------------------------------------------------------


def test_only_this_fleets_vms_are_listed_or_touched(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-mine")
    unmarked = s.vc.add_vm("vm-hand-made", "vmpooler/debian-12")
    other = s.vc.add_vm("vm-theirs", "vmpooler/debian-12", {"fleet": "fleet-b", "vm": "vm-theirs"})
    assert [vm.name for vm in s.provider.inventory()] == ["vm-mine"]
    assert s.provider.statuses(["vm-hand-made", "vm-theirs"]) == {
        "vm-hand-made": None,
        "vm-theirs": None,
    }
    assert s.provider.destroy_vm("debian", "vm-hand-made") is False
    assert s.provider.destroy_vm("debian", "vm-theirs") is False
    for snap in (s.provider.create_snapshot, s.provider.revert_snapshot):
        with pytest.raises(PermanentProviderError, match="not found in this fleet"):
            snap("debian", "vm-theirs", "s1")
    with pytest.raises(PermanentProviderError, match="not found in this fleet"):
        s.provider.add_disk("debian", "vm-hand-made", 1, "d1")
    assert {unmarked.ref, other.ref} <= set(s.vc.vms)
    assert unmarked.power == other.power == "poweredOn" and not other.snapshots


def test_destroy_powers_off_first_and_may_run_twice(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-gone")
    assert s.provider.destroy_vm("debian", "vm-gone") is True
    assert s.vc.calls["power_off"] == 1 and not s.vc.named("vm-gone")
    assert s.provider.destroy_vm("debian", "vm-gone") is False


def test_destroy_of_a_vm_gone_meanwhile_is_no_error(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-race")
    s.vc.fail("destroy", "ManagedObjectNotFound")
    assert s.provider.destroy_vm("debian", "vm-race") is True
    s.vc.fail("power_off", "InvalidPowerState")  # off already, as the listing did not know
    s.provider.create_vm("debian", TEMPLATE, "vm-off")
    assert s.provider.destroy_vm("debian", "vm-off") is True and not s.vc.named("vm-off")


def test_statuses_is_one_listing_for_any_number(s: Subject) -> None:
    names = [f"vm-{i}" for i in range(12)]
    for name in names:
        s.provider.create_vm("debian", TEMPLATE, name)
    before = s.vc.calls["list_vms"]
    seen = s.provider.statuses([*names, "vm-absent"])
    assert s.vc.calls["list_vms"] == before + 1
    assert seen["vm-absent"] is None and all(seen[n] is not None for n in names)


def test_ssh_ready_check_needs_a_tools_address_that_answers() -> None:
    """ready_check ssh: powered on is not enough; VMware Tools must report an address
    and its ssh_port must accept a connection (a local socket listens here)."""
    import socket

    from vmpool.local.redis_server import free_port

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        s = make(ready_check="ssh", ssh_port=port, ssh_timeout=1)
        s.provider.create_vm("debian", TEMPLATE, "vm-ssh")
        assert s.provider.get_vm("debian", "vm-ssh").state == "booting"  # type: ignore[union-attr]
        s.vc.guest_ip = "127.0.0.1"
        vm = s.provider.get_vm("debian", "vm-ssh")
        assert vm is not None and vm.state == "running" and vm.hostname == "127.0.0.1"
        closed = make(s.vc, ready_check="ssh", ssh_port=free_port(), ssh_timeout=1)
        assert not closed.provider.is_ready("debian", "vm-ssh")


def test_a_pools_own_ready_check() -> None:
    """A pool's ready_check wins over the provider's: state is enough for it without any
    address from VMware Tools, while the provider's ssh check waits for one."""
    vc = FakeVCenter()
    pools = {**POOLS, "linked": {**POOLS["linked"], "ready_check": "state"}}
    vc.folders.add("vmpooler/linked")
    provider = VSphereProvider(
        None,
        Keys("k"),
        "vc",
        {"server": "vc", "username": "u", "password": "p", "fleet_id": "f", "ready_check": "ssh"},
        pools=pools,
        connect=vc.session,
    )
    provider.create_vm("debian", TEMPLATE, "vm-ssh")
    provider.create_vm("linked", TEMPLATE, "vm-state")
    seen = provider.statuses(["vm-ssh", "vm-state"])
    assert seen["vm-ssh"].state == "booting"  # type: ignore[union-attr]
    assert seen["vm-state"].state == "running"  # type: ignore[union-attr]


# -- the session ---------------------------------------------------------------------------


def test_an_expired_session_is_re_established(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-a")
    s.vc.expire_sessions()
    assert [vm.name for vm in s.provider.inventory()] == ["vm-a"]
    assert s.vc.sessions == 2 and s.provider.calls["health"] == 1
    assert s.slept == [0.5]  # the failed call's one retry, on the new session


def test_an_idle_session_is_checked_before_use(s: Subject) -> None:
    s.provider.inventory()
    s.now[0] += 30
    s.provider.inventory()
    assert s.vc.calls["current_time"] == 0
    s.now[0] += 61
    s.provider.inventory()
    assert s.vc.calls["current_time"] == 1 and s.vc.sessions == 1
    s.now[0] += 61
    s.vc.expire_sessions()  # vCenter restarted while we were idle: checked, then made again
    s.provider.inventory()
    assert s.vc.sessions == 2 and s.slept == []


# -- snapshots and disks -------------------------------------------------------------------


def test_snapshot_is_idempotent_by_name_and_reverts(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-s")
    s.vc.fail("create_snapshot", "TaskInProgress", effect=True)  # taken, answer lost
    s.provider.create_snapshot("debian", "vm-s", "a" * 32)
    s.provider.create_snapshot("debian", "vm-s", "a" * 32)
    (vm,) = s.vc.named("vm-s")
    assert vm.snapshots == ["a" * 32] and s.vc.calls["create_snapshot"] == 1
    s.provider.revert_snapshot("debian", "vm-s", "a" * 32)
    assert vm.reverted_to == ["a" * 32]
    with pytest.raises(PermanentProviderError, match=r"has no snapshot 'b+'"):
        s.provider.revert_snapshot("debian", "vm-s", "b" * 32)
    assert s.vc.calls["revert_snapshot"] == 2  # not retried


def test_disk_is_idempotent_by_label(s: Subject) -> None:
    s.provider.create_vm("debian", TEMPLATE, "vm-d")
    s.vc.fail("add_disk", "SystemError", effect=True)
    s.provider.add_disk("debian", "vm-d", 20, "disk-1")
    s.provider.add_disk("debian", "vm-d", 20, "disk-1")
    s.provider.add_disk("debian", "vm-d", 5, "disk-2")
    (vm,) = s.vc.named("vm-d")
    assert vm.disks == [20, 5] and vm.extra["guestinfo.vmpool.disk.disk-1"] == "20"
    with pytest.raises(PermanentProviderError, match="invalid disk"):
        s.provider.add_disk("debian", "vm-d", 0, "disk-3")
    with pytest.raises(PermanentProviderError, match="invalid disk"):
        s.provider.add_disk("debian", "vm-d", 1, "bad name")


# -- configuration -------------------------------------------------------------------------


def test_the_provider_counts_toward_the_circuit_breaker(s: Subject) -> None:
    assert uses_circuit(s.provider)


def test_a_pool_without_vsphere_options_is_a_configuration_error(s: Subject) -> None:
    with pytest.raises(PermanentProviderError, match="pool 'other' has no vSphere options"):
        s.provider.create_vm("other", TEMPLATE, "vm-a")
    with pytest.raises(PermanentProviderError, match=r"pools\.p\.folder: missing"):
        VSphereProvider(None, Keys("k"), "vc", {"server": "h"}, pools={"p": {}})


def test_server_and_options_are_checked() -> None:
    for bad in ("https://vc.example", "vc.example:0", "vc example", ""):
        with pytest.raises(PermanentProviderError, match=r"providers\.vc\.server"):
            VSphereProvider(None, Keys("k"), "vc", {"server": bad})
    from vmpool.providers.vsphere.options import split_server

    assert split_server("vc.example") == ("vc.example", 443)
    assert split_server("vc.example:8443") == ("vc.example", 8443)
    assert split_server("[::1]:9443") == ("::1", 9443)
    with pytest.raises(PermanentProviderError, match=r"providers\.vc\.insecure"):
        VSphereProvider(None, Keys("k"), "vc", {"server": "h", "insecure": "maybe"})
    for key, value in (("max_cores", 64), ("tags", {"team": "ci"})):
        with pytest.raises(PermanentProviderError, match=rf"{key}: not supported by the vsphere"):
            VSphereProvider(None, Keys("k"), "vc", {"server": "h", key: value})
    limited = VSphereProvider(None, Keys("k"), "vc", {"server": "h", "max_instances": 30})
    assert limited.limits() == (30, 0)  # counted as on the clouds


def test_credentials_from_options_environment_or_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("VSPHERE_USER", "VSPHERE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    bare = VSphereProvider(None, Keys("k"), "vc", {"server": "h"})
    with pytest.raises(PermanentProviderError, match="no vCenter credentials"):
        bare.credentials()
    monkeypatch.setenv("VSPHERE_USER", "env-user")
    monkeypatch.setenv("VSPHERE_PASSWORD", "env-secret")
    assert bare.credentials() == ("env-user", "env-secret")
    monkeypatch.delenv("VSPHERE_PASSWORD")
    secret = tmp_path / "password"
    secret.write_text("file-secret\n")
    from_file = VSphereProvider(
        None, Keys("k"), "vc", {"server": "h", "password_file": str(secret)}
    )
    assert from_file.credentials() == ("env-user", "file-secret")
    missing = VSphereProvider(
        None, Keys("k"), "vc", {"server": "h", "password_file": str(tmp_path / "no")}
    )
    with pytest.raises(PermanentProviderError, match="cannot read password_file"):
        missing.credentials()


def test_secrets_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    s = make(password="vc-very-secret")
    s.vc.expire_sessions()
    s.provider.inventory()  # a reconnect, logged
    shown = repr(s.provider) + repr(s.provider.options) + str(s.provider.options.model_dump())
    assert "vc-very-secret" not in shown + caplog.text
    assert s.provider.credentials() == ("u", "vc-very-secret")


def test_fleet_identity_from_redis_unless_fleet_id(redis_client: Any) -> None:
    import redis as redis_lib

    from vmpool.local.redis_server import free_port
    from vmpool.state.fleet_identity import fleet_identity

    nowhere = redis_lib.Redis(host="127.0.0.1", port=free_port())  # never reached
    VSphereProvider(nowhere, Keys("kp"), "vc", {"server": "h"})  # building reads no Redis
    keys = Keys("kp")
    provider = VSphereProvider(redis_client, keys, "vc", {"server": "h"})
    assert provider.fleet_id == fleet_identity(redis_client, keys) != "kp"
    fixed = VSphereProvider(redis_client, keys, "vc", {"server": "h", "fleet_id": "mine"})
    assert fixed.fleet_id == "mine"


def test_fault_of_the_fake_names_its_kind() -> None:
    assert fault("TaskInProgress").kinds[:2] == ("TaskInProgress", "VimFault")


def test_a_vmpooler_vsphere_config_carries_over(redis_client: Any) -> None:
    """vmpooler's provider and pool keys load, reach the provider, and a bad one is
    named; the config's clone_target is the pools' default."""
    from vmpool.config import ConfigError, parse_config
    from vmpool.providers import providers_from_config

    data = {
        ":config": {"clone_target": "cluster1"},
        ":providers": {
            ":vsphere": {
                "server": "vcenter.example.com",
                "username": "vmpool",
                "password": "s3cret",
                "insecure": True,
                "datacenter": "DC1",
                "connection_pool_size": 4,
                "vsphere_timeout": 30,
            }
        },
        ":pools": [
            {
                "name": "debian-12",
                "provider": "vsphere",
                "template": "templates/d12",
                "folder": "vmpooler/debian-12",
                "datastore": "ds1",
                "create_linked_clone": True,
                "network": "ci",
                "size": 1,
                "snapshot_mainMem_ioBlockPages": "2048",
            },
            {
                "name": "rocky",
                "provider": "vsphere",
                "folder": "vmpooler/rocky",
                "clone_target": "host-7",
            },
        ],
    }
    cfg = parse_config(data, source="vmpooler.yaml", env={})
    assert not [w for w in cfg.warnings if "pools" in w]
    assert dict(cfg.pools["debian-12"].provider_options) == {
        "folder": "vmpooler/debian-12",
        "datastore": "ds1",
        "clone_target": "cluster1",
        "create_linked_clone": True,
        "network": "ci",
        "snapshot_mainMem_ioBlockPages": "2048",
    }
    provider = providers_from_config(redis_client, Keys(cfg.key_prefix), cfg)["vsphere"]
    assert isinstance(provider, VSphereProvider)
    assert provider.options.timeout == 30 and provider.options.datacenter == "DC1"
    request = provider.clone_request(
        "debian-12", "templates/d12", "vm-a", provider.tags("debian-12", "vm-a", "r-1")
    )
    assert (
        request.datacenter,
        request.folder,
        request.datastore,
        request.clone_target,
        request.linked,
        request.network,
    ) == ("DC1", "vmpooler/debian-12", "ds1", "cluster1", True, "ci")
    assert request.extra_config["mainMem.ioBlockPages"] == "2048"
    assert provider.placement["rocky"].clone_target == "host-7"
    data[":pools"][1]["create_linked_clone"] = "sometimes"  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"pools\[1\]\.create_linked_clone"):
        parse_config(data, source="vmpooler.yaml", env={})

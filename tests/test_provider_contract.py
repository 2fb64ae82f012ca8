"""The provider contract, one set of tests for every provider: the simulated cloud (in
Redis), EC2 on moto's server (a real process on loopback, tests/motohelp.py), and EC2,
GCE and OpenStack through libcloud's MockHttp with the in-memory clouds of
tests/cloudfakes.py, vSphere on govmomi's vCenter simulator (a real process,
tests/vcsimhelp.py) and on an in-memory vCenter (tests/vspherefake.py). What every
provider promises (vmpool/providers/base.py): create is idempotent by name, a VM boots,
the inventory holds it, destroy answers whether it destroyed something and may run
twice.

The cloud-only tests then hold the cloud providers to the issue's promises: tags at
launch, only this fleet's VMs listed or destroyed, one list call for any number of
statuses, permanent errors at once with the cloud's message, throttling retried with
Retry-After respected, no second instance after a lost answer, secrets never shown.
"""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from vmpool.providers import PermanentProviderError, SimulatedProvider
from vmpool.providers.cloud import EC2Provider, GCEProvider, OpenStackProvider
from vmpool.providers.cloud.common import TAG_KEYS, CloudProvider
from vmpool.state.keys import Keys

import cloudfakes
from providerhelp import CLOUDS, Subject, mock_cloud

MOTO_AMI = "ami-12c6146b"  # one of moto's own images


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


_vsphere_folders = itertools.count(1)


def vsphere(kind: str, request: pytest.FixtureRequest) -> Iterator[Subject]:
    """vSphere on govmomi's simulator (a real process, tests/vcsimhelp.py) or on the
    in-memory vCenter (tests/vspherefake.py); each test its own folder."""
    from vmpool.providers.vsphere import VSphereProvider

    import vspherefake

    pools = {"pool-1": {"folder": f"contract{next(_vsphere_folders)}/pool-1"}}
    options = {"fleet_id": "fleet-a", "create_folders": True, "ready_check": "state"}
    if kind == "vsphere-sim":
        options = request.getfixturevalue("vcsim").options(**options)
        provider = VSphereProvider(None, Keys("fleet-a"), "vc", options, pools=pools)
    else:
        vc = vspherefake.FakeVCenter()
        vc.templates["img-1"] = vc.templates["templates/debian-12"]
        provider = VSphereProvider(
            None,
            Keys("fleet-a"),
            "vc",
            {"server": "vc", "username": "u", "password": "p", **options},
            pools=pools,
            connect=vc.session,
        )
    yield Subject(provider, kind)
    for vm in provider.inventory():
        provider.destroy_vm(vm.pool, vm.name)


@pytest.fixture(
    params=[
        "simulated",
        pytest.param("ec2-moto", marks=pytest.mark.slow),  # moto's server
        "ec2-mock",
        "gce-mock",
        "openstack-mock",
        pytest.param("vsphere-sim", marks=pytest.mark.slow),  # builds and runs vcsim
        "vsphere-fake",
    ]
)
def subject(
    request: pytest.FixtureRequest, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Subject]:
    kind = request.param
    if kind.startswith("vsphere"):
        yield from vsphere(kind, request)
    elif kind == "simulated":
        options = {"boot_seconds": 0.2, "seed": 1}
        yield Subject(SimulatedProvider(redis_client, Keys("fleet-a"), "sim", options), kind)
    elif kind == "ec2-moto":
        moto = request.getfixturevalue("moto")
        moto.reset()
        options = moto.options(fleet_id="fleet-a")
        provider = EC2Provider(None, Keys("vmpool"), "aws", options)
        yield Subject(provider, kind, template=MOTO_AMI)
    else:
        yield mock_cloud(monkeypatch, kind.removesuffix("-mock"))


# -- the contract, every provider ----------------------------------------------------------


def test_create_is_idempotent_by_name(subject: Subject) -> None:
    first = subject.provider.create_vm("pool-1", subject.template, "vm-one")
    again = subject.provider.create_vm("pool-1", subject.template, "vm-one")
    assert first.name == again.name == "vm-one"
    assert [vm.name for vm in subject.provider.inventory()] == ["vm-one"]


def test_a_created_vm_boots_and_is_held(subject: Subject) -> None:
    p = subject.provider
    p.create_vm("pool-1", subject.template, "vm-boot")
    _wait(lambda: p.is_ready("pool-1", "vm-boot"), 15, "vm-boot to be ready")
    held = p.get_vm("pool-1", "vm-boot")
    assert held is not None and held.name == "vm-boot" and held.pool == "pool-1"
    assert held.state == "running"
    assert p.get_vm("pool-1", "vm-never-made") is None
    assert not p.is_ready("pool-1", "vm-never-made")


def test_destroy_answers_and_may_run_twice(subject: Subject) -> None:
    p = subject.provider
    p.create_vm("pool-1", subject.template, "vm-gone")
    p.create_vm("pool-1", subject.template, "vm-kept")
    assert p.destroy_vm("pool-1", "vm-gone") is True
    assert p.destroy_vm("pool-1", "vm-gone") is False
    assert p.get_vm("pool-1", "vm-gone") is None
    assert [vm.name for vm in p.inventory()] == ["vm-kept"]


# -- the cloud providers -------------------------------------------------------------------

cloud_kinds = pytest.mark.parametrize("kind", sorted(CLOUDS))


@cloud_kinds
def test_tagged_at_launch_and_listed_by_fleet(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Every instance carries all the tags in its create call; another fleet's
    instance and an untagged one are neither listed nor destroyed."""
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None
    s.provider.create_vm("pool-1", "img-1", "vm-mine", request_id="req-1")  # type: ignore[call-arg]
    (made,) = s.cloud.instances.values()
    assert set(made.tags) >= set(TAG_KEYS)
    assert made.tags["vmpool-vm"] == "vm-mine" and made.tags["vmpool-pool"] == "pool-1"
    assert made.tags["vmpool-request"] == "req-1" and made.tags["vmpool-fleet"] == "fleet-a"
    s.cloud.create("vm-theirs", "img-1", "x", {"vmpool-fleet": "fleet-b", "vmpool-vm": "vm-theirs"})
    s.cloud.create("vm-untagged", "img-1", "x", {})
    assert [vm.name for vm in s.provider.inventory()] == ["vm-mine"]
    assert s.provider.destroy_vm("pool-1", "vm-theirs") is False
    assert s.provider.destroy_vm("pool-1", "vm-untagged") is False
    assert {i.name for i in s.cloud.live()} == {"vm-mine", "vm-theirs", "vm-untagged"}


@cloud_kinds
def test_statuses_is_one_list_call_for_any_number(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None and isinstance(s.provider, CloudProvider)
    names = [f"vm-{i}" for i in range(12)]
    for name in names:
        s.provider.create_vm("pool-1", "img-1", name)
    before = s.cloud.calls["list"]
    seen = s.provider.statuses([*names, "vm-absent"])
    assert s.cloud.calls["list"] == before + 1
    assert seen["vm-absent"] is None
    assert all(seen[name] is not None for name in names)


@pytest.mark.parametrize("kind", ["ec2", "gce"])
def test_a_paged_list_is_read_to_its_end(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A list answered in pages (EC2's NextToken, GCE's nextPageToken) is read whole: a
    VM on the last page is not taken for vanished."""
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None and isinstance(s.provider, CloudProvider)
    names = [f"vm-{i}" for i in range(5)]
    for name in names:
        s.provider.create_vm("pool-1", "img-1", name)
    s.cloud.page_size = 2
    before = s.cloud.calls["list"]
    seen = s.provider.statuses(names)
    assert all(seen[name] is not None for name in names)
    assert s.cloud.calls["list"] - before == 3  # pages of 2, 2 and 1


@cloud_kinds
def test_permanent_error_fails_at_once_with_the_clouds_message(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    s = mock_cloud(monkeypatch, kind)
    assert s.cloud is not None
    s.cloud.missing_images.add("img-gone")
    with pytest.raises(PermanentProviderError, match="img-gone") as info:
        s.provider.create_vm("pool-1", "img-gone", "vm-x")
    assert info.value.permanent
    # not retried: one call (EC2 finds the image missing when it looks it up)
    assert s.cloud.calls["create"] + s.cloud.calls["image"] == 1 and s.slept == []
    assert s.cloud.instances == {}


THROTTLES: dict[str, tuple[int, str]] = {
    "ec2": (503, cloudfakes.ec2_error("RequestLimitExceeded", "Request limit exceeded.")),
    "gce": (429, cloudfakes.gce_error(429, "rateLimitExceeded", "Rate Limit Exceeded")),
    "openstack": (429, '{"overLimit": {"message": "Too many requests", "code": 429}}'),
}


@cloud_kinds
def test_throttled_endpoint_delays_but_does_not_fail(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Two throttled answers (429 / RequestLimitExceeded with Retry-After: 3), then the
    create goes through: the provider waited what the cloud asked, made one instance."""
    s = mock_cloud(monkeypatch, kind, backoff=0.5)
    assert s.cloud is not None
    status, body = THROTTLES[kind]
    headers = {"Retry-After": "3", "content-type": "application/json"}
    s.cloud.fail("create", status, body, headers, times=2)
    s.cloud.fail("list", status, body, headers, times=1)
    vm = s.provider.create_vm("pool-1", "img-1", "vm-slow")
    assert vm.name == "vm-slow"
    assert s.slept == [3.0, 3.0, 3.0]  # Retry-After over the 0.5 s / 1 s backoff
    assert len(s.cloud.instances) == 1


@cloud_kinds
def test_retries_are_bounded(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    s = mock_cloud(monkeypatch, kind, retries=2, backoff=0.1)
    assert s.cloud is not None
    status, body = THROTTLES[kind]
    s.cloud.fail("list", status, body, {}, times=10)
    with pytest.raises(Exception) as info:
        s.provider.inventory()
    assert not getattr(info.value, "permanent", True)
    assert s.slept == [0.1, 0.2] and s.cloud.calls["list"] == 3


@cloud_kinds
def test_statuses_does_not_wait_out_a_backoff(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The pending sweep's batched call fails at once on throttling (the next sweep asks
    again): a sweep never sleeps through retries while other sweeps wait behind it."""
    s = mock_cloud(monkeypatch, kind, backoff=5)
    assert s.cloud is not None and isinstance(s.provider, CloudProvider)
    status, body = THROTTLES[kind]
    s.cloud.fail("list", status, body, {"Retry-After": "3"}, times=1)
    with pytest.raises(Exception) as info:
        s.provider.statuses(["vm-a"])
    assert not getattr(info.value, "permanent", True)
    assert s.slept == [] and s.cloud.calls["list"] == 1
    assert s.provider.statuses(["vm-a"]) == {"vm-a": None}


@cloud_kinds
def test_a_lost_answer_does_not_make_two_instances(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The cloud made the instance but its answer was a 503: the retry looks the VM up
    by its tag first and returns it instead of launching another."""
    s = mock_cloud(monkeypatch, kind, backoff=0.01)
    assert s.cloud is not None
    s.cloud.lost_answers = 1
    vm = s.provider.create_vm("pool-1", "img-1", "vm-lost")
    assert vm.name == "vm-lost"
    assert [i.name for i in s.cloud.instances.values()] == ["vm-lost"]
    assert s.cloud.calls["create"] == 1


def test_ec2_create_carries_a_stable_client_token(monkeypatch: pytest.MonkeyPatch) -> None:
    s = mock_cloud(monkeypatch, "ec2")
    assert isinstance(s.provider, EC2Provider)
    token = s.provider.client_token("vm-a", "req-1")
    assert token == s.provider.client_token("vm-a", "req-1") != s.provider.client_token("vm-b")
    assert token != s.provider.client_token("vm-a", "req-2")  # a name used again later
    assert len(token) <= 64
    other = mock_cloud(monkeypatch, "ec2", fleet="fleet-b").provider
    assert isinstance(other, EC2Provider) and other.client_token("vm-a", "req-1") != token


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


@cloud_kinds
def test_ssh_ready_check_connects_to_the_port(
    monkeypatch: pytest.MonkeyPatch, kind: str, listener: int
) -> None:
    """ready_check ssh: running is not enough, the port must accept a connection (the
    fakes give every instance 127.0.0.1; a local socket listens on ``listener``)."""
    from vmpool.local.redis_server import free_port

    s = mock_cloud(monkeypatch, kind, ready_check="ssh", ssh_port=listener, ssh_timeout=1)
    s.provider.create_vm("pool-1", "img-1", "vm-ssh")
    assert s.provider.get_vm("pool-1", "vm-ssh") is not None  # the list that boots it
    assert s.provider.is_ready("pool-1", "vm-ssh")
    closed = mock_cloud(monkeypatch, kind, ready_check="ssh", ssh_port=free_port(), ssh_timeout=1)
    closed.provider.create_vm("pool-1", "img-1", "vm-ssh")
    closed.provider.get_vm("pool-1", "vm-ssh")
    assert not closed.provider.is_ready("pool-1", "vm-ssh")


def test_secrets_never_shown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    options = {
        "access_key_id": "AKIDSECRETVALUE",
        "secret_access_key": "very-secret-key",
        "session_token": "session-secret",
    }
    provider = EC2Provider(None, Keys("f"), "aws", options)
    shown = repr(provider) + repr(provider.options) + str(provider.options.model_dump())
    os_provider = OpenStackProvider(
        None, Keys("f"), "os", {"flavor": "m1", "password": "os-secret"}
    )
    shown += repr(os_provider) + str(os_provider.options)
    logging.getLogger("vmpool").info("provider %r options %s", provider, provider.options)
    for secret in ("AKIDSECRETVALUE", "very-secret-key", "session-secret", "os-secret"):
        assert secret not in shown and secret not in caplog.text
    assert provider.credentials()[:2] == ("AKIDSECRETVALUE", "very-secret-key")
    # A secret of the wrong type is no error that would quote it: a number is its text.
    numeric = EC2Provider(None, Keys("f"), "aws", {"secret_access_key": 987654321})
    assert "987654321" not in repr(numeric.options)


def test_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    assert EC2Provider(None, Keys("f"), "aws", {}).credentials()[:2] == ("AKIDENV", "env-secret")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(PermanentProviderError, match="no AWS credentials"):
        EC2Provider(None, Keys("f"), "aws", {}).credentials()


def test_ec2_endpoint_and_options_are_checked() -> None:
    provider = EC2Provider(None, Keys("f"), "aws", {"endpoint": "https://ec2.example:8443"})
    assert provider.driver_kwargs() == {
        "region": "us-east-1",
        "signature_version": "4",
        "host": "ec2.example",
        "secure": True,
        "port": 8443,
    }
    with pytest.raises(PermanentProviderError, match=r"providers\.aws\.endpoint"):
        EC2Provider(None, Keys("f"), "aws", {"endpoint": "ftp://x"})
    with pytest.raises(PermanentProviderError, match=r"providers\.aws\.ready_check"):
        EC2Provider(None, Keys("f"), "aws", {"ready_check": "ping"})
    with pytest.raises(PermanentProviderError, match=r"providers\.gce\.project"):
        GCEProvider(None, Keys("f"), "gce", {"zone": "z"})


@pytest.mark.slow
def test_vmpool_runs_without_libcloud() -> None:
    """The demo needs no `cloud` extra: with libcloud unimportable, the CLI, the API,
    the lifecycle and the provider registry import, and a cloud provider can even be
    built (it imports libcloud only when it first talks to its cloud)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'libcloud' or name.startswith('libcloud.'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vmpool.cli.main, vmpool.api.app, vmpool.lifecycle, workers.jobs\n"
        "from vmpool.providers.registry import make_provider\n"
        "from vmpool.state.keys import Keys\n"
        "make_provider(None, Keys('x'), 'aws', 'ec2', {'region': 'eu-west-1'})\n"
        "assert not any(m.startswith('libcloud') for m in sys.modules)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_gce_and_openstack_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Without credentials a provider says which ones it lacks (a permanent
    configuration error), and reads the OS_* variables when the options leave them out."""
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    gce = GCEProvider(None, Keys("f"), "gce", {"project": "p", "zone": "z"})
    with pytest.raises(PermanentProviderError, match="credentials_file"):
        gce.make_driver()
    broken = tmp_path / "sa.json"
    broken.write_text('{"private_key": "never shown"}')
    bad = GCEProvider(
        None, Keys("f"), "gce", {"project": "p", "zone": "z", "credentials_file": str(broken)}
    )
    with pytest.raises(PermanentProviderError, match="cannot read") as info:
        bad.make_driver()
    assert "never shown" not in str(info.value)

    for name in ("OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME"):
        monkeypatch.delenv(name, raising=False)
    nova = OpenStackProvider(None, Keys("f"), "os", {"flavor": "m1"})
    with pytest.raises(PermanentProviderError, match="auth_url, username and password"):
        nova.driver_args()
    monkeypatch.setenv("OS_AUTH_URL", "https://keystone.example:5000")
    monkeypatch.setenv("OS_USERNAME", "ci")
    monkeypatch.setenv("OS_PASSWORD", "os-env-secret")
    monkeypatch.setenv("OS_PROJECT_NAME", "proj")
    (user, password), kwargs = nova.driver_args()
    assert (user, password) == ("ci", "os-env-secret")
    assert kwargs["ex_force_auth_url"] == "https://keystone.example:5000"
    assert kwargs["ex_tenant_name"] == "proj" and kwargs["ex_domain_name"] == "Default"

"""GET /vm/<hostname>'s body (vmpool/api/vm_views.py) for a VM a cloud knows by address."""

from __future__ import annotations

from vmpool.api.vm_views import vm_body
from vmpool.state.records import VMRecord

from lifecyclehelp import make_config


def _vm(hostname: str) -> VMRecord:
    return VMRecord(name="vm-a", request_id="", alias="centos", pool="centos",
                    template="centos-9", provider="sim", hostname=hostname, state="running",
                    state_since=100.0, attempt=1, reserved_at=90.0, created_at=95.0,
                    ready_at=100.0, lifetime_end=3700.0, reason="", error="",
                    owner="jdoe", checkout_at=100.0)  # fmt: skip


def test_ip_is_the_cloud_address_when_the_vm_is_known_by_one() -> None:
    """Proves: vmpooler's `ip` carries the address a cloud reported (a pool without a
    domain: the VM's hostname is that address); a name is no address, so ""."""
    config = make_config()
    assert vm_body(_vm("203.0.113.7"), config, now=200.0)["ip"] == "203.0.113.7"
    assert vm_body(_vm("2001:db8::7"), config, now=200.0)["ip"] == "2001:db8::7"
    assert vm_body(_vm("vm-a"), config, now=200.0)["ip"] == ""

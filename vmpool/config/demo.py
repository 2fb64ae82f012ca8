"""The built-in demo configuration, used when no config file is named.

Neither --config nor VMPOOL_CONFIG names one. Two pools with aliases, the simulated
provider booting in seconds.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DEMO_CONFIG_YAML", "DEMO_SOURCE"]

# What messages and `vmpool config show` give as the demo's file name.
DEMO_SOURCE: Final = "<built-in demo>"

DEMO_CONFIG_YAML: Final[str] = """\
# vmpool built-in demo configuration, in vmpooler's format.
:providers:
  :simulated:
    boot_seconds: [2, 5]
    seed: 1
  # A second instance of the simulated cloud, unreliable on purpose: the demo sends
  # some requests here to show failed clones being retried and requests failing.
  :flakycloud:
    provider_class: simulated
    boot_seconds: [2, 5]
    create_fail_percent: 60
    ready_fail_percent: 30
    seed: 7

:redis:
  key_prefix: vmpool
  data_ttl: 1

:config:
  site_name: vmpool demo
  ondemand_request_ttl: 1
  timeout: 0.5
  max_ondemand_instances_per_request: 10
  ondemand_clone_limit: 20
  max_vm_retries: 3
  vm_lifetime: 12
  reconcile_grace: 30

:schedule:
  sweep_expired: 2
  provision_sweep: 1
  check_pending_sweep: 0.25
  reap_running: 5
  destroy_sweep: 1
  reconcile: 10

:pools:
  - name: debian-12-x86_64
    alias: [debian, debian-12]
    template: debian-12-x86_64
    size: 0
    provider: simulated
    domain: example.com
  - name: centos-9-x86_64
    alias: [centos]
    template: centos-9-x86_64
    size: 0
    provider: simulated
    domain: example.com
  - name: flaky-x86_64
    alias: [flaky]
    template: flaky-x86_64
    size: 0
    provider: flakycloud
    timeout: 0.25
    domain: example.com
"""

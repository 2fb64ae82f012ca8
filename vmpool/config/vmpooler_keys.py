"""vmpooler's keys, as facts of the file format.

- The keys vmpool accepts and ignores, so that a vmpooler config loads as it is.
- The keys it renamed.
- The environment variables that override settings.

:mod:`vmpool.config.vmpooler` applies them.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

__all__ = [
    "AUTH_IGNORED",
    "CONFIG_IGNORED",
    "CONFIG_IGNORED_PREFIXES",
    "CONFIG_PROVIDER_DEFAULTS",
    "CONFIG_REMOVED",
    "ENVIRONMENT",
    "IGNORED_SECTIONS",
    "POOL_IGNORED",
    "POOL_IGNORED_PREFIXES",
    "PROVIDER_IGNORED",
    "REDIS_IGNORED",
    "REDIS_URL_PARTS",
    "SCHEDULE_KEY_ALIASES",
]

# -- vmpooler keys vmpool accepts and ignores ----------------------------------------------

IGNORED_SECTIONS: Final = frozenset(
    ["statsd", "graphite", "graphs", "prometheus", "tracing", "ldap"]
)
CONFIG_IGNORED: Final = frozenset(
    [
        "logfile",
        "timeout_notification",
        "vm_checktime",
        "migration_limit",
        "max_tries",
        "retry_factor",
        "purge_unconfigured_folders",
        "purge_unconfigured_resources",
        "usage_stats",
        "request_logger",
        "manage_host_selection",
        "host_selection_max_age",
        "utilization_limit",
        "check_ready_vm_hostname_for_mismatch",
        "skip_dns_check_before_creating_vm",
        "dlq_enabled",
        "dlq_ttl",
        "dlq_max_entries",
        "purge_enabled",
        "purge_interval",
        "purge_dry_run",
        "max_pending_age",
        "max_ready_age",
        "max_running_age",
        "max_completed_age",
        "max_orphaned_age",
        "health_check_enabled",
        "health_check_interval",
        "health_thresholds",
        "connection_pool_monitor_enabled",
        "connection_pool_monitor_interval",
    ]
)
CONFIG_IGNORED_PREFIXES: Final = ("check_loop_delay_",)
POOL_IGNORED: Final = frozenset(
    [
        "folder",
        "datastore",
        "datacenter",
        "create_linked_clone",
        "timeout_notification",
        "snapshot_mainMem_ioBlockPages",
        "snapshot_mainMem_ioBlockPages_size",
        "check_hostname_for_mismatch",
        "host_filter",
        "network",
        "zone",
        "project",
        "network_name",
        "subnetwork_name",
        "disk_type",
        "amisize",
        "machine_type",
        "volume_size",
        "provision",
    ]
)
POOL_IGNORED_PREFIXES: Final = ("check_loop_delay_",)
REDIS_IGNORED: Final = frozenset(
    ["connection_pool_size", "connection_pool_timeout", "reconnect_attempts"]
)
PROVIDER_IGNORED: Final = frozenset(
    [
        "connection_pool_size",
        "connection_pool_timeout",
        "purge_unconfigured_folders",
        "folder_whitelist",
    ]
)
AUTH_IGNORED: Final = frozenset[str]()

# vmpooler keys vmpool knows but no longer honours: a warning of their own.
CONFIG_REMOVED: Final = MappingProxyType(
    {
        "domain": "vmpooler v3 removed the global domain; set `domain` (or `dns_plugin`) on"
        " each pool instead. Ignored"
    }
)

# The names the :schedule: keys had before each took its periodic job's name.
SCHEDULE_KEY_ALIASES: Final = MappingProxyType(
    {
        "sweep": "sweep_expired",
        "provision": "provision_sweep",
        "check_pending": "check_pending_sweep",
        "reap": "reap_running",
        "destroy": "destroy_sweep",
    }
)

# Environment variable -> the setting it overrides (section, key). REDIS_DATA_TTL
# overrides config.data_ttl instead when the file sets that. VMPOOL_REDIS_URL also
# makes the file's separate Redis parts irrelevant.
ENVIRONMENT: Final = (
    ("ONDEMAND_REQUEST_TTL", "config", "ondemand_request_ttl"),
    ("MAX_ONDEMAND_INSTANCES_PER_REQUEST", "config", "max_ondemand_instances_per_request"),
    ("ONDEMAND_CLONE_LIMIT", "config", "ondemand_clone_limit"),
    ("VM_LIFETIME", "config", "vm_lifetime"),
    ("VM_LIFETIME_AUTH", "config", "vm_lifetime_auth"),
    ("TIMEOUT", "config", "timeout"),
    ("PREFIX", "config", "prefix"),
    ("SITE_NAME", "config", "site_name"),
    ("CREATE_FOLDERS", "config", "create_folders"),
    ("CREATE_LINKED_CLONES", "config", "create_linked_clones"),
    ("CREATE_TEMPLATE_DELTA_DISKS", "config", "create_template_delta_disks"),
    ("REDIS_DATA_TTL", "redis", "data_ttl"),
    ("VMPOOL_REDIS_URL", "redis", "url"),
)
# The :config: keys that are the default of a provider option of the same name (vmpooler
# reads them there for its vSphere provider).
CONFIG_PROVIDER_DEFAULTS: Final = (
    "create_folders",
    "create_linked_clones",
    "create_template_delta_disks",
)
# The :redis: keys a URL is composed of when `url` is not given (`sentinel`: a
# redis+sentinel:// URL, with `username` and `db`).
REDIS_URL_PARTS: Final = ("server", "port", "username", "password", "db", "sentinel")

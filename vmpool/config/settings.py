"""Every setting of the configuration file: its type, bounds, default, unit and meaning.

This is the one place those are written (with its part for ``:auth:``,
:mod:`vmpool.config.auth_settings`). The models describe the file as vmpool reads
it, after :mod:`vmpool.config.vmpooler` has taken vmpooler's spelling off it: leading
colons, old key names, environment overrides, ignored keys.

Units: the file's own. vmpooler gives timeouts and TTLs in minutes, lifetimes in hours.
:mod:`vmpool.config.build` turns a validated :class:`ConfigFile` into the
:class:`vmpool.config.Config` the rest of vmpool reads, every duration in seconds.

:class:`Schedule` is both a section of the file and the value of ``Config.schedule``.
Its keys are the periodic jobs' names, its values seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from vmpool.config.auth_settings import AuthSection
from vmpool.config.fields import (
    Aliases,
    BatchLanes,
    CircuitFailures,
    DataTtlHours,
    Domain,
    FleetCount,
    GraceSeconds,
    HoldMinutes,
    HostnamePrefix,
    InstanceCount,
    IntervalSeconds,
    KeyPrefix,
    LockSeconds,
    NonNegativeInt,
    Password,
    PoolName,
    PoolSize,
    Port,
    RedisUrl,
    RetryCount,
    Section,
    Text,
    TtlHours,
    TtlMinutes,
    Weight,
    hours,
    minutes,
    seconds,
)
from vmpool.config.quota_settings import QuotasSection
from vmpool.config.redis_fields import (
    DurabilityModeName,
    HealthCheckSeconds,
    RedisTimeoutSeconds,
    ReplicaCount,
    SentinelHosts,
)
from vmpool.ids import DEFAULT_PREFIX
from vmpool.providers.registry import DEFAULT_PROVIDER

__all__ = [
    "AuthSection",
    "ConfigFile",
    "ConfigSection",
    "DnsConfig",
    "PoolSection",
    "QuotasSection",
    "RedisSection",
    "Schedule",
    "SentinelSection",
]


class Schedule(Section):
    """Seconds between the runs of each periodic job (``:schedule:``, a vmpool extension).

    Each key is the job's name. The names of earlier releases still load.
    """

    # Built in code as well as read from a file: a misspelt keyword is an error here.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"additionalProperties": True})

    sweep_expired: IntervalSeconds = seconds(5, "Expire on-demand requests past their TTL")
    provision_sweep: IntervalSeconds = seconds(5, "Find requests with VMs still to reserve")
    check_pending_sweep: IntervalSeconds = seconds(
        0.25, "Check booting VMs (a list call per provider) and re-create stale reservations"
    )
    reap_running: IntervalSeconds = seconds(30, "End running VMs past their lifetime")
    destroy_sweep: IntervalSeconds = seconds(5, "Find completed VMs still to destroy")
    reconcile: IntervalSeconds = seconds(30, "Compare the providers' inventories with Redis")
    top_up_pools: IntervalSeconds = seconds(5, "Clone what each warm pool is short of its size")
    check_ready: IntervalSeconds = seconds(
        60, "Re-check the ready VMs of the warm pools; recycle those past ready_ttl"
    )
    record_history: IntervalSeconds = seconds(
        20, "Write each pool's counts of this minute, for the dashboard (a point a minute)"
    )


class ConfigSection(Section):
    """``:config:``, vmpooler's global settings."""

    ondemand_request_ttl: TtlMinutes = minutes(
        5, "How long an on-demand request may take to become ready before it fails"
    )
    ondemand_request_grace: GraceSeconds = seconds(
        0, "How late after its TTL a request may still become ready"
    )
    max_ondemand_instances_per_request: InstanceCount = Field(
        default=10, description="The most VMs one on-demand request may ask for of one name"
    )
    max_ondemand_instances_total: InstanceCount | None = Field(
        default=None,
        description="The most VMs one on-demand request may ask for over all its names"
        " (default: max_ondemand_instances_per_request times the number of pools)",
    )
    ondemand_clone_limit: FleetCount = Field(
        default=10, description="The most VMs being created at once, over the whole fleet"
    )
    max_vm_retries: RetryCount = Field(
        default=3, description="How many times a failed create or boot is retried with a new VM"
    )
    hold_failed_minutes: HoldMinutes = minutes(
        0,
        "How long a VM whose ready check failed is kept (held, never handed out) before"
        " it is destroyed, for debugging (0: destroyed at once; a pool may set its own)",
    )
    vm_lifetime: TtlHours = hours(12, "How long a VM handed out may run")
    vm_lifetime_auth: TtlHours | None = hours(
        None, "How long a VM handed out to an authenticated user may run (default: vm_lifetime)"
    )
    timeout: TtlMinutes = minutes(
        15, "How long a VM may take to boot (default of every pool's timeout)"
    )
    data_ttl: DataTtlHours | None = hours(
        None, "How long finished records are kept (default: redis.data_ttl)"
    )
    prefix: HostnamePrefix = Field(default="", description="The start of every VM hostname")
    backend_weight: dict[str, Weight] = Field(
        default_factory=dict, description="Weights of the clone targets"
    )
    lock_expire: LockSeconds = seconds(60, "How long a request's lock lives unless renewed")
    reconcile_grace: GraceSeconds = seconds(
        120, "How old a VM nobody recorded must be before the reconciler destroys it"
    )
    ready_ttl: TtlMinutes | None = minutes(
        None, "How long a ready VM may wait in its pool (default of every pool's ready_ttl)"
    )
    provider_circuit_failures: CircuitFailures = Field(
        default=5,
        description="Consecutive failed creates at one provider that stop its pools creating",
    )
    provider_circuit_cooldown: LockSeconds = seconds(
        60, "How long a provider's pools stop creating once its circuit opened"
    )
    provider_quota_wait: LockSeconds = seconds(
        30, "How long a provider's pools stop creating once its cloud answered quota"
    )
    clone_target: Text | None = Field(
        default=None, description="Where VMs are cloned (default of every pool's clone_target)"
    )
    batch_lanes: BatchLanes = Field(
        default=4,
        description="Batch jobs of one kind (provision, create, check pending) queued or"
        " running at once: for creates, how many provider calls run at once",
    )
    task_limit: FleetCount = Field(
        default=10, description="The most VMs one warm pool's top-up reserves at a time"
    )
    allowed_tags: list[Text] | None = Field(
        default=None, description="The tag names PUT /vm/<hostname> accepts (default: any)"
    )
    max_lifetime_upper_limit: TtlHours | None = hours(
        None, "The longest lifetime PUT /vm/<hostname> may set (default: no limit)"
    )
    site_name: Text = Field(
        default="vmpool",
        description="The name the dashboard (/dashboard/) shows; HTML tags in it are dropped",
    )
    experimental_features: bool = Field(
        default=False,
        description="Serve vmpooler's operator endpoints: POST /config/poolsize,"
        " /config/pooltemplate, /config/clonetarget, /poolreset and their DELETEs (405 off)",
    )
    # vmpooler reads these here for its vSphere provider: each is the default of every
    # provider whose class has the option of that name (build.py), unless it sets its own.
    create_folders: bool | None = Field(
        default=None, description="vSphere: create a pool's missing folder (the providers')"
    )
    create_linked_clones: bool | None = Field(
        default=None, description="vSphere: linked clones for every pool (the providers')"
    )
    create_template_delta_disks: bool | None = Field(
        default=None,
        description="vSphere: snapshot a template that has none, to link clones to it"
        " (the providers')",
    )


class PoolSection(Section):
    """One entry of ``:pools:``."""

    name: PoolName = Field(description="The pool's name, as clients request it")
    alias: Aliases = Field(
        default=(), description="Other names that select this pool: one or a list"
    )
    template: Text | None = Field(
        default=None, description="The template VMs are made from (default: name)"
    )
    size: PoolSize = Field(default=0, description="How many ready VMs the pool keeps")
    timeout: TtlMinutes | None = minutes(
        None, "How long a VM may take to boot (default: config.timeout)"
    )
    provider: Text = Field(
        default=DEFAULT_PROVIDER, description="The provider instance (a key of :providers:)"
    )
    ready_ttl: TtlMinutes | None = minutes(
        None, "How long a ready VM may wait in the pool (default: config.ready_ttl)"
    )
    hold_failed_minutes: HoldMinutes | None = minutes(
        None, "How long a VM that failed its ready check is held (default: config's)"
    )
    domain: Domain | None = Field(default=None, description="The DNS domain of the VMs' hostnames")
    dns_plugin: Text | None = Field(
        default=None,
        description="A key of :dns_configs: whose domain the pool takes (unless `domain`)",
    )
    clone_target: Text | None = Field(
        default=None, description="Where VMs are cloned (default: config.clone_target)"
    )
    ondemand_from_ready: bool = Field(
        default=True,
        description="On-demand requests take this pool's ready VMs before cloning (vmpool)",
    )
    # Filled by the reader, never written in a file: the pool's keys that its provider's
    # class reads (its pool model, vmpool.providers.registry), checked when built.
    provider_options: dict[str, Any] = Field(
        default_factory=dict,
        description="The pool's keys for its provider's class (folder, subnet_id, ...),"
        " written beside the others",
        json_schema_extra={"readOnly": True},
    )


class SentinelSection(Section):
    """``:redis: sentinel:``: the primary is found through Redis Sentinel."""

    master: Text = Field(description="The group's name, as the sentinels monitor it")
    hosts: SentinelHosts = Field(description='The sentinels: ["host:26379", ...]')
    password: Password | None = Field(
        default=None, description="The primary's password (its requirepass)"
    )
    sentinel_password: Password | None = Field(
        default=None, description="The sentinels' own password, if they have one"
    )


class RedisSection(Section):
    """``:redis:``: where the state lives.

    Precedence: ``url`` wins over the separate parts and ``sentinel``. ``sentinel`` wins
    over ``server`` and ``port``.
    """

    url: RedisUrl | None = Field(
        default=None,
        description="redis://, rediss:// (TLS), unix:// or redis+sentinel://h:26379,.../MASTER",
    )
    sentinel: SentinelSection | None = Field(
        default=None, description="Find the primary through Redis Sentinel and follow failovers"
    )
    server: Text | None = Field(default=None, description="Host name (default: localhost)")
    port: Port = Field(default=6379, description="TCP port")
    username: Text | None = Field(default=None, description="User name (Redis ACL)")
    password: Password | None = Field(default=None, description="Password")
    db: NonNegativeInt = Field(default=0, description="Database number")
    key_prefix: KeyPrefix = Field(
        default=DEFAULT_PREFIX, description="The start of every Redis key"
    )
    data_ttl: DataTtlHours = hours(168, "How long finished records are kept")
    socket_timeout: RedisTimeoutSeconds = seconds(
        5, "How long a Redis reply may take before the connection is taken for dead"
    )
    socket_connect_timeout: RedisTimeoutSeconds = seconds(
        2, "How long connecting to Redis (or to a sentinel) may take"
    )
    health_check_interval: HealthCheckSeconds = seconds(
        5, "A connection idle this long is checked with PING before it is used (0: never)"
    )
    durability: DurabilityModeName = Field(
        default="auto",
        description="What an acknowledged write waits for: auto (replicas through"
        " Sentinel, else none), none, replicas (WAIT for durability_replicas)",
    )
    durability_replicas: ReplicaCount | None = Field(
        default=None,
        description="Replicas that must hold a write before it is acknowledged (default:"
        " through Sentinel every replica the sentinels could promote, else 1); fewer"
        " trades safety for availability",
    )
    durability_timeout: RedisTimeoutSeconds = seconds(
        2, "How long a write waits for its confirmations before it is refused as unconfirmed"
    )


class DnsConfig(Section):
    """One entry of ``:dns_configs:``. vmpool reads only its domain."""

    domain: Domain | None = Field(default=None, description="The DNS domain")


class ConfigFile(Section):
    """A vmpool configuration file, in vmpooler's format.

    - Every key may carry one leading colon (``:config:``), as vmpooler writes Ruby
      symbols.
    - Unknown keys are warnings. vmpooler's keys that vmpool has no use for pass silently.
    - Environment variables override some settings (ONDEMAND_REQUEST_TTL, TIMEOUT,
      VM_LIFETIME, ..., VMPOOL_REDIS_URL), as vmpooler's do.
    """

    config: ConfigSection = ConfigSection()
    pools: list[PoolSection] = Field(default_factory=list)
    providers: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Provider instances by name: `provider_class` (default: the name) and"
        " the class's options",
    )
    redis: RedisSection = RedisSection()
    auth: AuthSection | None = None
    quotas: QuotasSection | None = Field(
        default=None,
        description="Quotas per user and request priorities (vmpool's; absent: no quota)",
    )
    dns_configs: dict[str, DnsConfig] = Field(default_factory=dict)
    tagfilter: dict[str, Text] = Field(
        default_factory=dict,
        description="Tag name -> regular expression: a tag's value is what its groups match",
    )
    schedule: Schedule = Schedule()

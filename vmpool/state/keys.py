"""The whole Redis key schema of vmpool. No other module spells a key.

Every key lives under one prefix (``vmpool`` by default). A request's own keys share
the hash tag ``{<request id>}`` so that they land in one slot should the state ever
move to a Redis Cluster. The scripts that also touch fleet-wide indexes (pool sets,
the open-request index) assume a single primary, which is what vmpool supports.

Layout (``P`` is the prefix)::

    P:request:{RID}              hash   the request: status, version, slots, deadlines
    P:request:{RID}:vms          set    every VM ever reserved for the request
    P:request:{RID}:audit        list   one packed entry per transition (records.decode_trail)
    P:request:{RID}:fence        string fencing counter of the request's lock grants
    P:requests:open              zset   pending requests, score = failure deadline (s)
    P:requests:provision         zset   requests with unreserved slots, score = created
    P:vm:NAME                    hash   a VM record: state, pool, alias, request, ...
    P:vm:NAME:fence              string fencing counter of the VM's lock grants
    P:vm:NAME:audit              list   a warm-pool VM's own trail (while no request holds it)
    P:addresses                  hash   a ready VM's cloud address -> its name (/vm/<address>)
    P:pool:POOL:STATE            zset   VMs of a pool in a state. Score depends on state
                                        (ready: the warm pool, score = ready time)
    P:token:SHA256               hash   an API token (stored hashed): user, created, last
    P:user-tokens:SHA256         zset   a user's tokens (by user name's sha256), score = created
    P:ratelimit:user:SHA256:W    string a user's POST/DELETE calls in minute W
    P:login-failures:KIND:SHA256 string failed logins of a user or client address (TTL window)
    P:sim:PROVIDER:vm:NAME       hash   a VM of the simulated provider's fake cloud
    P:sim:PROVIDER:inventory     set    the names the simulated provider holds
    P:lock:KIND:SUBJECT          string a lock (per request or VM): the holder's id
    P:work:JOB                   zset   subjects of a batch job, waiting or claimed, score = arrival
    P:work:JOB:PART              the work set's order and claims (WORK_PARTS, vmpool.state.workset)
    P:clone-slots                zset   the fleet-wide clone semaphore's leases (VM -> lease end)
    P:clone-slots:holders        hash   VM -> the token of its lease's holder
    P:clone-slots:stats          hash   the semaphore's peak and overruns
    P:clone-slots:line           zset   requests that found no clone slot -> their place in line
    P:provider-circuit:PROVIDER  hash   a provider's circuit breaker and quota hold
    P:provider-launching:PROVIDER zset  creates at a provider now (its max_instances/cores)
    P:metrics:NAME               hash   fleet-wide counters (vmpool.state.counters)
    P:metrics:requests_finished  hash   requests finished, by outcome (the store's scripts)
    P:metrics:time_to_ready:POOL hash   ready-time histogram of a pool: bucket -> count, sum
    P:metrics:audit              hash   the last `vmpool audit --metrics`: violations, time
    P:metrics:request_ready:SRC  hash   POST-to-ready histogram of requests served from SRC
                                        (warm, fresh): bucket -> count, sum
    P:metrics:eta_error          hash   the ETA's absolute error histogram: bucket -> count, sum
    P:metrics:quota_waits        hash   user -> requests that waited for the user's quota
    P:quota:vms                  hash   user -> VMs the user holds or has in the making
    P:quota:cores                hash   user -> the cores of those VMs
    P:quota:peak                 hash   vms:USER, cores:USER -> the most the user held at once
    P:quota:parked               hash   request id -> its user, while it waits for its quota
    P:quota:parked:line          zset   those requests -> their place in line (line_at)
    P:quota:parked:users         zset   USER:REQUEST_ID, all scored 0: each user's, by name
    P:line:stats                 hash   the line's observed pace (the ETA): service interval,
                                        last start, reservation-to-ready time per pool
    P:history:POOL               hash   a pool's counts, one field a minute for a day (history.py)
    P:pool-failures:POOL         hash   a pool's create failures: streak, last error, back-off
    P:failures                   list   the fleet's latest failures, newest first (pool_failures.py)
    P:workers                    zset   vmpool worker heartbeats
    P:schedule:due               zset   the scheduler's templates, score = next due time
    P:schedule:log               list   every move of the schedule, newest first
    P:schedule:last-runs         hash   periodic job -> the RQ id of its last run
    P:schedule:parked            string the pending sweep is parked: its earliest next due time
    P:schedule:wake              list   that time, pushed by the reservation that woke it
    P:schedule:schedulers        zset   live scheduler replicas (rq-scheduler's registry)
    P:schedule:scheduler:NAME    hash   one scheduler replica (rq-scheduler's birth record)
    P:health:write-probe         string the readiness probe's write (expires in a minute)
    P:op:ID                      string a mutating call's reply by its operation id (ops.py; TTL)
    P:config:poolsize            hash   pool -> size set at runtime (POST /config/poolsize)
    P:config:template            hash   pool -> template set at runtime
    P:config:clone_target        hash   pool -> clone target set at runtime
    P:pool-resets                hash   pool -> server time of its last reset (POST /poolreset)
    P:summary:TASK:DATE          hash   vmpooler's daily stats (boot, clone: POOL:VM -> s;
                                        tag: VM:TAG -> value), DATE = YYYY-MM-DD (UTC)
    P:fleet:config               hash   the running fleet's config, public form (no secret)
    P:fleet-identity             string the fleet's mark on its VMs (vmpool-<12 hex>), made once
    P:fleet-marks                hash   the fleet's other marks: mark -> lost, legacy or adopted
    vmpool:fleets                hash   key prefix -> when its fleet last published its config:
                                        the one key outside a prefix, so that a command given
                                        only a Redis URL finds a fleet of any prefix

RQ's own keys follow from names this module gives: the queue ``P-<short>`` (so
``rq:queue:P-<short>``, :meth:`Keys.rq_queue`, its workers' wake-up list beside it,
:meth:`Keys.rq_queue_wake`, and RQ's registries per queue name) and
job ids that start with the encoded prefix (``rq:job:<id>``, workers/table.py). Two
fleets with different prefixes in one database share no key, queue or job.
"""

from __future__ import annotations

from dataclasses import dataclass

from vmpool.ids import (
    DEFAULT_PREFIX,
    InvalidIdentifier,
    Job,
    validate_pool_name,
    validate_request_id,
    validate_vm_name,
)

__all__ = [
    "DEFAULT_PREFIX",
    "INDEXED_VM_STATES",
    "VM_STATES",
    "WORK_PARTS",
    "InvalidIdentifier",
    "Keys",
]

# The parts of a work set (vmpool.state.workset), each the set's key plus this suffix:
# claims (zset: claimed or deferred subject -> lease end), claimed (hash: subject ->
# claim id), turns (zset: owner with a subject waiting -> turn), served (hash: owner ->
# when last served), owner (hash: subject -> owner, when not ''), queue (+ owner: zset,
# that owner's waiting subjects -> arrival).
WORK_PARTS = {
    "claims": ":claims",
    "claimed": ":claimed",
    "turns": ":turns",
    "served": ":served",
    "owner": ":owner",
    "queue": ":queue:",
}

VM_STATES = ("reserved", "pending", "ready", "running", "completed", "on_hold", "destroyed")
# VM states that have a per-pool index. Destroyed VMs keep only their tombstone hash.
INDEXED_VM_STATES = ("reserved", "pending", "ready", "running", "completed", "on_hold")
# The suffixes of a request's keys past its hash (its VM set, trail and fence).
_VMS, _AUDIT, _FENCE = ":vms", ":audit", ":fence"
# RQ's namespaces (rq.Queue.redis_queue_namespace_prefix, rq.job.Job's): a test checks.
RQ_QUEUE_NAMESPACE = "rq:queue:"
RQ_JOB_NAMESPACE = "rq:job:"


@dataclass(frozen=True)
class Keys:
    """Builds every key from one prefix. Pass it around. Never build keys by hand."""

    prefix: str = DEFAULT_PREFIX

    # -- health ---------------------------------------------------------------------
    @property
    def write_probe(self) -> str:
        return f"{self.prefix}:health:write-probe"

    def op(self, op_id: str) -> str:
        """String: the recorded reply of operation ``op_id`` (vmpool/state/ops.py)."""
        return f"{self.prefix}:op:{op_id}"

    # -- requests -------------------------------------------------------------------
    def request(self, request_id: str) -> str:
        return f"{self.prefix}:request:{{{validate_request_id(request_id)}}}"

    def request_vms(self, request_id: str) -> str:
        return self.request(request_id) + _VMS

    def request_audit(self, request_id: str) -> str:
        return self.request(request_id) + _AUDIT

    def request_fence(self, request_id: str) -> str:
        return self.request(request_id) + _FENCE

    def request_pattern(self) -> str:
        """SCAN pattern matching every request hash (and only those)."""
        return f"{self.prefix}:request:{{*}}"

    def request_id_from_key(self, key: str) -> str:
        head = f"{self.prefix}:request:{{"
        if not key.startswith(head) or not key.endswith("}"):
            raise InvalidIdentifier(f"not a request key: {key!r}")
        return key[len(head) : -1]

    @property
    def open_requests(self) -> str:
        return f"{self.prefix}:requests:open"

    @property
    def provision_queue(self) -> str:
        return f"{self.prefix}:requests:provision"

    def request_script_keys(self, request_id: str) -> list[str]:
        """KEYS 1-6 of a request's store script (scripts/_prelude.lua).

        The id is checked once, for the four keys named after it."""
        record = self.request(request_id)
        return [
            record,
            record + _VMS,
            record + _AUDIT,
            record + _FENCE,
            self.open_requests,
            self.provision_queue,
        ]

    def vm_script_keys(self, name: str, request_id: str) -> list[str]:
        """KEYS 1-8 of a one-VM store script (its request's six, the VM's hash and fence).

        A warm-pool VM (``request_id`` '') takes the pool layout of scripts/_pool.lua."""
        vm, fence = self.vm(name), self.vm_fence(name)
        if request_id:
            return [*self.request_script_keys(request_id), vm, fence]
        indexes = [self.open_requests, self.provision_queue]
        return [vm, fence, self.vm_audit(name), fence, *indexes, vm, fence]

    # -- VMs ------------------------------------------------------------------------
    def vm(self, name: str) -> str:
        return f"{self.prefix}:vm:{validate_vm_name(name)}"

    def vm_fence(self, name: str) -> str:
        return self.vm(name) + ":fence"

    def vm_audit(self, name: str) -> str:
        """List: a warm-pool VM's own trail (the scripts append ``:audit`` to its hash's key)."""
        return self.vm(name) + ":audit"

    def vm_prefix(self) -> str:
        """Prefix of VM hashes. Scripts append a VM name to reach a request's VMs."""
        return f"{self.prefix}:vm:"

    @property
    def addresses(self) -> str:
        """Hash: a ready VM's cloud address -> its name (the API finds a VM by address)."""
        return f"{self.prefix}:addresses"

    def vm_pattern(self) -> str:
        return f"{self.prefix}:vm:*"

    def pool_state(self, pool: str, state: str) -> str:
        if state not in INDEXED_VM_STATES:
            raise ValueError(f"no index for VM state {state!r}")
        return f"{self.prefix}:pool:{validate_pool_name(pool)}:{state}"

    def pool_state_prefix(self) -> str:
        """Prefix of the per-pool indexes. Scripts append ``POOL:STATE`` themselves."""
        return f"{self.prefix}:pool:"

    def pool_state_pattern(self) -> str:
        return f"{self.prefix}:pool:*"

    # -- auth -----------------------------------------------------------------------
    def token(self, token_sha256: str) -> str:
        return f"{self.prefix}:token:{token_sha256}"

    def token_pattern(self) -> str:
        return f"{self.prefix}:token:*"

    def rate_limit(self, token_sha256: str, window: int) -> str:
        return f"{self.prefix}:ratelimit:{token_sha256}:{window}"

    # User names and client addresses come from the caller: keys carry their SHA-256
    # (fixed length, no colon, nothing an attacker spells into the key space).
    def user_rate_limit(self, user_sha256: str, window: int) -> str:
        return f"{self.prefix}:ratelimit:user:{user_sha256}:{window}"

    def user_tokens(self, user_sha256: str) -> str:
        return f"{self.prefix}:user-tokens:{user_sha256}"

    def token_prefix(self) -> str:
        """Prefix of token hashes, to which token_create.lua appends a token's SHA-256."""
        return f"{self.prefix}:token:"

    def login_failures(self, kind: str, subject_sha256: str) -> str:
        if kind not in ("user", "address"):
            raise ValueError(f"no login-failure count by {kind!r}")
        return f"{self.prefix}:login-failures:{kind}:{subject_sha256}"

    # -- simulated provider ---------------------------------------------------------
    def sim_vm(self, provider: str, name: str) -> str:
        return f"{self.prefix}:sim:{provider}:vm:{name}"

    def sim_inventory(self, provider: str) -> str:
        return f"{self.prefix}:sim:{provider}:inventory"

    # -- coordination ---------------------------------------------------------------
    def lock(self, kind: str, subject: str) -> str:
        return f"{self.prefix}:lock:{kind}:{subject}"

    def fleet_identity(self) -> str:
        """String: the fleet's ownership id, generated once (vmpool/state/fleet_identity.py)."""
        return f"{self.prefix}:fleet-identity"

    def fleet_marks(self) -> str:
        """Hash: the fleet's other marks, mark -> role (vmpool/state/fleet_identity.py)."""
        return f"{self.prefix}:fleet-marks"

    def provider_circuit(self, provider: str) -> str:
        """Hash: one provider's circuit breaker (vmpool/state/circuit.py)."""
        return f"{self.prefix}:provider-circuit:{validate_pool_name(provider)}"

    def provider_launching(self, provider: str) -> str:
        """Zset: a provider's creates now, 'pool|name' -> when the claim lapses (capacity.py)."""
        return f"{self.prefix}:provider-launching:{validate_pool_name(provider)}"

    @property
    def stage_pace(self) -> str:
        """Hash: batch stage (job name) -> '1' quick, '0' slow, as the fleet's workers last
        found it (vmpool.state.pace_board)."""
        return f"{self.prefix}:stage-pace"

    def work_set(self, job: Job) -> str:
        """Zset: the subjects of per-subject ``job`` waiting for a batch job or claimed.

        Score: their arrival in server time (:mod:`vmpool.state.workset`). Its parts are this key
        plus a suffix of :data:`WORK_PARTS` (rendered into the work-set scripts).
        """
        return f"{self.prefix}:work:{job}"

    def work_part(self, job: Job, part: str) -> str:
        """One part of ``job``'s work set (:data:`WORK_PARTS`, ``queue``: :meth:`work_queue`)."""
        return self.work_set(job) + WORK_PARTS[part]

    def work_queue(self, job: Job, owner: str) -> str:
        """Zset: ``owner``'s subjects ('' for no user) waiting in ``job``'s work set, by arrival."""
        return self.work_part(job, "queue") + owner

    def request_key_parts(self) -> tuple[str, str]:
        """What comes before and after a request id in its hash's key (for the scripts)."""
        head, _, tail = self.request("x").rpartition("x")
        return head, tail

    @property
    def clone_slots(self) -> str:
        return f"{self.prefix}:clone-slots"

    @property
    def clone_slot_holders(self) -> str:
        """Hash: VM name -> the token of the holder of its clone slot's lease."""
        return f"{self.prefix}:clone-slots:holders"

    @property
    def clone_slot_line(self) -> str:
        """Zset: requests that found no clone slot free -> their place in line (in turn)."""
        return f"{self.prefix}:clone-slots:line"

    @property
    def clone_slot_stats(self) -> str:
        """Hash: the clone semaphore's ``peak`` (leases at once) and ``overruns`` (no slot)."""
        return f"{self.prefix}:clone-slots:stats"

    def metrics(self, name: str) -> str:
        return f"{self.prefix}:metrics:{name}"

    @property
    def requests_finished(self) -> str:
        """Hash: outcome (ready, failed, deleted) -> requests that finished so."""
        return self.metrics("requests_finished")

    def time_to_ready(self, pool: str) -> str:
        """Hash: the ready-time histogram of one pool (bucket bound -> count, ``sum``)."""
        return self.time_to_ready_prefix() + validate_pool_name(pool)

    def time_to_ready_prefix(self) -> str:
        """Prefix of the ready-time histograms. The scripts append the VM's pool."""
        return self.metrics("time_to_ready") + ":"

    def pool_history(self, pool: str) -> str:
        return f"{self.prefix}:history:{validate_pool_name(pool)}"

    def pool_failures(self, pool: str) -> str:
        return f"{self.prefix}:pool-failures:{validate_pool_name(pool)}"

    @property
    def recent_failures(self) -> str:
        return f"{self.prefix}:failures"

    def request_ready_metric(self, source: str) -> str:
        """Hash: the POST-to-ready histogram of requests served from ``source``."""
        if source not in ("warm", "fresh"):
            raise ValueError(f"no request source {source!r}")
        return self.metrics("request_ready") + ":" + source

    def request_ready_metric_prefix(self) -> str:
        """Prefix of those histograms. The scripts append the source."""
        return self.metrics("request_ready") + ":"

    @property
    def eta_error_metric(self) -> str:
        """Hash: the ETA's absolute error histogram (bucket bound -> count, ``sum``)."""
        return self.metrics("eta_error")

    @property
    def quota_waits_metric(self) -> str:
        """Hash: user -> requests that waited for the user's quota (each once)."""
        return self.metrics("quota_waits")

    # -- quotas per user and the line of service (vmpool/state/quotas.py) -------------
    # User names are validated token users (vmpool.ids): fields and members, never keys.
    @property
    def quota_vms(self) -> str:
        """Hash: user -> VMs the user holds or has in the making (the scripts' count)."""
        return f"{self.prefix}:quota:vms"

    @property
    def quota_cores(self) -> str:
        """Hash: user -> the cores of those VMs."""
        return f"{self.prefix}:quota:cores"

    @property
    def quota_peak(self) -> str:
        """Hash: ``vms:<user>``, ``cores:<user>`` -> the most the user ever held at once."""
        return f"{self.prefix}:quota:peak"

    @property
    def quota_parked(self) -> str:
        """Hash: request id -> its user, while the request waits for the user's quota."""
        return f"{self.prefix}:quota:parked"

    @property
    def quota_parked_line(self) -> str:
        """Zset: the parked requests -> their place in line (``line_at``)."""
        return f"{self.prefix}:quota:parked:line"

    @property
    def quota_parked_users(self) -> str:
        """Zset: ``<user>:<request id>`` of each parked request, all scored 0 (by name)."""
        return f"{self.prefix}:quota:parked:users"

    @property
    def line_stats(self) -> str:
        """Hash: the line's observed pace, which the ETA reads (vmpool/state/quotas.py)."""
        return f"{self.prefix}:line:stats"

    @property
    def audit_result(self) -> str:
        """Hash: the last recorded audit's ``violations`` and ``time`` (server time)."""
        return self.metrics("audit")

    # -- runtime pool overrides, resets and daily summaries (vmpool/state/overrides.py) --
    def pool_override(self, setting: str) -> str:
        """Hash: pool -> ``setting`` set at runtime (vmpooler's ``vmpooler__config__<setting>``)."""
        if setting not in ("poolsize", "template", "clone_target"):
            raise ValueError(f"no runtime override of {setting!r}")
        return f"{self.prefix}:config:{setting}"

    @property
    def pool_resets(self) -> str:
        """Hash: pool -> server time of its last reset (pool_vm_ready.lua checks it)."""
        return f"{self.prefix}:pool-resets"

    def summary_prefix(self) -> str:
        """Prefix of the daily summary hashes. The scripts append ``TASK:DATE``."""
        return f"{self.prefix}:summary:"

    def summary_day(self, task: str, date: str) -> str:
        """Hash: vmpooler's ``vmpooler__<task>__<date>`` (boot, clone, tag)."""
        if task not in ("boot", "clone", "tag"):
            raise ValueError(f"no daily summary of {task!r}")
        return f"{self.summary_prefix()}{task}:{date}"

    @property
    def workers_heartbeat(self) -> str:
        return f"{self.prefix}:workers"

    # -- RQ: queues, jobs and the scheduler (RQ's spelling, our names) ----------------
    def queue(self, short: str) -> str:
        """The RQ queue name of the fleet's queue ``short`` (sweeps, requests, vms)."""
        return f"{self.prefix}-{short}"

    def rq_queue(self, short: str) -> str:
        """The Redis list RQ keeps that queue in (``rq.Queue(name).key``)."""
        return f"{RQ_QUEUE_NAMESPACE}{self.queue(short)}"

    @staticmethod
    def rq_queue_wake(queue_key: str) -> str:
        """List: a queue's wake-up for the workers blocked on it (workers/dequeue.py).

        Beside the queue's list, as RQ keeps its intermediate queue (``<queue key>:...``).
        """
        return f"{queue_key}:wake"

    @staticmethod
    def rq_job(job_id: str) -> str:
        """The hash RQ keeps a job in (``rq.job.Job.key_for(job_id)``)."""
        return f"{RQ_JOB_NAMESPACE}{job_id}"

    @property
    def schedule_due(self) -> str:
        return f"{self.prefix}:schedule:due"

    @property
    def schedule_log(self) -> str:
        return f"{self.prefix}:schedule:log"

    @property
    def schedule_last_runs(self) -> str:
        return f"{self.prefix}:schedule:last-runs"

    @property
    def schedule_parked(self) -> str:
        """String: the pending sweep waits for a wake-up (its earliest next due time)."""
        return f"{self.prefix}:schedule:parked"

    @property
    def schedule_wake(self) -> str:
        """List: wake-ups of the parked pending sweep, which the schedulers block on."""
        return f"{self.prefix}:schedule:wake"

    @property
    def schedulers(self) -> str:
        return f"{self.prefix}:schedule:schedulers"

    @property
    def scheduler_prefix(self) -> str:
        """Prefix of one scheduler replica's hash, to which rq-scheduler appends its name."""
        return f"{self.prefix}:schedule:scheduler:"

    # -- the fleet's published config (vmpool/config/published.py) --------------------
    @property
    def fleet_config(self) -> str:
        """Hash: the running fleet's config in its public form (no secret), for the CLI."""
        return f"{self.prefix}:fleet:config"

    @staticmethod
    def fleets_index() -> str:
        """Hash: key prefix -> when its fleet last published its config (outside any prefix)."""
        return f"{DEFAULT_PREFIX}:fleets"

    @property
    def scheduler_lock(self) -> str:
        """rq-scheduler's tick lock, which vmpool's loop never takes (workers/schedule.py)."""
        return f"{self.prefix}:schedule:lock"

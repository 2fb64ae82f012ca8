"""Two fleets with different ``key_prefix`` in one Redis database share nothing.

What this proves, with real RQ workers and schedulers of both fleets on one database:
- each fleet's worker runs only its own fleet's jobs (its queues and job ids carry its
  prefix), and each request is provisioned by its own fleet;
- each fleet's scheduler installs, moves and logs only its own schedule;
- each fleet's store, audit and simulated cloud see only its own requests and VMs;
- every key either fleet wrote is under its prefix, or is one of RQ's keys named after
  the fleet's queues and job ids (nothing shared but RQ's global worker registry).
Against the old layout (RQ queue names, job ids and scheduler keys without the prefix)
fleet B's worker took fleet A's provision job, and the two schedulers shared one
schedule.
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from vmpool.config import Config, load_config
from vmpool.ids import Job
from vmpool.providers import SimulatedProvider, providers_from_config
from vmpool.state.audit import audit_state
from vmpool.state.keys import Keys
from vmpool.state.records import RequestSettings, Slot
from vmpool.state.store import Store
from workers.queues import RQDispatcher
from workers.schedule import FleetScheduler, read_schedule_log, schedule_intervals
from workers.table import QUEUES, job_id
from workers.worker import build_worker

CONFIG = """\
:redis:
  key_prefix: {prefix}
:config:
  ondemand_request_ttl: 5
:providers:
  :simulated: {{boot_seconds: 0, seed: 1}}
:pools:
  - {{name: debian, provider: simulated, domain: example.com}}
"""
PREFIXES = ("fleet-a", "fleet:b")
# RQ's database-wide keys: the set of queue keys, the set of workers, a maintenance lock.
RQ_GLOBAL = frozenset({"rq:queues", "rq:workers", "rq:clean_groups"})


def _config(tmp_path: Path, prefix: str) -> Config:
    path = tmp_path / f"{prefix.replace(':', '_')}.yaml"
    path.write_text(CONFIG.format(prefix=prefix))
    return load_config(path)


def _request(conn: redis.Redis, config: Config, rid: str) -> None:
    keys = Keys(config.key_prefix)
    store = Store(conn, keys)
    settings = RequestSettings.from_config(config)
    assert store.create_request(rid, [Slot("debian", "debian", 2)], settings, actor="t").ok
    RQDispatcher(redis.Redis(connection_pool=conn.connection_pool), keys).send(
        Job.PROVISION_REQUEST, [rid]
    )


def test_two_fleets_in_one_database_share_nothing(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    configs = {prefix: _config(tmp_path, prefix) for prefix in PREFIXES}
    raw = redis.Redis.from_url(redis_url)  # bytes, as RQ needs
    for prefix, config in configs.items():
        _request(redis_client, config, f"req-{prefix.replace(':', '-')}")
    a, b = (Keys(p) for p in PREFIXES)
    # each fleet's provision job sits on its own queue under its own id
    assert raw.lrange(a.rq_queue("requests"), 0, -1) == [
        job_id(a, "provision_request", "req-fleet-a").encode()
    ]
    assert raw.lrange(b.rq_queue("requests"), 0, -1) == [
        job_id(b, "provision_request", "req-fleet-b").encode()
    ]

    # fleet B's worker drains everything it listens to: fleet A's job stays queued
    worker_b = build_worker(redis_url, configs["fleet:b"], kind="simple")
    assert worker_b.work(burst=True)
    assert raw.llen(a.rq_queue("requests")) == 1
    assert Store(redis_client, b).get_request("req-fleet-b") is not None

    schedulers = {prefix: FleetScheduler(raw, Keys(prefix), interval=1.0) for prefix in PREFIXES}
    for prefix, scheduler in schedulers.items():
        scheduler.install(schedule_intervals(configs[prefix].schedule))
    deadline = time.monotonic() + 30
    workers = {p: build_worker(redis_url, c, kind="simple") for p, c in configs.items()}
    while not all(_ready(redis_client, p) for p in PREFIXES):
        assert time.monotonic() < deadline, "the fleets did not provision in time"
        for prefix in PREFIXES:
            schedulers[prefix].enqueue_jobs()
            workers[prefix].work(burst=True)

    for prefix, config in configs.items():
        keys = Keys(prefix)
        store = Store(redis_client, keys)
        assert store.open_requests() == []
        rids = [
            keys.request_id_from_key(k)
            for k in redis_client.scan_iter(match=keys.request_pattern())
        ]
        assert rids == [f"req-{prefix.replace(':', '-')}"]
        providers = providers_from_config(redis_client, keys, config)
        assert audit_state(store, providers, sweep_interval_s=5) == []
        log = read_schedule_log(raw, keys)
        assert log and {m.replica for m in log} == {schedulers[prefix].name}
        assert redis_client.zcard(keys.schedule_due) == len(schedule_intervals(config.schedule))
    _every_key_is_a_fleets(redis_client)


def _ready(client: redis.Redis, prefix: str) -> bool:
    record = Store(client, Keys(prefix)).get_request(f"req-{prefix.replace(':', '-')}")
    return record is not None and record.status == "ready"


def _every_key_is_a_fleets(client: redis.Redis) -> None:
    """Each key is under one fleet's prefix, or RQ's, named after one fleet's queues or
    job ids (the encoded prefix is the first part of every id)."""
    tags = {"fleet-a": "fleet_da-", "fleet:b": "fleet_cb-"}
    for key in client.scan_iter(match="*"):
        if key.startswith(tuple(f"{p}:" for p in PREFIXES)):
            continue
        assert key.startswith("rq:"), key
        if key in RQ_GLOBAL or key.startswith(("rq:worker:", "rq:workers:")):
            continue  # RQ's own registries of queues and live workers, its maintenance lock
        owners = [
            p for p in PREFIXES if any(Keys(p).queue(q) in key for q in QUEUES) or tags[p] in key
        ]
        assert len(owners) == 1, key


ODD_PREFIX = "a:b.c-d_e"  # one of each character a key prefix may hold beyond [A-Za-z0-9]


def test_a_prefix_with_every_allowed_character_works_end_to_end(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A full request lifecycle (create, provision, ready, delete, destroy) through real
    RQ workers under the prefix "a:b.c-d_e", with `vmpool audit` (the function and the
    command) clean at each stage. An audit that keeps only keys with exactly two ':'
    drops every VM record when the prefix holds a ':'. With two VMs at the provider and
    none read back, it reports both as leaked, so a clean audit here also proves the VMs
    were read."""
    from click.testing import CliRunner

    from vmpool.cli.main import cli

    path = tmp_path / "odd.yaml"
    path.write_text(CONFIG.format(prefix=f"'{ODD_PREFIX}'"))
    config = load_config(path)
    assert config.key_prefix == ODD_PREFIX
    keys = Keys(ODD_PREFIX)
    store = Store(redis_client, keys)
    rid = "req-odd"
    _request(redis_client, config, rid)
    worker = build_worker(redis_url, config, kind="simple")
    deadline = time.monotonic() + 30
    while (rec := store.get_request(rid)) is None or rec.status != "ready":
        assert time.monotonic() < deadline, "not provisioned in time"
        worker.work(burst=True)
        RQDispatcher(redis.Redis.from_url(redis_url), keys).send(Job.CHECK_REQUEST, [rid])

    providers = providers_from_config(redis_client, keys, config)
    (sim,) = providers.values()
    assert isinstance(sim, SimulatedProvider)
    assert sim.count() == 2
    assert len(store.get_vms(rec.vm_names)) == 2
    assert audit_state(store, providers, sweep_interval_s=5) == []
    audit = CliRunner().invoke(cli, ["audit", "--config", str(path), "--redis-url", redis_url])
    assert audit.exit_code == 0 and "clean" in audit.stdout, audit.output

    assert store.delete_request(rid, actor="test").ok
    RQDispatcher(redis.Redis.from_url(redis_url), keys).send(Job.DESTROY_VM, list(rec.vm_names))
    while sim.count() > 0:
        assert time.monotonic() < deadline, "not destroyed in time"
        worker.work(burst=True)
    assert {vm.state for vm in store.get_vms(rec.vm_names)} == {"destroyed"}
    assert audit_state(store, providers, sweep_interval_s=5) == []
    assert [
        k for k in redis_client.scan_iter(match="*") if not k.startswith((f"{ODD_PREFIX}:", "rq:"))
    ] == []

"""A process makes its scripts ready as it starts (Fleet.warm, the API's lifespan).

Proves: on a Redis that holds no script (fresh, restarted, or SCRIPT FLUSH), a worker's
fleet warmed at start runs its first provision job to a ready request without one
script answered NOSCRIPT or loaded by the job, and the API's first POST and GET after
its startup likewise. Red before: every first call of a script in a process was
answered NOSCRIPT and loaded it (a round trip and a load each; in a pipeline the call
ran again after the calls that followed it).
"""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from vmpool import lifecycle
from vmpool.ids import Job
from vmpool.lifecycle import Fleet
from vmpool.lifecycle.pace import StagePace
from vmpool.state.records import Slot
from vmpool.state.workset import WorkSet
from workers.batching import BatchDispatcher
from workers.dequeue import pop_script
from workers.worker import build_worker

from apihelp import API, make_app, spec_config
from lifecyclehelp import create_request, make_config, make_fleet


def _loads(client: redis.Redis) -> tuple[int, int]:
    """(SCRIPT commands, NOSCRIPT answers) since the last CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    errors = client.info("errorstats")
    script = sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_script"))
    return script, int(errors.get("errorstat_NOSCRIPT", {}).get("count", 0))


def test_a_warmed_fleet_runs_its_first_job_with_no_script_to_load(
    redis_client: redis.Redis, redis_url: str
) -> None:
    fleet = make_fleet(redis_client, make_config())
    fleet.dispatch = BatchDispatcher(redis.Redis.from_url(redis_url), fleet.keys)
    fleet.pace = StagePace()
    fleet.pace.record(Job.CREATE_VM, 0.001, 1)
    create_request(fleet.store, "r1", [Slot("deb", "debian", 2)], fleet.config)
    WorkSet(fleet.redis, fleet.keys).add(Job.PROVISION_REQUEST, ["r1"])
    redis_client.script_flush()
    assert fleet.warm() > 0
    assert fleet.warm() == 0  # all held now
    redis_client.config_resetstat()
    counts = lifecycle.provision_batch(fleet)
    request = fleet.store.get_request("r1")
    assert request is not None and request.status == "ready", counts
    assert _loads(redis_client) == (0, 0)


def test_the_api_makes_its_scripts_ready_as_it_starts(
    redis_client: redis.Redis, redis_url: str
) -> None:
    redis_client.script_flush()
    app = make_app(spec_config(), redis_url)
    with TestClient(app) as client:
        redis_client.config_resetstat()
        created = client.post(f"{API}/ondemandvm", json={"pool1": 1})
        assert created.status_code == 201, created.text
        rid = created.json()["request_id"]
        assert client.get(f"{API}/ondemandvm/{rid}").status_code == 202
    assert _loads(redis_client) == (0, 0)


def test_a_worker_loads_its_scripts_as_it_is_built(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """``vmpool worker`` builds its worker with build_worker: its fleet's scripts and its
    own (the pop, the lane check) are on the server before its first job."""
    redis_client.script_flush()
    worker = build_worker(redis_url, make_config())
    fleet = worker.fleet
    assert isinstance(fleet, Fleet)
    scripts = [*fleet.store.scripts.all(), pop_script(redis_client)]
    assert isinstance(fleet.dispatch, BatchDispatcher)
    scripts += fleet.dispatch.scripts
    assert all(redis_client.script_exists(*(s.sha for s in scripts)))

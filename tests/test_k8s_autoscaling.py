"""KEDA's wish for workers, computed from a live fleet's Redis during a burst.

No cluster here, so KEDA's side is replayed: for each trigger of the prod overlay's
ScaledObject, the count KEDA's ``redis`` scaler reads (it asks the key's TYPE, then
LLEN for a list, ZCARD for a sorted set, SCARD, HLEN), and the HPA's decision on it
(an ``AverageValue`` target: ``ceil(count / listLength)``, kept at the current count
within the HPA's 10% tolerance; the largest wish over the triggers, within
``minReplicaCount`` and ``maxReplicaCount``). The counts are read as KEDA would
connect with a Redis ACL user that has only the permissions docs/operations.md lists.

The fleet is real: one ``vmpool worker`` and one ``vmpool scheduler`` process on the
test Redis, the simulated provider with a create latency, requests made through the
API. The burst must make KEDA wish for several workers while one works, where the
queue triggers alone wish for one (batch jobs keep the RQ lists short); once the
burst is done, the wish must fall back to the minimum.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from k8shelp import find, render

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        __import__("shutil").which("kubectl") is None,
        reason="kubectl is not on PATH: deploy/k8s cannot be rendered (kubectl kustomize)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
HPA_TOLERANCE = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance
BURST_REQUESTS, VMS_PER_REQUEST = 4, 10
CONFIG = """
:providers:
  :simulated:
    boot_seconds: [0.3, 0.6]
    create_latency_seconds: 0.2
    seed: 11
:redis:
  key_prefix: vmpool
:config:
  ondemand_request_ttl: 5
  max_ondemand_instances_per_request: 10
  ondemand_clone_limit: 20
:pools:
  - {name: deb, template: deb, size: 0, provider: simulated}
"""
# The ACL of KEDA's user, as docs/operations.md gives it (its `redis` trigger runs one
# script: TYPE, then the count; go-redis says HELLO and PING on connect).
KEDA_ACL = (
    "on >keda-test-password resetkeys ~rq:queue:vmpool-* ~vmpool:work:* "
    "resetchannels -@all +ping +hello +select +eval +type +llen +zcard +scard +hlen"
)
# The same reads as KEDA's scaler script, in one script (a user that may not EVAL
# cannot run KEDA's either).
COUNT_LUA = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'zset' then return redis.call('ZCARD', KEYS[1]) end
if kind == 'set' then return redis.call('SCARD', KEYS[1]) end
if kind == 'hash' then return redis.call('HLEN', KEYS[1]) end
if kind == 'list' or kind == 'none' then return redis.call('LLEN', KEYS[1]) end
return redis.error_reply('unsupported key type ' .. kind)
"""


def scaled_object() -> dict[str, Any]:
    (obj,) = find(render("overlays/prod"), "ScaledObject")
    return dict(obj["spec"])


def trigger_counts(client: redis.Redis, triggers: list[dict[str, Any]]) -> list[int]:
    # EVAL, not EVALSHA: KEDA sends the script each time (and its user may only EVAL).
    return [int(client.eval(COUNT_LUA, 1, t["metadata"]["listName"])) for t in triggers]


def keda_wish(spec: dict[str, Any], counts: list[int], current: int) -> int:
    """The replica count KEDA's HPA sets for these trigger counts."""
    wishes = []
    for trigger, count in zip(spec["triggers"], counts, strict=True):
        target = float(trigger["metadata"]["listLength"])
        ratio = count / (target * current)
        wishes.append(current if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(count / target))
    return max(spec["minReplicaCount"], min(spec["maxReplicaCount"], max(wishes)))


def test_keda_wish_arithmetic() -> None:
    """The replayed HPA arithmetic on made-up counts (it can say 1 and it can say more)."""
    spec = {
        "minReplicaCount": 1,
        "maxReplicaCount": 20,
        "triggers": [{"metadata": {"listLength": "10"}}, {"metadata": {"listLength": "4"}}],
    }
    assert keda_wish(spec, [0, 0], current=1) == 1
    assert keda_wish(spec, [3, 19], current=1) == 5
    assert keda_wish(spec, [3, 21], current=5) == 5  # 21/20 is within the tolerance
    assert keda_wish(spec, [500, 0], current=1) == 20


@dataclass
class LiveFleet:
    tmp: Path
    redis_url: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, label: str, *args: str) -> None:
        env = {
            **os.environ,
            "VMPOOL_REDIS_URL": self.redis_url,
            "VMPOOL_CONFIG": str(self.tmp / "vmpool.yaml"),
            "PYTHONUNBUFFERED": "1",
        }
        with (self.tmp / f"{label}.log").open("wb") as log:
            self.procs[label] = subprocess.Popen(
                [sys.executable, "-m", "vmpool.cli.main", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> None:
        for label, proc in self.procs.items():
            log = (self.tmp / f"{label}.log").read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"{label} exited {proc.returncode}:\n{log}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait(timeout=10)


@pytest.fixture
def live(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Iterator[LiveFleet]:
    (tmp_path / "vmpool.yaml").write_text(CONFIG)
    fleet = LiveFleet(tmp_path, redis_url)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def keda_client(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A connection as KEDA's ACL user (RESP3: HELLO with AUTH, as go-redis)."""
    user = f"keda-{uuid.uuid4().hex[:8]}"
    redis_client.execute_command("ACL", "SETUSER", user, *KEDA_ACL.split())
    client = redis.Redis.from_url(
        redis_url, username=user, password="keda-test-password", protocol=3
    )
    try:
        yield client
    finally:
        client.close()
        redis_client.execute_command("ACL", "DELUSER", user)


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.2)


def test_the_acl_of_kedas_user_is_enough_and_no_more(keda_client: redis.Redis) -> None:
    spec = scaled_object()
    assert keda_client.ping()
    assert trigger_counts(keda_client, spec["triggers"]) == [0] * len(spec["triggers"])
    with pytest.raises(redis.exceptions.NoPermissionError):
        keda_client.get("vmpool:request:{x}")
    with pytest.raises(redis.exceptions.NoPermissionError):
        keda_client.set("rq:queue:vmpool-vms", "x")
    operations = (ROOT / "docs" / "operations.md").read_text()
    acl = KEDA_ACL.replace(">keda-test-password", ">PASSWORD")
    assert acl in operations, "docs/operations.md gives KEDA's ACL user"


def test_a_burst_on_one_worker_makes_keda_wish_for_several(
    live: LiveFleet, redis_url: str, keda_client: redis.Redis
) -> None:
    from fastapi.testclient import TestClient

    from vmpool.config import load_config

    from apihelp import make_app

    spec = scaled_object()
    queue_triggers = [t for t in spec["triggers"] if t["metadata"]["listName"].startswith("rq:")]
    assert 0 < len(queue_triggers) < len(spec["triggers"])
    queues_only = {**spec, "triggers": queue_triggers}
    live.start("worker", "worker", "--name", f"w-{uuid.uuid4().hex[:6]}")
    live.start("scheduler", "scheduler", "--interval", "0.5")
    config = load_config(live.tmp / "vmpool.yaml")
    wishes: list[tuple[int, int]] = []  # (every trigger, the queue triggers alone)

    def sample() -> None:
        counts = trigger_counts(keda_client, spec["triggers"])
        queue_counts = counts[: len(queue_triggers)]
        wishes.append((keda_wish(spec, counts, 1), keda_wish(queues_only, queue_counts, 1)))

    with TestClient(make_app(config, redis_url)) as api:
        ids = []
        for _ in range(BURST_REQUESTS):
            reply = api.post("/api/v3/ondemandvm", json={"deb": VMS_PER_REQUEST})
            assert reply.status_code == 201, reply.text
            ids.append(reply.json()["request_id"])

        def all_ready() -> bool:
            live.alive()
            sample()
            return all(api.get(f"/api/v3/ondemandvm/{rid}").status_code == 200 for rid in ids)

        wait_for(all_ready, 90, f"{BURST_REQUESTS * VMS_PER_REQUEST} VMs on one worker")
        for rid in ids:
            assert api.get(f"/api/v3/ondemandvm/{rid}").json()["ready"] is True

    most, most_by_queues = max(w for w, _ in wishes), max(q for _, q in wishes)
    print(f"KEDA's wish at each sample: {[w for w, _ in wishes]} (queues alone: {most_by_queues})")
    assert most >= 3, f"KEDA wished for {most} workers at most during the burst: {wishes}"
    assert most_by_queues <= 2, "the queue lists alone already saw the burst"

    # The burst is done: the wish falls back to the minimum (only the periodic sweeps).
    def idle() -> bool:
        live.alive()
        sample()
        return wishes[-1][0] == spec["minReplicaCount"]

    wait_for(idle, 30, "KEDA's wish back to the minimum")

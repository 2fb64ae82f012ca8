"""The containers of deploy/k8s run here as processes, with the manifests' environment.

No cluster and no image here: each test takes one container of the rendered prod
overlay (under a site overlay that generates its Secrets, as an operator's would:
tests/test_k8s_manifests.py's SITE) and runs its command line as a local process. Its
environment is the container's (literal values, and the Secret's values where it reads
a Secret); each ConfigMap volume is written under a temporary directory and the paths
pointing into it (VMPOOL_CONFIG) are rewritten to match. What cannot be the same here
is replaced, and only that: the Redis URL points at the test Redis (the Secret names
the in-cluster Service), the API listens on 127.0.0.1 and a free port, Redis keeps its
data in a temporary directory.

Every process is started by this module, waited for with a deadline, and stopped by
its pid at the end of its test. The worker's SIGTERM and Redis-outage behaviour are
tested with the worker itself (tests/test_worker_lifecycle.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from vmpool.local.redis_server import find_redis_server, free_port
from vmpool.state.keys import Keys

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("kubectl") is None,
        reason="kubectl is not on PATH: deploy/k8s cannot be rendered (kubectl kustomize)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0
JOB_TIMEOUT_S = 30.0


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    from k8shelp import SITE, render

    return list(render(SITE))


def workload(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (obj,) = [
        o
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet", "CronJob")
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    return obj


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return dict(obj["spec"]["template"]["spec"])


def by_name(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of a command argument."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text
    )


@dataclass
class Pod:
    """One container of the manifests, made runnable here."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, Path]  # mountPath -> the local directory standing for it


def local_pod(objs: list[dict[str, Any]], component: str, root: Path) -> Pod:
    obj = workload(objs, component)
    spec = pod_spec(obj)
    (container,) = spec["containers"]
    config_maps = by_name(objs, "ConfigMap")
    secrets = {
        name: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
        for name, s in by_name(objs, "Secret").items()
    }
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        local = root / "mnt" / mount["mountPath"].strip("/")
        local.mkdir(parents=True, exist_ok=True)
        sources = volume.get("projected", {}).get("sources", [volume])
        for source in sources:
            if "configMap" in source:
                for key, text in config_maps[source["configMap"]["name"]]["data"].items():
                    (local / key).write_text(text)
            if "secret" in source:
                ref = source["secret"]
                name = ref.get("name") or ref.get("secretName")
                if name not in secrets and ref.get("optional"):
                    continue
                for key, text in secrets[name].items():
                    (local / key).write_text(text)
        files[mount["mountPath"]] = local
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("secretRef", {})
        if ref.get("name") in secrets:
            env.update(secrets[ref["name"]])
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "value" in var:
            env[var["name"]] = localize(var["value"], files)
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
    argv = [expand(arg, env) for arg in [*container.get("command", []), *container["args"]]]
    argv = [localize(arg, files) for arg in argv]
    if argv[0] == "vmpool":
        argv = [sys.executable, "-m", "vmpool.cli.main", *argv[1:]]
    return Pod(argv=argv, env=env, files=files)


def localize(value: str, files: dict[str, Path]) -> str:
    """``value`` with a path inside a mounted volume rewritten to the local directory."""
    for mount_path in sorted(files, key=len, reverse=True):
        if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
            return str(files[mount_path]) + value[len(mount_path.rstrip("/")) :]
    return value


def replace_option(argv: list[str], option: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(option) + 1] = value
    return out


@dataclass
class Processes:
    """Processes started by one test, each stopped by its pid at the end."""

    root: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, label: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.root / f"{label}.log").open("wb")
        base = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.root)}
        proc = subprocess.Popen(
            argv,
            env={**base, **env},
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[label] = proc
        return proc

    def log(self, label: str) -> str:
        return (self.root / f"{label}.log").read_text(errors="replace")

    def alive(self, label: str) -> None:
        proc = self.procs[label]
        assert proc.poll() is None, f"{label} exited {proc.returncode}:\n{self.log(label)}"

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
                except ProcessLookupError:
                    pass


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def test_api_answers_its_probes(
    objs: list[dict[str, Any]], processes: Processes, redis_url: str, redis_client: Any
) -> None:
    pod = local_pod(objs, "api", processes.root)
    assert pod.env["VMPOOL_CONFIG"].startswith(str(processes.root))
    pod.env["VMPOOL_REDIS_URL"] = redis_url
    port = free_port()
    argv = replace_option(replace_option(pod.argv, "--host", "127.0.0.1"), "--port", str(port))
    processes.start("api", argv, pod.env)
    api = workload(objs, "api")
    (container,) = pod_spec(api)["containers"]
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        processes.alive("api")
        return http_status(base + container["startupProbe"]["httpGet"]["path"]) == 200

    wait_for(answers, START_TIMEOUT_S, "the api's startup probe", step=0.2)
    for probe in ("livenessProbe", "readinessProbe"):
        path = container[probe]["httpGet"]["path"]
        assert http_status(base + path) == 200, f"{probe} GET {path}"
    with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
        assert b"vmpool_queue_depth" in response.read()


def test_a_worker_takes_a_job(
    objs: list[dict[str, Any]], processes: Processes, redis_url: str, conn: redis.Redis
) -> None:
    from rq import Worker

    from vmpool.config import load_config
    from workers.queues import enqueue

    pod = local_pod(objs, "worker", processes.root)
    pod.env["VMPOOL_REDIS_URL"] = redis_url
    keys = Keys(load_config(pod.env["VMPOOL_CONFIG"], env={}).key_prefix)
    processes.start("worker", pod.argv, pod.env)

    def registered() -> bool:
        processes.alive("worker")
        return bool(Worker.all(connection=conn))

    wait_for(registered, START_TIMEOUT_S, "the worker to register", step=0.2)
    assert enqueue(conn, keys, "sweep_expired")
    queue_list = keys.rq_queue("sweeps")

    def done() -> bool:
        processes.alive("worker")
        counts = [w.successful_job_count for w in Worker.all(connection=conn)]
        return conn.llen(queue_list) == 0 and sum(counts) >= 1

    wait_for(done, JOB_TIMEOUT_S, "the worker to run the sweep", step=0.2)


def test_redis_runs_with_its_config_and_the_secrets_password(
    objs: list[dict[str, Any]], processes: Processes
) -> None:
    """The Redis container's command with its rendered redis.conf (here: valkey or
    redis-server, on a free port, data in a temporary directory): AOF on, fsync always,
    noeviction, maxmemory from the ConfigMap; the Secret's redis-url opens it."""
    pod = local_pod(objs, "redis", processes.root)
    assert pod.argv[0] == "redis-server"
    port = free_port()
    data = pod.files["/data"]
    conf = Path(pod.argv[1])
    # redis.conf names one path (dir), read before any command-line option: localized.
    conf.write_text(
        "".join(
            f"dir {localize(line.split()[1], pod.files)}\n"
            if line.startswith("dir ")
            else f"{line}\n"
            for line in conf.read_text().splitlines()
        )
    )
    argv = [find_redis_server(), *pod.argv[1:], "--port", str(port), "--bind", "127.0.0.1"]
    processes.start("redis", argv, pod.env)
    (secret,) = [
        s for n, s in by_name(objs, "Secret").items() if n.startswith("vmpool-redis-client")
    ]
    secrets = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    url = urlsplit(secrets["redis-url"])
    local_url = urlunsplit(url._replace(netloc=f":{url.password}@127.0.0.1:{port}"))
    client = redis.Redis.from_url(local_url, decode_responses=True, socket_timeout=2)
    try:

        def pings() -> bool:
            processes.alive("redis")
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        wait_for(pings, START_TIMEOUT_S, "redis to answer", step=0.1)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="wrong").ping()
        settings = {
            key: client.config_get(key)[key]
            for key in ("appendonly", "appendfsync", "maxmemory-policy", "maxmemory")
        }
        maxmemory = pod.env["REDIS_MAXMEMORY"].lower()
        expected = (
            int(maxmemory.rstrip("gmkb")) * {"gb": 2**30, "mb": 2**20, "kb": 2**10}[maxmemory[-2:]]
        )
        assert settings == {
            "appendonly": "yes",
            "appendfsync": "always",
            "maxmemory-policy": "noeviction",
            "maxmemory": str(expected),
        }
        client.set("vmpool:k8s-test", json.dumps({"ok": True}))
        wait_for(lambda: any((data / "appendonlydir").glob("*.aof")), 10, "the AOF files")
    finally:
        client.close()


def test_dashboard_answers_behind_basic_auth(
    objs: list[dict[str, Any]], processes: Processes, redis_url: str, redis_client: Any
) -> None:
    """rq-dashboard as its container runs it (options from RQ_DASHBOARD_* variables):
    401 without the Secret's credentials, the queues with them."""
    executable = Path(sys.executable).parent / "rq-dashboard"
    if not executable.exists():
        pytest.skip("rq-dashboard (vmpool's `dashboard` extra) is not installed here")
    pod = local_pod(objs, "dashboard", processes.root)
    assert pod.argv[0] == "rq-dashboard"
    pod.env["RQ_DASHBOARD_REDIS_URL"] = redis_url
    port = free_port()
    argv = [str(executable), *replace_option(pod.argv, "--bind", "127.0.0.1")[1:]]
    processes.start("dashboard", replace_option(argv, "--port", str(port)), pod.env)
    url = f"http://127.0.0.1:{port}/0/data/queues.json"

    def answers() -> bool:
        processes.alive("dashboard")
        return http_status(url) == 401

    wait_for(answers, START_TIMEOUT_S, "rq-dashboard to answer", step=0.2)
    user, password = pod.env["RQ_DASHBOARD_USERNAME"], pod.env["RQ_DASHBOARD_PASSWORD"]
    request = urllib.request.Request(url)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
        assert "queues" in json.loads(response.read())


def test_scheduler_answers_its_liveness_probe(
    objs: list[dict[str, Any]], processes: Processes, redis_url: str, redis_client: Any
) -> None:
    """The scheduler container's command with its environment touches the alive file
    its exec probes read; the probes' own commands (run here with the same
    environment) exit 0."""
    pod = local_pod(objs, "scheduler", processes.root)
    pod.env["VMPOOL_REDIS_URL"] = redis_url
    alive = Path(pod.env["VMPOOL_SCHEDULER_ALIVE_FILE"])
    alive.parent.mkdir(parents=True, exist_ok=True)
    processes.start("scheduler", pod.argv, pod.env)

    def touched() -> bool:
        processes.alive("scheduler")
        return alive.exists()

    wait_for(touched, START_TIMEOUT_S, "the scheduler's alive file")
    (container,) = pod_spec(workload(objs, "scheduler"))["containers"]
    for probe in ("startupProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:3] == ["vmpool", "probe", "scheduler"]
        argv = [sys.executable, "-m", "vmpool.cli.main", *command[1:]]
        done = subprocess.run(
            argv, env={**os.environ, **pod.env}, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{probe}: {done.stdout}{done.stderr}"

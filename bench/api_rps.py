"""POST /ondemandvm (and GET of a pending request) against /healthz, same API process.

    .venv/bin/python bench/api_rps.py [--runs 3] [--seconds 5] [--connections 16] [--aof]

Starts a throw-away redis-server (``--aof``: appendfsync always) and one API process
(uvicorn, one worker, as ``vmpool api`` runs it; no worker, so requests stay pending),
then drives it from ``--connections`` keep-alive HTTP connections (one thread each) for
``--seconds`` per endpoint, ``--runs`` times, alternating. Baseline: /healthz on the same
process in the same run. Reports requests/s, p99 latency and Redis commands per POST
(INFO commandstats, Lua-internal commands included), min / median of the runs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vmpool.local.redis_server import RedisServer, free_port  # noqa: E402

CONFIG = """
:providers:
  :sim:
    provider_class: simulated
:config:
  ondemand_request_ttl: 3600
  max_ondemand_instances_per_request: 10
:pools:
  - name: debian
    template: debian
    size: 0
    provider: sim
"""
API_CODE = (
    "import sys, uvicorn; from vmpool.config import load_config;"
    "from vmpool.api.app import create_app;"
    "uvicorn.run(create_app(load_config(sys.argv[1]), sys.argv[2]), host='127.0.0.1',"
    " port=int(sys.argv[3]), log_level='warning')"
)


def drive(port: int, method: str, path: str, body: bytes, conns: int, secs: float) -> tuple:
    """(requests/s, p99 ms, request ids seen) of ``conns`` threads for ``secs``."""
    lat: list[float] = []
    ids: list[str] = []
    lock = threading.Lock()
    stop = time.monotonic() + secs

    def run() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine, got = [], []
        while time.monotonic() < stop:
            t = time.perf_counter()
            c.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            data = resp.read()
            assert resp.status < 300, (resp.status, data[:200])
            mine.append(time.perf_counter() - t)
            if method == "POST":
                got.append(json.loads(data)["request_id"])
        with lock:
            lat.extend(mine)
            ids.extend(got)

    threads = [threading.Thread(target=run) for _ in range(conns)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat.sort()
    return len(lat) / elapsed, lat[int(0.99 * (len(lat) - 1))] * 1e3, ids


def mm(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(min(values))} / {fmt.format(statistics.median(values))}"


def measure(url: str, port: int, args: argparse.Namespace) -> list[str]:
    conn = redis.Redis.from_url(url)
    res: dict[str, list[tuple]] = {"healthz": [], "post": [], "get": []}
    cmds: list[float] = []
    usecs: list[float] = []
    for _ in range(args.runs):
        res["healthz"].append(drive(port, "GET", "/healthz", b"", args.connections, args.seconds))
        conn.config_resetstat()
        post = drive(port, "POST", "/api/v3/ondemandvm", b'{"debian": 1}', args.connections,
                     args.seconds)  # fmt: skip
        stats = conn.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
        cmds.append(calls / max(1, len(post[2])))
        usec = sum(float(v["usec"]) for k, v in stats.items() if k != "cmdstat_config")
        usecs.append(usec / max(1, len(post[2])))
        res["post"].append(post)
        rid = post[2][0]
        res["get"].append(
            drive(port, "GET", f"/api/v3/ondemandvm/{rid}", b"", args.connections, args.seconds)
        )
    h = [r[0] for r in res["healthz"]]
    rows = []
    for name, label in (("post", "POST /ondemandvm"), ("get", "GET /ondemandvm/<pending id>")):
        rps = [r[0] for r in res[name]]
        p99 = [r[1] for r in res[name]]
        rows.append(
            f"| {label} rps ÷ /healthz rps ({args.connections} connections) | {mm(rps)} ÷ {mm(h)}"
            f" (p99 {mm(p99)} ms) | {mm([a / b for a, b in zip(rps, h, strict=True)], '{:.2f}')} |"
        )
    rows.append(
        f"| Redis commands / server µs per POST /ondemandvm | {mm(cmds, '{:.1f}')} cmds,"
        f" {mm(usecs)} µs | - |"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--aof", action="store_true", help="appendonly yes, appendfsync always")
    args = parser.parse_args()
    server = RedisServer(appendonly=args.aof).start()
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(CONFIG)
    cmd = [sys.executable, "-c", API_CODE, f.name, server.url, str(port)]
    api = subprocess.Popen(cmd, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
                break
            except OSError:
                assert time.monotonic() < deadline, "the API did not start"
                time.sleep(0.1)
        version = redis.Redis.from_url(server.url).info("server")["redis_version"]
        print(
            f"# nproc={os.cpu_count()} python={platform.python_version()}"
            f" redis-server={version} aof={args.aof} runs={args.runs}"
            f" loadavg={os.getloadavg()[0]:.2f}"
        )
        rows = measure(server.url, port, args)
    finally:
        api.kill()
        api.wait(10)
        server.stop()
        os.unlink(f.name)
    print("| figure | measured (min / median) | ratio (min / median) |")
    print("|---|---|---|")
    for row in rows:
        print(row)
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

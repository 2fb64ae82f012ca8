"""POST /ondemandvm (and GET of a pending request) against /healthz, same API process.

    .venv/bin/python bench/api_rps.py [--runs 3] [--seconds 3] [--connections 1,16]
                                      [--aof] [--log-level info]
                                      [--creates-at-once | --post-floor]

Starts a throw-away redis-server (``--aof``: appendfsync always) and one API process as
``vmpool up`` runs it: ``vmpool api`` (uvicorn, one worker, ``--log-level info``, so
uvicorn's access log on, every line written unbuffered to the process's output, here a
file); no worker, so requests stay pending. ``--log-level warning`` runs it without the
access log. Then, for each connection count, drives it from that many keep-alive HTTP/1.1
connections (one thread each, raw sockets: the client's own cost per request is a few
µs of Python) for ``--seconds`` per endpoint, ``--runs`` times, alternating. Baseline:
/healthz on the same process in the same run. Reports requests/s, p50 and p99 latency,
the ratio to /healthz (min / median / max of the runs), Redis commands per POST
(INFO commandstats, Lua-internal commands included) and the Redis server's CPU per POST
(INFO cpu: on a machine whose cores the API, Redis and this client share, the POST's
throughput pays it too).

``--creates-at-once`` and ``--post-floor`` put bench/_ablation on the API process's
path. With the first, after the first batch, each batch of the POSTs' creates is
answered ``created`` without its round trip to Redis. With the second, POST
/ondemandvm is served by the least a create does in this server stack (its body
parsed, a new id, the route's create call in the turn's batch, a raw reply): none of
vmpool's route. Each measures a bound (the ratio without that part), not the API's
behaviour.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line, server_version  # noqa: E402

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
POST_BODY = b'{"debian": 1}'
LENGTH_RE = re.compile(rb"\r\ncontent-length: *(\d+)", re.I)
REQUEST_ID_RE = re.compile(rb'"request_id": *"([^"]+)"')


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    """(status, body) of one response on ``sock``; ``buf`` keeps what is read past it."""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the API closed the connection")
        buf += chunk
    head = bytes(buf[: end + 2])
    match = LENGTH_RE.search(head)
    size = int(match.group(1)) if match else 0
    while len(buf) < end + 4 + size:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the API closed the connection")
        buf += chunk
    body = bytes(buf[end + 4 : end + 4 + size])
    del buf[: end + 4 + size]
    return int(head[9:12]), body


@dataclass
class Load:
    """One endpoint driven from ``conns`` connections for a while."""

    rps: float
    latencies: list[float]
    first_body: bytes = b""
    cpu_us: float = 0.0  # the API process's CPU (user + system) per request

    def quantile(self, q: float) -> float:
        return self.latencies[int(q * (len(self.latencies) - 1))] * 1e3


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(port: int, request: bytes, conns: int, secs: float, pid: int = 0) -> Load:
    """``conns`` threads sending ``request`` back to back on their own connection.

    ``pid``: the API process, whose CPU per request is measured."""
    lat: list[float] = []
    bodies: list[bytes] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(conns + 1)
    stop = [0.0]

    def run() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        mine: list[float] = []
        start_gate.wait()
        clock = time.perf_counter
        while clock() < stop[0]:
            t = clock()
            sock.sendall(request)
            status, body = read_response(sock, buf)
            mine.append(clock() - t)
            assert status < 300, (status, body[:200])
            if not bodies:
                bodies.append(body)
        sock.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(conns)]
    for t in threads:
        t.start()
    stop[0] = time.perf_counter() + secs
    cpu = cpu_seconds(pid) if pid else 0.0
    start_gate.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    cpu = cpu_seconds(pid) - cpu if pid else 0.0
    lat.sort()
    return Load(len(lat) / elapsed, lat, bodies[0] if bodies else b"", cpu * 1e6 / len(lat))


def mmm(values: list[float], fmt: str = "{:.0f}") -> str:
    """min / median / max of ``values``."""
    parts = (min(values), statistics.median(values), max(values))
    return " / ".join(fmt.format(v) for v in parts)


@dataclass
class Runs:
    """Every run's load of each endpoint at one connection count."""

    conns: int
    loads: dict[str, list[Load]] = field(default_factory=dict)

    def add(self, name: str, load: Load) -> None:
        self.loads.setdefault(name, []).append(load)

    def row(self, name: str, label: str) -> str:
        mine, base = self.loads[name], self.loads["healthz"]
        ratios = [a.rps / b.rps for a, b in zip(mine, base, strict=True)]
        return (
            f"| {label} | {self.conns} | {mmm([x.rps for x in mine])}"
            f" | {mmm([x.quantile(0.5) for x in mine], '{:.1f}')}"
            f" | {mmm([x.quantile(0.99) for x in mine], '{:.1f}')}"
            f" | {mmm([x.cpu_us for x in mine])}"
            f" | **{mmm(ratios, '{:.2f}')}** |"
        )


def server_cpu(conn: redis.Redis) -> float:
    """The Redis server's CPU seconds (user + system) so far."""
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(
    url: str, port: int, pid: int, args: argparse.Namespace
) -> tuple[list[Runs], list[float], list[float]]:
    """Each connection count's runs, alternating the endpoints; Redis commands and Redis
    server CPU (µs) per POST."""
    conn = redis.Redis.from_url(url)
    healthz = http_request("GET", "/healthz")
    post = http_request("POST", "/api/v3/ondemandvm", POST_BODY)
    first = drive(port, post, 1, 0.5)  # warm-up, and the pending request the GETs read
    match = REQUEST_ID_RE.search(first.first_body)
    assert match, first.first_body
    get = http_request("GET", f"/api/v3/ondemandvm/{match.group(1).decode()}")
    drive(port, healthz, 1, 0.5)
    drive(port, get, 1, 0.5)
    out = [Runs(c) for c in args.connections]
    cmds: list[float] = []
    redis_us: list[float] = []
    for _ in range(args.runs):
        for runs in out:
            runs.add("healthz", drive(port, healthz, runs.conns, args.seconds, pid))
            conn.config_resetstat()
            redis_cpu = server_cpu(conn)
            load = drive(port, post, runs.conns, args.seconds, pid)
            redis_us.append((server_cpu(conn) - redis_cpu) * 1e6 / max(1, len(load.latencies)))
            stats = conn.info("commandstats")
            calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
            cmds.append(calls / max(1, len(load.latencies)))
            runs.add("post", load)
            runs.add("get", drive(port, get, runs.conns, args.seconds, pid))
    return out, cmds, redis_us


def start_api(
    config: str, url: str, port: int, log_level: str, log: Path, ablation: str = ""
) -> subprocess.Popen:
    """``vmpool api`` as ``vmpool up`` starts it, its output (access log) into ``log``.

    ``ablation``: with bench/_ablation on its path, that bound of it (see
    ``--creates-at-once`` and ``--post-floor``); empty: none."""
    cmd = [sys.executable, "-m", "vmpool.cli.main", "api", "--config", config]
    cmd += ["--redis-url", url, "--port", str(port), "--log-level", log_level]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if ablation:
        paths = [str(ROOT / "bench" / "_ablation"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        env["VMPOOL_BENCH_ABLATION"] = ablation
    with log.open("wb") as out:
        api = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return api
        except OSError:
            if api.poll() is not None or time.monotonic() > deadline:
                api.kill()
                sys.exit(f"the API did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)


def report(server: RedisServer, pid: int, args: argparse.Namespace) -> None:
    settings = {"aof": args.aof, "runs": args.runs, "seconds": args.seconds}
    settings |= {"log-level": args.log_level, "creates-at-once": args.creates_at_once}
    settings |= {"post-floor": args.post_floor}
    version = server_version(server.url)
    print(machine_line(settings, server=version, allocator=server.allocator))
    out, cmds, redis_us = measure(server.url, args.port, pid, args)
    print(
        "| endpoint | connections | rps | p50 ms | p99 ms | API CPU µs per request |"
        " rps ÷ /healthz rps |"
    )
    print("|---|---|---|---|---|---|---|")
    for runs in out:
        print(runs.row("healthz", "GET /healthz"))
        print(runs.row("post", "POST /ondemandvm"))
        print(runs.row("get", "GET /ondemandvm/<pending id>"))
    print(f"\nRedis commands per POST /ondemandvm: {mmm(cmds, '{:.1f}')}")
    print(f"Redis server CPU µs per POST /ondemandvm (none per /healthz): {mmm(redis_us)}")
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


def ablation(args: argparse.Namespace) -> str:
    """The bound bench/_ablation puts on the API's path for ``args``, empty for none."""
    if args.creates_at_once:
        return "creates-at-once"
    return "post-floor" if args.post_floor else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", default="1,16", help="comma-separated counts")
    parser.add_argument("--aof", action="store_true", help="appendonly yes, appendfsync always")
    parser.add_argument("--log-level", default="info", help="vmpool api's (info: access log on)")
    bounds = parser.add_mutually_exclusive_group()
    bounds.add_argument(
        "--creates-at-once",
        action="store_true",
        help="answer the creates without Redis (a bound, see bench/_ablation)",
    )
    bounds.add_argument(
        "--post-floor",
        action="store_true",
        help="serve POST with none of vmpool's route (a bound, see bench/_ablation)",
    )
    args = parser.parse_args()
    args.connections = [int(c) for c in args.connections.split(",") if c]
    server = RedisServer(appendonly=args.aof).start()
    args.port = free_port()
    with tempfile.TemporaryDirectory(prefix="api-rps-") as tmp:
        config = Path(tmp, "config.yaml")
        config.write_text(CONFIG)
        log = Path(tmp, "api.log")
        api = start_api(str(config), server.url, args.port, args.log_level, log, ablation(args))
        try:
            report(server, api.pid, args)
        finally:
            api.kill()
            api.wait(10)
            server.stop()


if __name__ == "__main__":
    main()

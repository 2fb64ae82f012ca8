"""Instructions per request through the API's app, counted by valgrind: the POST's own cost
in a figure that a busy or throttled machine does not move.

    .venv/bin/python bench/api_instructions.py [--rounds 100]

Starts a throw-away redis-server, then for each endpoint runs the app (``create_app``,
the config of bench/api_rps.py, no worker) in a child process under
``valgrind --tool=callgrind``: ``20`` turns of 8 concurrent requests sent to the ASGI app
itself (no HTTP server, no sockets but Redis's), and again ``20 + --rounds`` turns. The
difference of the two runs' instruction counts ÷ (``--rounds`` times 8) is the instructions
of one request, the app's start and the warm-up taken away. The 8 requests of a turn go
to Redis in one batch, as under load. Baseline: /healthz. Valgrind counts user-space
instructions only (no system call's, no wait), so this is the Python the API runs for a
request; bench/api_rps.py measures the whole server under load.

Needs valgrind (Debian: ``apt install valgrind``); a run takes a few minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line, server_version  # noqa: E402
from api_rps import CONFIG, POST_BODY  # noqa: E402

from vmpool.local.redis_server import RedisServer  # noqa: E402

WARM_UP = 20  # turns before the counted ones, in both runs
TURN = 8  # requests a turn, sent together (one batch)
COLLECTED_RE = re.compile(r"Collected : (\d+)")
ENDPOINTS = ("healthz", "post", "get")


def _scope(method: str, path: str, body: bytes) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    headers.append((b"content-length", b"%d" % len(body)))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


def child(url: str, endpoint: str, turns: int) -> None:
    """Serve ``turns`` turns of ``endpoint`` through the app (the process valgrind counts)."""
    from vmpool.api.app import create_app
    from vmpool.config import load_config

    config = Path(tempfile.mkdtemp(prefix="api-instr-"), "config.yaml")
    config.write_text(CONFIG)
    app = create_app(load_config(str(config)), url)

    async def one(method: str, path: str, body: bytes) -> bytes:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(_scope(method, path, body), receive, send)
        if sent[0]["status"] not in (200, 201, 202):  # 202: a GET of a pending request
            raise RuntimeError(f"{method} {path}: {sent[0]['status']} {sent[-1].get('body')!r}")
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    async def main() -> None:
        async with app.router.lifespan_context(app):
            created = await one("POST", "/api/v3/ondemandvm", POST_BODY)
            rid = re.search(rb'"request_id": *"([^"]+)"', created)
            assert rid, created
            request = {
                "healthz": ("GET", "/healthz", b""),
                "post": ("POST", "/api/v3/ondemandvm", POST_BODY),
                "get": ("GET", f"/api/v3/ondemandvm/{rid.group(1).decode()}", b""),
            }[endpoint]
            for _ in range(turns):
                await asyncio.gather(*(one(*request) for _ in range(TURN)))

    asyncio.run(main())


def counted(url: str, endpoint: str, turns: int) -> int:
    """The instructions valgrind counts in a child serving ``turns`` turns."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, __file__, "--child", url, endpoint, str(turns)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    found = COLLECTED_RE.search(done.stderr)
    if done.returncode != 0 or not found:
        sys.exit(f"the counted run failed ({done.returncode}): {done.stderr[-1500:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="counted turns of 8 requests")
    parser.add_argument("--child", nargs=3, metavar=("URL", "ENDPOINT", "TURNS"), help="internal")
    args = parser.parse_args()
    if args.child:
        url, endpoint, turns = args.child
        child(url, endpoint, int(turns))
        return
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if shutil.which("valgrind") is None:
        sys.exit(
            "valgrind not found: this benchmark counts instructions with it (apt install valgrind)"
        )
    server = RedisServer().start()
    try:
        version = server_version(server.url)
        settings = {"rounds": args.rounds, "turn": TURN}
        print(machine_line(settings, server=version, allocator=server.allocator))
        runs = [(e, t) for e in ENDPOINTS for t in (WARM_UP, WARM_UP + args.rounds)]
        # two at a time: a count does not depend on what else runs
        with ThreadPoolExecutor(max_workers=2) as pool:
            got = dict(zip(runs, pool.map(lambda r: counted(server.url, *r), runs), strict=True))
        per = {
            e: (got[(e, WARM_UP + args.rounds)] - got[(e, WARM_UP)]) // (args.rounds * TURN)
            for e in ENDPOINTS
        }
    finally:
        server.stop()
    labels = {
        "healthz": "GET /healthz",
        "post": "POST /ondemandvm",
        "get": "GET /ondemandvm/<pending id>",
    }
    print("| endpoint | instructions per request | ÷ /healthz |")
    print("|---|---|---|")
    for endpoint in ENDPOINTS:
        ratio = per[endpoint] / per["healthz"]
        print(f"| {labels[endpoint]} | {per[endpoint]:,} | {ratio:.2f} |")


if __name__ == "__main__":
    main()

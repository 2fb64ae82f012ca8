"""Which script or plain command sends each Redis command of the fleet's per-VM path.

    .venv/bin/python bench/command_attribution.py [--vms 300]

Runs the fleet figure of bench/targets.py (2 worker processes deliver N one-VM requests
to ready on the simulated provider) once, against a throw-away redis-server, with a
MONITOR client reading every command from the release of the queues on. A command run
inside a Lua script (MONITOR shows it as ``[0 lua]``, after the EVALSHA that runs it) is
counted to that EVALSHA's script, named by its file: the first ``-- NAME.lua:`` header
line of the text the SCRIPT LOAD sent, not counting the helpers' (``_prelude.lua`` etc.),
or RQ's own script by its first line. MONITOR slows the server, so the batches are
smaller and the fixed costs per batch weigh a little more than in targets.py's figure;
the table says where the commands go, targets.py how many there are.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from pathlib import Path

import redis
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import targets  # noqa: E402
from _machine import machine_line, server_version  # noqa: E402

from vmpool.local.redis_server import RedisServer  # noqa: E402

ARG = re.compile(rb'"((?:\\.|[^"\\])*)"')
ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("a"): 7, ord("b"): 8}


def unescape(raw: bytes) -> bytes:
    """One MONITOR argument as the client sent it (Redis quotes it with sdscatrepr)."""
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] != 92:  # a backslash
            out.append(raw[i])
            i += 1
        elif raw[i + 1] == ord("x"):
            out.append(int(raw[i + 2 : i + 4], 16))
            i += 4
        else:
            out.append(ESCAPES.get(raw[i + 1], raw[i + 1]))
            i += 2
    return bytes(out)


def parse(line: bytes) -> tuple[bool, list[bytes]]:
    """(run inside a script?, the command's arguments) of one MONITOR line."""
    head, _, rest = line.partition(b"] ")
    return head.split(b" ")[-1] == b"lua", [unescape(a) for a in ARG.findall(rest)]


END = b"bench:monitor-end"


class Monitor:
    """A MONITOR client on a thread, keeping every line until it reads the end mark."""

    def __init__(self, url: str) -> None:
        self.lines: list[tuple[bool, list[bytes]]] = []
        self._client = redis.Redis.from_url(url)
        self._conn = redis.Redis.from_url(url).connection_pool.get_connection()
        self._conn.send_command("MONITOR")
        self._conn.read_response()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                in_lua, args = parse(self._conn.read_response())
            except (redis.ConnectionError, OSError):
                return
            if args == [b"ECHO", END]:
                return
            self.lines.append((in_lua, args))

    def stop(self) -> None:
        """Send the end mark and wait until every line before it was read (<= 60 s)."""
        self._client.echo(END)
        self._thread.join(60)
        self._conn.disconnect()
        assert not self._thread.is_alive(), "the monitor did not read its end mark"


def script_name(text: str) -> str:
    """A script's file, from its text: the last ``-- NAME.lua:`` header not a helper's."""
    own = [n for n in re.findall(r"^-- (\w+)\.lua:", text, re.M) if not n.startswith("_")]
    return own[-1] if own else "rq: " + text.strip().splitlines()[0][:40]


def attribute(
    lines: list[tuple[bool, list[bytes]]],
) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """(calls per script, commands per script by kind, the EVALSHA included); plain
    commands under '(plain commands)'. From the queues' release (the first RENAMENX)."""
    names = {
        hashlib.sha1(a[2]).hexdigest(): script_name(a[2].decode())
        for _, a in lines
        if len(a) >= 3 and a[0].upper() == b"SCRIPT" and a[1].upper() == b"LOAD"
    }
    start = next(i for i, (_, a) in enumerate(lines) if a and a[0].upper() == b"RENAMENX")
    calls: Counter[str] = Counter()
    inner: dict[str, Counter[str]] = defaultdict(Counter)
    current = "(plain commands)"
    for in_lua, args in lines[start:]:
        if not args:
            continue
        kind = args[0].decode().lower()
        if not in_lua:
            current = "(plain commands)"
            if kind == "evalsha":
                current = names.get(args[1].decode(), args[1][:8].decode())
                calls[current] += 1
        inner[current][kind] += 1
    return calls, inner


def table(n: int, calls: Counter[str], inner: dict[str, Counter[str]]) -> list[str]:
    total = sum(sum(c.values()) for c in inner.values())
    rows = [f"| all | | {total / n:.1f} | |"]
    for name, kinds in sorted(inner.items(), key=lambda kv: -sum(kv[1].values())):
        top = " ".join(f"{k}={v / n:.2f}" for k, v in kinds.most_common(14) if k != "evalsha")
        per = f"{calls[name] / n:.2f}" if name in calls else ""
        rows.append(f"| {name} | {per} | {sum(kinds.values()) / n:.1f} | {top} |")
    return [
        "| script | calls per VM | Redis commands per VM | commands inside, per VM |",
        "|---|---|---|---|",
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--vms", type=int, default=300)
    args = parser.parse_args()
    server = RedisServer().start()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(targets.config_data(), f)
    try:
        version = server_version(server.url)
        print(machine_line({"vms": args.vms}, server=version, allocator=server.allocator))
        monitor = Monitor(server.url)
        targets.fleet_real(server.url, args.vms, f.name)
        monitor.stop()
    finally:
        server.stop()
        os.unlink(f.name)
    for line in table(args.vms, *attribute(monitor.lines)):
        print(line)
    print(f"# loadavg after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Redis CPU per call of the store's hot scripts: composed with the helpers each body
reaches (as the store runs them) against composed with all the helpers.

    .venv/bin/python bench/script_cost.py [--requests 400] [--runs 5]

Starts a throw-away redis-server. Two stores on it, one per composition, each under its
own key prefix (vmpool.state.store_scripts.StoreScripts ``whole``). Each run drives
``--requests`` one-VM requests through create_request, reserve_vm, vm_created and
vm_ready on each store in turn, alternating which goes first, plus calls refused at
their first command (a create_request of an id that exists, a VM script on a VM that
does not): the call's fixed cost alone. Redis' time per EVALSHA of each phase is read
from INFO commandstats (reset before the phase): the server's own CPU for the calls,
none of the client's. Reports the median over runs
and the least over runs of microseconds per call (the least: the machine's other load
only adds), and the ratios pruned / whole.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line, server_version  # noqa: E402

from vmpool.local.redis_server import RedisServer  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.records import RequestSettings, Slot  # noqa: E402
from vmpool.state.store import Store  # noqa: E402
from vmpool.state.store_scripts import StoreScripts  # noqa: E402

# A phase "(...)" is a refusal at the script's first read: its fixed cost alone.
PHASES = (
    "create_request",
    "create_request (exists)",
    "reserve_vm",
    "vm_created",
    "vm_created (no VM)",
    "vm_ready",
    "vm_ready (no VM)",
)
VARIANTS = ("pruned", "whole")
SETTINGS = RequestSettings(ttl_s=3600)


def evalsha_usec(r: redis.Redis) -> tuple[int, int]:
    """EVALSHA calls and their microseconds since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(stats["calls"]), int(stats["usec"])


def timed(r: redis.Redis, phase: Callable[[], None]) -> float:
    """Microseconds of Redis time per EVALSHA that ``phase`` made."""
    r.config_resetstat()
    phase()
    calls, usec = evalsha_usec(r)
    return usec / max(1, calls)


def drive(s: Store, phase: str, ids: list[str], names: list[str]) -> None:
    """Make ``phase``'s calls on store ``s``: one per request (its VM ``names[i]``)."""
    slots = [Slot("deb", "debian", 1)]
    for rid, name in zip(ids, names, strict=True):
        if phase.startswith("create_request"):
            s.create_request(rid, slots, SETTINGS, actor="bench")
        elif phase == "reserve_vm":
            s.reserve_vm(
                rid,
                name=name,
                alias="deb",
                pool="debian",
                template="t",
                provider="sim",
                domain="example.com",
                actor="bench",
            )
        elif phase.startswith("vm_created"):
            s.vm_created(_vm(phase, name), actor="bench", request_id=rid)
        else:
            s.vm_ready(_vm(phase, name), actor="bench", request_id=rid)


def _vm(phase: str, name: str) -> str:
    """The VM a phase names: ``name``, or one that does not exist (a refusal phase)."""
    return f"{name}-none" if phase.endswith("(no VM)") else name


def one_run(
    r: redis.Redis, stores: dict[str, Store], n: int, run: int
) -> dict[str, dict[str, float]]:
    """Microseconds per call, by variant and phase, of one run of ``n`` requests each."""
    out: dict[str, dict[str, float]] = {v: {} for v in VARIANTS}
    order = VARIANTS if run % 2 == 0 else VARIANTS[::-1]
    ids = [f"r{run}-{i}" for i in range(n)]
    names = [f"r{run}-vm{i}" for i in range(n)]
    for phase in PHASES:
        for v in order:
            out[v][phase] = timed(r, partial(drive, stores[v], phase, ids, names))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    server = RedisServer().start()
    try:
        r = redis.Redis.from_url(server.url)
        stores = {v: Store(r, Keys(f"bench-{v}")) for v in VARIANTS}
        stores["whole"].scripts = StoreScripts(r, stores["whole"].keys, whole=True)
        one_run(r, stores, 20, -1)  # warm up: scripts loaded, allocator settled
        runs = [one_run(r, stores, args.requests, i) for i in range(args.runs)]
        settings = {"runs": args.runs, "requests": args.requests}
        version = server_version(server.url)
        print(machine_line(settings, server=version, allocator=server.allocator))
        print("# Redis µs per EVALSHA, min / median of the runs")
        print("| script | pruned | whole | pruned ÷ whole |")
        print("|---|---|---|---|")
        for phase in PHASES:
            got = {v: [run[v][phase] for run in runs] for v in VARIANTS}
            low = {v: min(got[v]) for v in VARIANTS}
            mid = {v: statistics.median(got[v]) for v in VARIANTS}
            print(
                f"| {phase} | {low['pruned']:.1f} / {mid['pruned']:.1f} "
                f"| {low['whole']:.1f} / {mid['whole']:.1f} "
                f"| **{low['pruned'] / low['whole']:.2f} / {mid['pruned'] / mid['whole']:.2f}** |"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

"""A fleet past its capacity: the requests served per second from a burst that waits in
line, against the same number posted at a pace the fleet keeps up with.

    .venv/bin/python bench/overload.py [--requests 120] [--gap 0.55]

Runs the fleet of bench/eta.py (``vmpool up``: 2 workers; the simulated provider: a
create takes 1 s and holds one of the 2 clone slots, a boot 1.5-2.5 s; no warm pool).
Two phases on one fleet, one after the other: ``--requests`` one-VM requests posted
every ``--gap`` seconds (steady: the line stays short), then as many posted at once (a
burst: all but two wait in the clone slots' line). For each: requests/s from the first
POST to the last request ready, how many times each request's lock was granted (its
fence counter: one grant per provision step that reached it), and the Redis commands
per request. The ratio burst ÷ steady is the share of its pace the fleet keeps when a
line forms.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _machine import machine_line  # noqa: E402
from _up import Up, wait_for  # noqa: E402
from eta import CONFIG, _call  # noqa: E402

from vmpool.state.keys import Keys  # noqa: E402


def phase(up: Up, client: redis.Redis, n: int, gap: float) -> tuple[float, float, int, float]:
    """Post ``n`` one-VM requests ``gap`` s apart and wait until all are ready. Returns
    requests/s, lock grants per request (mean, max) and Redis commands per request."""
    keys = Keys()
    client.config_resetstat()
    begin = time.monotonic()
    rids = []
    for _ in range(n):
        rids.append(_call(up.port, "POST", "/ondemandvm", {"debian": 1})[1]["request_id"])
        if gap:
            time.sleep(gap)  # the pace of the posts is what is measured against
    waiting = list(reversed(rids))

    def all_ready() -> bool:
        # the first not ready yet is read again, those before it never: the poll's own
        # reads stay out of the commands counted per request (about 10 a second)
        while waiting and client.hget(keys.request(waiting[-1]), "status") == "ready":
            waiting.pop()
        return not waiting

    wait_for(all_ready, 1200, "every request ready")
    took = time.monotonic() - begin
    grants = [int(str(client.get(keys.request_fence(r)) or 0)) for r in rids]
    stats = client.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_config")
    return n / took, sum(grants) / n, max(grants), calls / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--gap", type=float, default=0.55, help="seconds between steady posts")
    args = parser.parse_args()
    print(machine_line({"requests": args.requests, "gap": f"{args.gap:g}s"}))
    print()
    with Up(CONFIG, tag="overload") as up:
        client = redis.Redis.from_url(up.redis_url, decode_responses=True)
        steady = phase(up, client, args.requests, args.gap)
        burst = phase(up, client, args.requests, 0.0)
        client.close()
    print("| requests posted | requests/s served | lock grants per request (mean / max) |"
          " Redis commands per request |")  # fmt: skip
    print("|---|---|---|---|")
    for name, (rate, mean, most, cmds) in (
        (f"{args.requests}, one every {args.gap} s", steady),
        (f"{args.requests} at once", burst),
    ):
        print(f"| {name} | {rate:.2f} | {mean:.1f} / {most} | {cmds:.0f} |")
    print()
    print(
        f"burst ÷ steady: {burst[0] / steady[0]:.2f} of the pace;"
        f" loadavg after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()

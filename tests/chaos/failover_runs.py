"""Planned switches, partitions and a dead replica, run again and again against real
servers, with the figures docs/reliability.md publishes.

    python tests/chaos/failover_runs.py --runs 10 [--scenarios planned_switch,partition,...]

Each run starts a group of its own (a primary, two replicas, three sentinels:
tests/sentinelhelp.py), and two writers create and delete requests through the store at
full speed, each recording every operation it was told was done (tests/failoverhelp.py):
one with vmpool's default config, one with ``durability_replicas: 1`` (the knob; what
the default was). Then the scenario:

- ``planned_switch``: ``SENTINEL FAILOVER``;
- ``switchover``: ``vmpool redis switchover`` (its function, in this process);
- ``partition``: the sentinels lose the primary and one replica for 15 s (their ACL
  user may run nothing there), while the writers and that replica's replication link
  still reach the primary; then healed;
- ``dead_replica``: one replica SIGKILLed (the availability cost: how long writes wait).

Once the group has settled, every acknowledged create must be there and every
acknowledged delete still deleted. ``waited`` is how long the writer went without an
acknowledgement: after a partition, from the heal to its first acknowledgement; after
a switch or a kill, the longest time without one in the 25 s after the command.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vmpool.state.switchover import group_access, switchover  # noqa: E402

from failoverhelp import (  # noqa: E402
    OpWriter,
    Verdict,
    longest_gap,
    options,
    store,
    verdict,
    wait_acknowledged,
    wait_served,
)
from sentinelhelp import SentinelGroup, sentinel_group, valkey_binary  # noqa: E402

PARTITION_S = 15.0
WATCH_S = 25.0  # how long after a switch or a kill the writers' gaps are measured
WRITERS = {"default": None, "durability_replicas 1": 1}


@dataclass
class Outcome:
    """One writer in one run."""

    verdict: Verdict
    served_s: float | None
    refusals: dict[str, int] = field(default_factory=dict)


def _planned_switch(group: SentinelGroup) -> float:
    old = group.current_primary()
    at = time.monotonic()
    group.failover()
    group.wait_failover(old)
    return at


def _switchover(group: SentinelGroup) -> float:
    at = time.monotonic()
    switchover(group_access(group.url, options()), timeout_s=30, report=lambda line: None)
    return at


def _partition(group: SentinelGroup) -> float:
    old = group.current_primary()
    cut = [old, next(n for n in group.replica_nodes if n is not old)]
    started = time.monotonic()
    group.partition(cut)
    group.wait_failover(old, timeout=PARTITION_S + 30)
    time.sleep(max(0.0, started + PARTITION_S - time.monotonic()))
    group.heal(cut)
    return time.monotonic()


def _dead_replica(group: SentinelGroup) -> float:
    at = time.monotonic()
    group.replica_nodes[0].kill()
    return at


SCENARIOS: dict[str, Callable[[SentinelGroup], float]] = {
    "planned_switch": _planned_switch,
    "switchover": _switchover,
    "partition": _partition,
    "dead_replica": _dead_replica,
}


def one_run(scenario: str, root: Path, down_after_ms: int) -> dict[str, Outcome]:
    """A fresh group, both writers, the scenario; the outcome per writer."""
    with sentinel_group(root, replicas=2, down_after_ms=down_after_ms) as group:
        writers = {
            name: OpWriter(store(group.url, options(n)), name) for name, n in WRITERS.items()
        }
        for writer in writers.values():
            writer.start()
        try:
            for writer in writers.values():
                wait_acknowledged(writer, 200, 60)
            since = SCENARIOS[scenario](group)
            served = _served(scenario, writers, since)
            if scenario == "dead_replica":
                group.replica_nodes[0].start()  # back on its own data: it resyncs
            group.wait_settled()
        finally:
            for writer in writers.values():
                writer.stop()
        return {
            name: Outcome(verdict(group, w), served[name], dict(w.refusals))
            for name, w in writers.items()
        }


def _served(scenario: str, writers: dict[str, OpWriter], since: float) -> dict[str, float | None]:
    """After a partition: from the heal to the first acknowledgement. Otherwise: the
    longest time without one in the :data:`WATCH_S` after the switch or the kill."""
    served: dict[str, float | None] = {}
    if scenario == "partition":
        for name, writer in writers.items():
            try:
                served[name] = round(wait_served(writer, since, 60), 2)
            except AssertionError:
                served[name] = None
        return served
    time.sleep(max(0.0, since + WATCH_S - time.monotonic()))
    return {name: round(longest_gap(w, since, since + WATCH_S), 2) for name, w in writers.items()}


def table(results: dict[str, list[dict[str, Outcome]]]) -> list[str]:
    out = [
        "| scenario | writer | runs | acknowledged creates | lost | acknowledged deletes"
        " | undone | writes waited (s): median / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario, runs in results.items():
        for name in WRITERS:
            got = [r[name] for r in runs]
            served = sorted(o.served_s for o in got if o.served_s is not None)
            missed = len(got) - len(served)
            times = f"{served[len(served) // 2]:.2f} / {served[-1]:.2f}" if served else "-"
            if missed:
                times += f" ({missed} not within 60 s)"
            out.append(
                f"| {scenario} | {name} | {len(got)}"
                f" | {sum(o.verdict.creates for o in got):,}"
                f" | {sum(len(o.verdict.lost_creates) for o in got):,}"
                f" | {sum(o.verdict.deletes for o in got):,}"
                f" | {sum(len(o.verdict.undone_deletes) for o in got):,} | {times} |"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--down-after-ms", type=int, default=1000,
                        help="the sentinels' down-after-milliseconds")  # fmt: skip
    parser.add_argument("--workdir", default=None, help="keep the groups' logs here")
    args = parser.parse_args()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the group's processes are stopped on the way out

    signal.signal(signal.SIGTERM, on_term)
    root = Path(args.workdir or "/tmp") / f"vmpool-failover-runs-{os.getpid()}"
    print(f"# nproc={os.cpu_count()} python={platform.python_version()}"
          f" server={Path(valkey_binary()).name} loadavg={os.getloadavg()[0]:.2f}"
          f" down-after-milliseconds={args.down_after_ms}")  # fmt: skip
    results: dict[str, list[dict[str, Outcome]]] = {}
    for scenario in args.scenarios.split(","):
        for i in range(args.runs):
            outcome = one_run(scenario, root / f"{scenario}-{i}", args.down_after_ms)
            results.setdefault(scenario, []).append(outcome)
            line = "; ".join(f"{n}: {o.verdict.line()}, waited {o.served_s} s, refused"
                             f" {o.refusals}" for n, o in outcome.items())  # fmt: skip
            print(f"# {scenario} run {i + 1}: {line}", flush=True)
    print()
    print("\n".join(table(results)))
    print(f"\n# loadavg after: {os.getloadavg()[0]:.2f}")
    bad = [o for runs in results.values() for r in runs for o in [r["default"]] if not o.verdict.ok]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

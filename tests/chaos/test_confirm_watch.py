"""The soak's credit for time in which the fleet could acknowledge no write.

What this proves: :class:`redis_faults.ConfirmWatch` finds a window in which a Sentinel
group takes writes but confirms none the way the fleet's are (one replica of two
stalled, as a failed-over primary is while it syncs from the promoted one), from its
start to its end, and none while the group is whole; and the settle check's credit
(``soak._overlap``) counts time covered by overlapping windows once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from redis_faults import ConfirmWatch, SentinelRedis
from soak import _overlap


class Outages:
    """The part of the soak's harness the watch uses: where outages go."""

    def __init__(self) -> None:
        self.recorded: list[tuple[float, float]] = []

    def record_outage(self, down: float, up: float) -> None:
        self.recorded.append((down, up))


def test_overlapping_windows_are_credited_once() -> None:
    assert _overlap(0, 10, [(1, 3), (2, 4)]) == 3
    assert _overlap(0, 10, [(1, 6), (2, 4), (5, 7)]) == 6
    assert _overlap(2, 5, [(0, 3), (4, 9)]) == 2
    assert _overlap(0, 10, []) == 0
    assert _overlap(5, 6, [(0, 1), (7, 8)]) == 0


@pytest.mark.slow
def test_a_stalled_replica_is_a_window_without_confirmed_writes(tmp_path: Path) -> None:
    topology = SentinelRedis(tmp_path)
    topology.start()
    harness = Outages()
    watch = ConfirmWatch(topology, harness)  # type: ignore[arg-type]
    try:
        watch.start()
        time.sleep(1.0)  # the group whole: the watch's writes confirmed
        assert watch.windows == []
        primary = topology.group.master_port()
        replica = next(n for n in topology.group.data_nodes if n.port != primary)
        assert replica.pid is not None
        stalled = time.time()
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            # 3 s: longer than a confirmation's wait (2 s), shorter than the sentinels'
            # down-after (5 s), so they keep it promotable and every write waits for it
            time.sleep(3.0)
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        thawed = time.time()
        deadline = time.monotonic() + 15
        while not watch.windows and time.monotonic() < deadline:
            time.sleep(0.1)  # a poll with a deadline: the window closes once a write passes
    finally:
        watch.stop(5)
        topology.stop()
    assert len(watch.windows) == 1, watch.windows
    (down, up) = watch.windows[0]
    assert stalled - 0.5 <= down <= stalled + 1.0, down - stalled
    assert up >= thawed, up - thawed
    assert harness.recorded == watch.windows

"""A renewer thread is woken by a lease added only when that lease is due before its wait
ends (vmpool/state/renewer_sleep.py).

Each lock a batch job takes is added to the process's LockRenewer (and each clone slot
held through a create to the lease keeper). Waking the thread at every add cost a thread
switch per lease for nothing: its leases are all renewed every same period, so the one
added is due last. These tests prove the thread sleeps through such adds, and that a
lease due sooner still wakes it and is renewed on time.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from vmpool.state.lock_renewer import LockRenewer
from vmpool.state.renewer_sleep import RenewerSleep

from storehelp import wait_until


class Lease:
    """A Renewable that counts its renewals."""

    def __init__(self, key: str, every_s: float) -> None:
        self.key = key
        self.every_s = every_s
        self.renewed = threading.Event()

    def renew_every_s(self) -> float:
        return self.every_s

    def _renew(self) -> bool:
        self.renewed.set()
        return True


def counted_waits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RenewerSleep, float | None]]:
    """Record each wait a renewer thread starts (each wake-up starts another), with the
    sleep it is of: another test's renewer, still running in this process, waits too."""
    waits: list[tuple[RenewerSleep, float | None]] = []
    real = RenewerSleep.wait

    def counting(self: RenewerSleep, timeout: float | None) -> None:
        waits.append((self, timeout))
        real(self, timeout)

    monkeypatch.setattr(RenewerSleep, "wait", counting)
    return waits


def asleep(renewer: Any) -> bool:
    return bool(math.isfinite(renewer._sleep._until))


def test_leases_due_after_the_wait_do_not_wake_the_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: 50 leases added while the thread sleeps until the first one is due start
    no new wait (a notify per add, as before, woke it 50 times)."""
    waits = counted_waits(monkeypatch)
    renewer = LockRenewer()

    def mine() -> list[float | None]:
        return [timeout for sleep, timeout in waits if sleep is renewer._sleep]

    renewer.add(Lease("first", 30.0))
    wait_until(lambda: asleep(renewer), timeout=5)
    before = len(mine())
    leases = [Lease(f"lock-{i}", 30.0) for i in range(50)]
    for lease in leases:
        renewer.add(lease)
    time.sleep(0.2)  # room for any wake-up to show; none is expected
    assert len(mine()) == before, mine()[before:]
    for lease in leases:
        renewer.remove(lease)


def test_a_lease_due_sooner_wakes_the_thread_and_is_renewed_on_time() -> None:
    """Proves: a lease due before the thread's wait ends is renewed when due, not at the
    end of the wait (30 s away here)."""
    renewer = LockRenewer()
    renewer.add(Lease("slow", 30.0))
    wait_until(lambda: asleep(renewer), timeout=5)
    fast = Lease("fast", 0.05)
    renewer.add(fast)
    assert fast.renewed.wait(5)
    renewer.remove(fast)

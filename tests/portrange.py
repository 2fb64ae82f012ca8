"""Each pytest-xdist worker's range of ports (``VMPOOL_PORT_RANGE``), so that servers
started by two workers never pick the same port.

``vmpool.local.redis_server.free_port`` hands out the ports of ``VMPOOL_PORT_RANGE``
("LOW-HIGH", HIGH excluded), and the processes a test starts inherit it. The run's range
is the one the environment gives, else :data:`DEFAULT_RANGE`, below the ephemeral range
(32768-60999) that clients' outgoing connections take from. Each xdist worker takes its
own equal slice of the range it inherited from the controller: the controller sets the
run's range in its environment before it starts the workers, so a worker that only kept
a range already set would share the controller's with every other worker.
"""

from __future__ import annotations

import os
from typing import Any, Final

import pytest

PORT_RANGE_ENV: Final = "VMPOOL_PORT_RANGE"
DEFAULT_RANGE: Final = "10000-32000"


def worker_number() -> int:
    """This process's pytest-xdist worker number (``gw2``: 2); 0 when not under xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name.removeprefix("gw")) if name.startswith("gw") else 0


def worker_range(bounds: str, worker: int, count: int) -> str:
    """Slice ``worker`` of ``count`` equal slices of ``bounds`` ("LOW-HIGH")."""
    try:
        low, high = (int(x) for x in bounds.split("-", 1))
    except ValueError:
        raise pytest.UsageError(f"{PORT_RANGE_ENV}: {bounds!r} is not LOW-HIGH") from None
    size = (high - low) // count
    if size < 1:
        raise pytest.UsageError(f"{PORT_RANGE_ENV}: {bounds} is too small for {count} workers")
    start = low + size * worker
    return f"{start}-{start + size}"


def pytest_configure(config: Any) -> None:
    bounds = os.environ.get(PORT_RANGE_ENV) or DEFAULT_RANGE
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if os.environ.get("PYTEST_XDIST_WORKER") and count:
        bounds = worker_range(bounds, worker_number(), count)
    os.environ[PORT_RANGE_ENV] = bounds

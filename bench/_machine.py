"""The machine line a benchmark prints before its table (a helper, not a benchmark).

One spelling for every benchmark, so that bench/run_all.py's output reads alike: the
cores, the versions that move the figures, the Redis server and its allocator when the
benchmark runs one, the benchmark's own settings, and the load average when it starts.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

import redis
import rq

__all__ = ["machine_line", "server_version"]


def server_version(url: str) -> str:
    """The version the Redis server at ``url`` reports (``INFO server``)."""
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def machine_line(
    settings: Mapping[str, object] | None = None, *, server: str = "", allocator: str = ""
) -> str:
    """``# nproc=… python=… rq=… redis-py=… [redis-server=… malloc=…] <settings> loadavg=…``.

    ``server``: the Redis server's version (:func:`server_version`), when the benchmark
    runs one; ``allocator``: the malloc it runs on (``RedisServer.allocator``).
    ``settings``: the benchmark's own, as ``key=value`` in the order given."""
    parts = [
        f"nproc={os.cpu_count()}",
        f"python={platform.python_version()}",
        f"rq={rq.__version__}",
        f"redis-py={redis.__version__}",
    ]
    if server:
        parts.append(f"redis-server={server}")
    if allocator:
        parts.append(f"malloc={allocator}")
    parts += [f"{key}={value}" for key, value in (settings or {}).items()]
    parts.append(f"loadavg={os.getloadavg()[0]:.2f}")
    return "# " + " ".join(parts)

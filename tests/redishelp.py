"""Helpers shared by the tests that count what a client sends to Redis."""

from __future__ import annotations

from typing import Any

import redis


class RoundTrips:
    """Counts client writes (round trips) on every connection of the pools it built."""

    def __init__(self) -> None:
        self.count = 0
        counter = self

        class Counting(redis.Connection):
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                counter.count += 1
                super().send_packed_command(command, check_health)

        self.connection_class = Counting

    def client(self, url: str, *, decode: bool) -> redis.Redis:
        pool = redis.ConnectionPool.from_url(
            url, connection_class=self.connection_class, decode_responses=decode
        )
        return redis.Redis(connection_pool=pool)

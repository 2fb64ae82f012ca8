"""The store's reads as pipeline steps, the trail read, and the store's record reads.

A read queues its commands on any pipeline (sync or asyncio, so the API can await them
on its loop), then builds the records from the replies. A read of several keys is one
pipeline, not a round trip per key.

:class:`RecordReads`, which :class:`~vmpool.state.store.Store` carries, runs them on
the store's own client. The API's hot GET paths run them on a redis.asyncio pipeline.
Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from vmpool.state.keys import Keys
from vmpool.state.records import (
    AuditEntry,
    RequestRecord,
    VMRecord,
    decode_hash,
    decode_stream_trail,
    decode_trail,
    text,
)

__all__ = [
    "RecordReads",
    "hostnames_by_alias",
    "queue_request",
    "queue_vms",
    "request_from",
    "time_from",
    "trail",
    "vms_from",
]


def queue_request(pipe: Any, keys: Keys, request_id: str) -> None:
    """Queue a request's hash and VM set (two replies: :func:`request_from`).

    Run in a MULTI/EXEC pipeline, the two are one snapshot.
    """
    pipe.hgetall(keys.request(request_id))
    pipe.smembers(keys.request_vms(request_id))


def request_from(raw: Any, names: Any) -> RequestRecord | None:
    if not raw:
        return None
    return RequestRecord.from_hash(decode_hash(raw), (text(n) for n in names))


def queue_vms(pipe: Any, keys: Keys, names: Iterable[str]) -> None:
    """The hashes of the VMs ``names``, one reply each (:func:`vms_from`)."""
    for name in names:
        pipe.hgetall(keys.vm(name))


def vms_from(replies: Iterable[Any]) -> list[VMRecord]:
    """The VMs of :func:`queue_vms`'s replies. A VM gone (no hash) is left out."""
    return [VMRecord.from_hash(decode_hash(raw)) for raw in replies if raw]


def time_from(reply: Sequence[Any]) -> float:
    """Redis' TIME reply (seconds, microseconds) as seconds."""
    seconds, micros = reply
    return float(seconds) + float(micros) / 1e6


def hostnames_by_alias(vms: Iterable[VMRecord]) -> dict[str, list[str]]:
    """Hostnames (FQDN) of a request's attached VMs, by the alias asked for."""
    by_alias: dict[str, list[str]] = {}
    for vm in vms:
        # a VM given back (DELETE /vm/<host>) stays listed, as vmpooler lists it
        if vm.state == "running" or vm.given_back:
            by_alias.setdefault(vm.alias, []).append(vm.hostname)
    return {alias: sorted(names) for alias, names in by_alias.items()}


def trail(client: redis.Redis, key: str) -> list[AuditEntry]:
    """A trail, oldest first (a request's or a warm-pool VM's).

    A list of packed entries, or the stream an older release wrote
    (``records.decode_trail`` / ``decode_stream_trail``).
    """
    try:
        return decode_trail(client.lrange(key, 0, -1) or [])
    except redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
    return decode_stream_trail(client.xrange(key) or [])


class RecordReads:
    """The request and VM reads of a store with ``redis`` and ``keys``."""

    redis: redis.Redis
    keys: Keys

    def server_time(self) -> float:
        return time_from(self.redis.time())

    def get_request(self, request_id: str) -> RequestRecord | None:
        pipe = self.redis.pipeline(transaction=True)
        queue_request(pipe, self.keys, request_id)
        raw, names = pipe.execute()
        return request_from(raw, names)

    def get_vm(self, name: str) -> VMRecord | None:
        raw = self.redis.hgetall(self.keys.vm(name))
        return VMRecord.from_hash(decode_hash(raw)) if raw else None

    def vm_at_address(self, address: str) -> str | None:
        """The name of the VM that last turned ready with this cloud address, if any."""
        raw = self.redis.hget(self.keys.addresses, address)
        return None if raw is None else text(raw)

    def get_vms(self, names: Iterable[str]) -> list[VMRecord]:
        names = list(names)
        if not names:
            return []
        pipe = self.redis.pipeline(transaction=False)
        queue_vms(pipe, self.keys, names)
        return vms_from(pipe.execute())

    def request_vms(self, request_id: str) -> list[VMRecord]:
        names = self.redis.smembers(self.keys.request_vms(request_id))
        return self.get_vms(sorted(text(n) for n in names))

    def hostnames(self, request_id: str) -> dict[str, list[str]]:
        """Hostnames (FQDN) of the VMs attached to the request, by the alias asked for."""
        return hostnames_by_alias(self.request_vms(request_id))

    def history(self, request_id: str) -> list[AuditEntry]:
        """A request's trail, oldest first."""
        return trail(self.redis, self.keys.request_audit(request_id))

    def due_for_expiry(self, limit: int = 1000, now: float | None = None) -> list[str]:
        """Pending requests whose time is up (the script re-checks each one).

        Read by score range: the cost follows the number due, not the number open.
        """
        now = self.server_time() if now is None else now
        ids = self.redis.zrangebyscore(self.keys.open_requests, "-inf", now, start=0, num=limit)
        return [text(i) for i in ids]

    def open_requests(self, limit: int | None = None) -> list[str]:
        end = -1 if limit is None else limit - 1
        return [text(i) for i in self.redis.zrange(self.keys.open_requests, 0, end)]

    def provision_candidates(self, limit: int = 1000) -> list[str]:
        """Requests with unreserved slots, oldest first."""
        ids = self.redis.zrange(self.keys.provision_queue, 0, limit - 1)
        return [text(i) for i in ids]

"""The store's reads as pipeline steps, and the trail read.

A read queues its commands on any pipeline (sync or asyncio, so the API can await them
on its loop), then builds the records from the replies. A read of several keys is one
pipeline, not a round trip per key.

:class:`~vmpool.state.store.Store` runs them on its own client. The API's hot GET paths
run them on a redis.asyncio pipeline.
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

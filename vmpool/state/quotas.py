"""Quotas per user and the line of service, in Redis.

The counting is in the store's scripts (``scripts/_quota.lua``, prepended to every one):
each VM whose record names a user (``quota_user``) counts for that user while it is
reserved, booting or running, added and taken away in the unit of the move that starts
or ends it. So the count is exact however many API processes and workers reserve and
free VMs at once, as the provider capacity's is (:mod:`vmpool.state.capacity`). The
limits are the caller's (the config of the process that asks: :class:`QuotaLimits`),
checked in the same units: ``reserve_vm``, ``claim_for_request``, ``checkout``, and
``quota_park`` (a request over quota waits, parked, until one of its user's VMs is
freed). Their keys are rendered into the scripts with the metric keys
(:func:`vmpool.state.counters.lua_quota_keys`).

:class:`QuotaStore` is the store's part for them (``Store.quotas``): a request parked,
a request read with its place in line (position and ETA, ``scripts/request_place.lua``:
:class:`Standing`), and the counts read for the audit, the metrics and the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from vmpool.ids import validate_request_id
from vmpool.state.counters import lua_quota_keys
from vmpool.state.keys import Keys
from vmpool.state.lua import ScriptCall, read_script
from vmpool.state.lua_deps import prune
from vmpool.state.records import Outcome, RequestRecord, VMRecord, text, texts
from vmpool.state.store_scripts import StoreScripts

__all__ = ["NO_LIMITS", "Held", "Place", "QuotaLimits", "QuotaStore", "Standing"]

_PACKAGE = "vmpool.state.scripts"


@dataclass(frozen=True)
class QuotaLimits:
    """The quota a call is checked against: None for no limit.

    ``cores``: the cores of one VM of each pool (a pool not named counts 1).
    """

    max_vms: int | None = None
    max_cores: int | None = None
    cores: Mapping[str, int] | None = None

    def argv(self) -> list[str]:
        """max_vms, max_cores ('' for none) and the cores per pool ("pool=n,...")."""
        per_pool = ",".join(f"{pool}={int(n)}" for pool, n in sorted((self.cores or {}).items()))
        return [_limit(self.max_vms), _limit(self.max_cores), per_pool]

    def cores_of(self, pool: str) -> int:
        return int((self.cores or {}).get(pool, 1))


NO_LIMITS = QuotaLimits()


def _limit(value: int | None) -> str:
    return "" if value is None else str(int(value))


@dataclass(frozen=True)
class Held:
    """What a user holds now (VMs, cores) and the most they ever held at once."""

    vms: int
    cores: int
    peak_vms: int
    peak_cores: int


@dataclass(frozen=True)
class Place:
    """Where a pending request stands: ``position`` (0: being provisioned) and ``eta_s``
    (None while it waits for its user's quota)."""

    position: int
    eta_s: float | None

    def fields(self) -> dict[str, Any]:
        """``position`` and ``eta_s`` (seconds to a tenth, null while parked) as the API
        and ``vmpool request get`` show them."""
        eta = None if self.eta_s is None else round(self.eta_s, 1)
        return {"position": self.position, "eta_s": eta}

    @classmethod
    def from_reply(cls, reply: Any) -> Place | None:
        """The script's reply; None for a request that is not pending."""
        if len(reply) < 5:
            return None
        eta = text(reply[4])
        return cls(int(reply[3]), float(eta) if eta else None)


@dataclass(frozen=True)
class Standing:
    """A request as one read found it (one snapshot: ``scripts/request_place.lua``): its
    ``record`` (None: no such request), once it is ready its VMs (``vms``, a VM gone
    left out) and, while it is pending, its ``place`` in line."""

    record: RequestRecord | None
    place: Place | None
    vms: tuple[VMRecord, ...] = ()

    @classmethod
    def from_reply(cls, reply: Any) -> Standing:
        """The script's reply: ``{hash, vms, ready_vms[, position, eta]}``."""
        flat = texts(reply[0])
        if not flat:
            return cls(None, None)
        record = RequestRecord.from_hash(_pairs(flat), texts(reply[1]))
        vms = tuple(VMRecord.from_hash(_pairs(texts(raw))) for raw in reply[2] if raw)
        return cls(record, Place.from_reply(reply), vms)


def _pairs(flat: list[str]) -> dict[str, str]:
    """An HGETALL's flat reply (as a script returns it) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


class QuotaStore:
    """The quotas' part of the store (``Store.quotas``), usable on its own."""

    def __init__(
        self, redis_client: redis.Redis, keys: Keys, scripts: StoreScripts | None = None
    ) -> None:
        self.redis = redis_client
        self.keys = keys
        self.scripts = scripts or StoreScripts(redis_client, keys)
        # Of the keys and the line's functions, those the read reaches (lua_deps.prune).
        head = lua_quota_keys(keys) + read_script(_PACKAGE, "_line.lua")
        body = read_script(_PACKAGE, "request_place.lua")
        self._place = redis_client.register_script(prune(head, body) + body)

    @property
    def place_script(self) -> Script:
        """The script of :meth:`read_placed` (for :func:`~vmpool.state.lua.load_missing`)."""
        return self._place

    # -- a request over quota ---------------------------------------------------------
    def park(self, request_id: str, limits: QuotaLimits, *, actor: str) -> Outcome:
        """The request waits for its user's quota (``parked``), or ``quota_free``: it fits
        now (try again). No transition: it stays pending, at its place in line."""
        keys = self.keys.request_script_keys(request_id)
        reply = self.scripts.run("quota_park", keys, actor, request_id, limits.argv())
        return Outcome.from_reply(reply)

    # -- where a request stands -------------------------------------------------------
    def place_call(self, request_id: str, clone_limit: int) -> ScriptCall:
        """The read of a request and its place in line (:meth:`Standing.from_reply`), to
        run alone or in a pipeline."""
        request = self.keys.request(validate_request_id(request_id))
        keys = [request, self.keys.provision_queue, self.keys.request_vms(request_id)]
        args = [request_id, self.keys.pool_state_prefix(), int(clone_limit), self.keys.vm_prefix()]
        return ScriptCall(self._place, keys, args)

    def standing(self, request_id: str, clone_limit: int) -> Standing:
        """The request and, while it is pending, where it stands (one round trip)."""
        return Standing.from_reply(self.place_call(request_id, clone_limit).run())

    def place(self, request_id: str, clone_limit: int) -> Place | None:
        """Where a pending request stands (None when it is not pending)."""
        return self.standing(request_id, clone_limit).place

    # -- reads --------------------------------------------------------------------------
    def held(self) -> dict[str, Held]:
        """Every user counted now or ever (by peak), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for key in (self.keys.quota_vms, self.keys.quota_cores, self.keys.quota_peak):
            pipe.hgetall(key)
        vms, cores, peaks = (_ints(raw) for raw in pipe.execute())
        users = set(vms) | set(cores) | {f.split(":", 1)[1] for f in peaks if ":" in f}
        return {
            user: Held(
                vms.get(user, 0),
                cores.get(user, 0),
                peaks.get(f"vms:{user}", 0),
                peaks.get(f"cores:{user}", 0),
            )
            for user in sorted(users)
        }

    def parked(self) -> dict[str, str]:
        """Request id -> user, for each request waiting for its user's quota."""
        raw = self.redis.hgetall(self.keys.quota_parked)
        return {text(k): text(v) for k, v in raw.items()}

    def parked_among(self, request_ids: Iterable[str]) -> set[str]:
        """Which of ``request_ids`` are parked (one round trip)."""
        ids = list(request_ids)
        if not ids:
            return set()
        found = self.redis.hmget(self.keys.quota_parked, ids)
        return {rid for rid, user in zip(ids, found, strict=True) if user is not None}

    def waits(self) -> dict[str, int]:
        """User -> requests that ever waited for the user's quota (each once)."""
        return _ints(self.redis.hgetall(self.keys.quota_waits_metric))


def _ints(raw: Mapping[Any, Any]) -> dict[str, int]:
    return {text(k): int(float(text(v))) for k, v in raw.items()}

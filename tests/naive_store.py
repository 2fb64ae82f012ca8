"""THE REFERENCE OF THE BUG — not vmpool's store. Never import this outside tests.

A deliberately naive store with vmpooler 3.9's shape: each operation reads the request
and VM records, decides in Python, then writes (HSET status, index moves, an audit
entry numbered from the version it read). It has every guard the seed PR added
(readiness before expiry, terminal requests are not resurrected, a failed request is
not deleted), but each guard runs on what was *read*, in an earlier round trip than the
write: that gap is the whole bug (docs/why-vmpool.md). It
has no fencing either: vmpooler only had in-process mutexes, so ``fence`` is accepted
and ignored.

Each operation exists in two shapes:

- ``begin_<op>(...)`` runs the read phase and returns a :class:`TwoPhase` whose
  ``commit()`` runs the write phase later. The model-based test
  (tests/test_model.py) interleaves other actors' steps in between.
- ``<op>(...)`` runs both phases with ``gap()`` in between: the multi-process race test
  (tests/test_store_race.py) passes a barrier there so that concurrent operations
  interleave deterministically, as vmpooler's manager threads and API process do.

Both shapes run the same code: each operation is one generator that yields exactly
once, between its reads and its writes. The same tests pointed at ``vmpool.state.store``
pass; pointed at this, they find the seed's races. It shares vmpool's key schema and
audit format so one checker judges both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator

import redis

from vmpool.state.keys import Keys
from vmpool.state.records import Outcome
from vmpool.state.store import Store

Phases = Generator[None, None, Outcome]


class TwoPhase:
    """One operation split at its gap: constructing it runs the read phase;
    ``commit()`` runs the write phase and returns the outcome; ``abandon()`` drops it
    (the process died between the two)."""

    def __init__(self, phases: Phases) -> None:
        self._phases = phases
        next(phases)  # the read phase, up to the gap

    def commit(self) -> Outcome:
        try:
            next(self._phases)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        raise RuntimeError("a two-phase operation yields exactly once")

    def abandon(self) -> None:
        self._phases.close()


class NaiveStore:
    FENCED = False  # vmpooler has no fencing tokens: a paused thread writes anyway

    def __init__(
        self, client: redis.Redis, keys: Keys, gap: Callable[[], None] = lambda: None
    ) -> None:
        self.redis = client
        self.keys = keys
        self.gap = gap
        self._real = Store(client, keys)  # for reads and for setting up requests only

    # -- plumbing ---------------------------------------------------------------------
    def _now(self) -> float:
        return self._real.server_time()

    def _audit(self, rid: str, version: int, entity: str, src: str, dst: str, why: str) -> None:
        # the version written is the one read plus one: two racing writers both write it
        self.redis.hset(self.keys.request(rid), "version", version)
        self.redis.rpush(  # the trail's packed form (records.decode_trail)
            self.keys.request_audit(rid),
            json.dumps([entity, src, dst, version, "naive", why, f"{self._now():.6f}"]),
        )

    def _release(self, rid: str, version: int, why: str) -> int:
        for name in self.redis.smembers(self.keys.request_vms(rid)):
            state = self.redis.hget(self.keys.vm(name), "state")
            if state in ("reserved", "pending", "running"):
                self.redis.hset(self.keys.vm(name), "state", "completed")
                version += 1
                self._audit(rid, version, f"vm:{name}", str(state), "completed", why)
        return version

    def _sync(self, phases: Phases) -> Outcome:
        op = TwoPhase(phases)
        self.gap()
        return op.commit()

    # -- the operations, each one generator: reads, yield (the gap), writes ----------
    def _vm_ready(self, name: str) -> Phases:
        vm = self.redis.hgetall(self.keys.vm(name))
        rid = vm["request_id"]
        req = self.redis.hgetall(self.keys.request(rid))
        yield
        version = int(req["version"])
        if vm["state"] != "pending":
            return Outcome(False, "vm_" + vm["state"])
        if req["status"] != "pending":  # the PR's guard: never resurrect a terminal request
            self.redis.hset(self.keys.vm(name), "state", "completed")
            self._audit(rid, version + 1, f"vm:{name}", "pending", "completed", "terminal")
            return Outcome(True, "completed")
        self.redis.hset(self.keys.vm(name), "state", "running")
        self._audit(rid, version + 1, f"vm:{name}", "pending", "running", "ready")
        have = self.redis.hincrby(self.keys.request(rid), "have", 1)
        if have >= int(req["need"]):
            self.redis.hset(self.keys.request(rid), "status", "ready")  # unchecked: the bug
            self._audit(rid, version + 2, "request", "pending", "ready", "all VMs ready")
            return Outcome(True, "fulfilled")
        return Outcome(True, "running")

    def _expire_request(self, rid: str) -> Phases:
        req = self.redis.hgetall(self.keys.request(rid))
        now = self._now()
        yield
        if req.get("status") != "pending" or now < float(req["fail_at"]):
            return Outcome(False, "not_expired")
        version = int(req["version"]) + 1
        if int(req.get("have", 0)) >= int(req["need"]):  # the PR: readiness before expiry
            self.redis.hset(self.keys.request(rid), "status", "ready")
            self._audit(rid, version, "request", "pending", "ready", "all VMs ready")
            return Outcome(True, "fulfilled")
        self.redis.hset(self.keys.request(rid), "status", "failed")
        self._audit(rid, version, "request", "pending", "failed", "ttl")
        self._release(rid, version, "request failed")
        return Outcome(True, "failed")

    def _delete_request(self, rid: str) -> Phases:
        req = self.redis.hgetall(self.keys.request(rid))
        yield
        if req.get("status") == "deleted":
            return Outcome(False, "already_deleted")
        if req.get("status") == "failed":
            return Outcome(False, "request_failed")
        self.redis.hset(self.keys.request(rid), "status", "deleted")
        version = int(req["version"]) + 1
        self._audit(rid, version, "request", str(req["status"]), "deleted", "deleted")
        self._release(rid, version, "request deleted")
        return Outcome(True, "deleted")

    def _vm_failed(self, name: str, reason: str, permanent: bool) -> Phases:
        vm = self.redis.hgetall(self.keys.vm(name))
        rid = vm["request_id"]
        req = self.redis.hgetall(self.keys.request(rid))
        yield
        if vm["state"] not in ("reserved", "pending"):
            return Outcome(False, "vm_" + vm["state"])
        self.redis.hset(self.keys.vm(name), "state", "completed")
        version = int(req["version"]) + 1
        self._audit(rid, version, f"vm:{name}", vm["state"], "completed", reason)
        if req["status"] != "pending":
            return Outcome(True, "completed")
        retries = self.redis.hincrby(self.keys.request(rid), "retries", 1)
        if permanent or retries > int(req["max_retries"]):
            self.redis.hset(self.keys.request(rid), "status", "failed")
            self._audit(rid, version + 1, "request", str(req["status"]), "failed", "retries")
            return Outcome(True, "request_failed")
        return Outcome(True, "retry")

    # -- two-phase entry points (the model-based test) ----------------------------------
    def begin_vm_ready(self, name: str, *, actor: str, fence: int | None = None) -> TwoPhase:
        return TwoPhase(self._vm_ready(name))

    def begin_expire_request(self, rid: str, *, actor: str) -> TwoPhase:
        return TwoPhase(self._expire_request(rid))

    def begin_delete_request(self, rid: str, *, actor: str, user: str = "") -> TwoPhase:
        return TwoPhase(self._delete_request(rid))

    def begin_vm_failed(
        self,
        name: str,
        reason: str,
        *,
        actor: str,
        permanent: bool = False,
        fence: int | None = None,
    ) -> TwoPhase:
        return TwoPhase(self._vm_failed(name, reason, permanent))

    # -- one-call entry points, gap() between the phases (the race test) ----------------
    def vm_ready(self, name: str, *, actor: str, fence: int | None = None) -> Outcome:
        return self._sync(self._vm_ready(name))

    def expire_request(self, rid: str, *, actor: str) -> Outcome:
        return self._sync(self._expire_request(rid))

    def delete_request(self, rid: str, *, actor: str, user: str = "") -> Outcome:
        return self._sync(self._delete_request(rid))

    def vm_failed(
        self,
        name: str,
        reason: str,
        *,
        actor: str,
        permanent: bool = False,
        fence: int | None = None,
    ) -> Outcome:
        return self._sync(self._vm_failed(name, reason, permanent))


def naive_checkout(
    client: redis.Redis, keys: Keys, counts: dict[str, int], gap: Callable[[], None]
) -> list[str]:
    """vmpooler's checkout (api/v3.rb atomically_allocate_vms): each VM taken from its
    pool's ready set by its own atomic move (vmpooler's SMOVE), pool after pool, and the
    VMs already taken put back when a later pool is empty (return_vm_to_ready_state).
    Each move is atomic; the whole is not: between two moves, and before the put-back
    (``gap``), other clients see a partial claim. Returns the VMs handed out ([] for
    vmpooler's 503)."""
    taken: list[tuple[str, str, float]] = []
    for pool, n in counts.items():
        ready = keys.pool_state(pool, "ready")
        for _ in range(n):
            gap()
            popped = client.zpopmin(ready)
            if not popped:
                gap()  # vmpooler puts the VMs back in a later loop, round trips later
                for p, name, score in taken:  # put back what was taken
                    client.zadd(keys.pool_state(p, "ready"), {name: score})
                return []
            name, score = popped[0]
            taken.append((pool, name if isinstance(name, str) else name.decode(), score))
    return [name for _, name, _ in taken]

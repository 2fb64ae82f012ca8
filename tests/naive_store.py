"""THE REFERENCE OF THE BUG — not vmpool's store. Never import this outside tests.

A deliberately naive store with vmpooler 3.9's shape: each operation reads the request
and VM records, decides in Python, then writes (HSET status, SMOVE-like index moves, an
audit entry numbered from the version it read). Between the read and the write it calls
``gap()``: the race tests pass a barrier there so that concurrent operations interleave
deterministically, exactly as vmpooler's manager threads and API process do (see
../shared/seed/vmpooler-ondemand-race-pr.txt). The same tests pointed at ``vmpool.store``
pass; pointed at this, they find the seed's races.

It shares vmpool's key schema and audit format so one checker judges both.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from vmpool.keys import Keys
from vmpool.store import Outcome, Store


class NaiveStore:
    def __init__(self, client: redis.Redis, keys: Keys, gap: Callable[[], None]) -> None:
        self.redis = client
        self.keys = keys
        self.gap = gap
        self._real = Store(client, keys)  # for reads and for setting up requests only

    def _now(self) -> float:
        return self._real.server_time()

    def _audit(self, rid: str, version: int, entity: str, src: str, dst: str, why: str) -> None:
        # the version written is the one read plus one: two racing writers both write it
        self.redis.hset(self.keys.request(rid), "version", version)
        self.redis.xadd(
            self.keys.request_audit(rid),
            {"entity": entity, "from": src, "to": dst, "version": version,
             "actor": "naive", "reason": why, "time": self._now()},
        )

    def _release(self, rid: str, version: int, why: str) -> int:
        for name in self.redis.smembers(self.keys.request_vms(rid)):
            state = self.redis.hget(self.keys.vm(name), "state")
            if state in ("reserved", "pending", "running"):
                self.redis.hset(self.keys.vm(name), "state", "completed")
                version += 1
                self._audit(rid, version, f"vm:{name}", str(state), "completed", why)
        return version

    def vm_ready(self, name: str, *, actor: str) -> Outcome:
        vm = self.redis.hgetall(self.keys.vm(name))
        rid = vm["request_id"]
        req = self.redis.hgetall(self.keys.request(rid))
        self.gap()
        version = int(req["version"])
        if vm["state"] != "pending":
            return Outcome(False, "vm_" + vm["state"])
        if req["status"] in ("failed", "deleted"):
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

    def expire_request(self, rid: str, *, actor: str) -> Outcome:
        req = self.redis.hgetall(self.keys.request(rid))
        now = self._now()
        self.gap()
        if req.get("status") != "pending" or now < float(req["fail_at"]):
            return Outcome(False, "not_expired")
        self.redis.hset(self.keys.request(rid), "status", "failed")
        version = int(req["version"]) + 1
        self._audit(rid, version, "request", "pending", "failed", "ttl")
        self._release(rid, version, "request failed")
        return Outcome(True, "failed")

    def delete_request(self, rid: str, *, actor: str, user: str = "") -> Outcome:
        req = self.redis.hgetall(self.keys.request(rid))
        self.gap()
        if req.get("status") == "deleted":
            return Outcome(False, "already_deleted")
        self.redis.hset(self.keys.request(rid), "status", "deleted")
        version = int(req["version"]) + 1
        self._audit(rid, version, "request", str(req["status"]), "deleted", "deleted")
        self._release(rid, version, "request deleted")
        return Outcome(True, "deleted")

    def vm_failed(self, name: str, reason: str, *, actor: str, permanent: bool = False) -> Outcome:
        vm = self.redis.hgetall(self.keys.vm(name))
        rid = vm["request_id"]
        req = self.redis.hgetall(self.keys.request(rid))
        self.gap()
        if vm["state"] not in ("reserved", "pending"):
            return Outcome(False, "vm_" + vm["state"])
        self.redis.hset(self.keys.vm(name), "state", "completed")
        version = int(req["version"]) + 1
        self._audit(rid, version, f"vm:{name}", vm["state"], "completed", reason)
        if req["status"] in ("failed", "deleted"):
            return Outcome(True, "completed")
        retries = self.redis.hincrby(self.keys.request(rid), "retries", 1)
        if permanent or retries > int(req["max_retries"]):
            self.redis.hset(self.keys.request(rid), "status", "failed")
            self._audit(rid, version + 1, "request", str(req["status"]), "failed", "retries")
            return Outcome(True, "request_failed")
        return Outcome(True, "retry")

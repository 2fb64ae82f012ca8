"""THE REFERENCE OF THE BUG — not vmpool.

The seed's design (vmpooler 3.9 plus the in-process mutex fix proposed for it,
docs/why-vmpool.md), as real processes, so that the chaos soak
(``soak.py --target seed-reference``) can show what it catches. Never used by vmpool.

- ``manager``: one manager replica. Threads as in vmpooler's pool_manager: an on-demand
  provisioner (pops the provisioning queue, reserves and clones VMs), the expiry sweep
  (``check_ondemand_requests_ready``: readiness before expiry, the PR's change 1), a
  pending check per VM per cycle in a fresh thread (``Thread.new``, ``_check_pending_vm``)
  and a destroy loop. The PR's ``request_mutex``: 256 striped ``threading.Lock`` per
  process around the sweep and the pending check, ``vm_mutex`` around the work on one
  VM. Both are in-process: the soak runs **two replicas**, as the PR warns nothing
  prevents.
- ``api``: vmpool's own HTTP app, whose DELETE is the seed's: read the request, decide,
  write (``HSET status deleted``, then release its VMs), vmpooler's api/v3.rb shape.

Every status write goes through ``tests/naive_store.py`` (the read-then-write reference:
the PR's guards, each checked on what was *read*, one round trip before the write) or,
for the steps it lacks (reserve, created, destroyed, releasing a failed request's VMs),
through the same read-then-write helpers below. ``gap`` is the time between a step's
reads and its writes: vmpooler does several Redis round trips and a log line there
(``move_pending_vm_to_ready``: HGET clone, HGETALL the request, HGET pool_alias, then a
pipelined write); we sleep a uniform 0..``REF_GAP_MS`` ms (default 10) to stand for them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
for _path in (str(HERE.parent),):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from vmpool.config import Config, load_config  # noqa: E402
from vmpool.providers import Provider, providers_from_config  # noqa: E402
from vmpool.state.keys import Keys  # noqa: E402
from vmpool.state.names import NameGenerator  # noqa: E402
from vmpool.state.store import Store  # noqa: E402

from naive_store import NaiveStore  # noqa: E402

ACTOR = "seed-reference"
STRIPES = 256


def gap_fn(rng: random.Random) -> Callable[[], None]:
    top_ms = float(os.environ.get("REF_GAP_MS", "10"))

    def gap() -> None:
        time.sleep(rng.uniform(0, top_ms) / 1000.0)

    return gap


class Reference:
    """The read-then-write steps the naive store lacks, in the same shape."""

    def __init__(self, client: redis.Redis, keys: Keys, gap: Callable[[], None]) -> None:
        self.redis = client
        self.keys = keys
        self.gap = gap
        self.store = Store(client, keys)  # reads only

    def audit(self, rid: str, version: int, entity: str, src: str, dst: str, why: str) -> None:
        # the steps the seed's fix is not about number their entries atomically, so that
        # the violations reported are the races of the naive store's steps, not ours
        version = int(self.redis.hincrby(self.keys.request(rid), "version", 1))
        self.redis.rpush(  # the trail's packed form (records.decode_trail)
            self.keys.request_audit(rid),
            json.dumps([entity, src, dst, version, ACTOR, why, f"{self.store.server_time():.6f}"]),
        )

    def reserve(self, rid: str, name: str, alias: str, pool: Any) -> bool:
        req = self.redis.hgetall(self.keys.request(rid))
        self.gap()
        if req.get("status") != "pending":
            return False
        now = self.store.server_time()
        domain = f".{pool.domain}" if pool.domain else ""
        self.redis.hset(
            self.keys.vm(name),
            mapping={
                "name": name,
                "request_id": rid,
                "alias": alias,
                "pool": pool.name,
                "template": pool.template,
                "provider": pool.provider,
                "hostname": name + domain,
                "state": "reserved",
                "state_since": now,
                "reserved_at": now,
                "attempt": 1,
            },
        )
        self.redis.sadd(self.keys.request_vms(rid), name)
        self.audit(rid, int(req["version"]) + 1, f"vm:{name}", "none", "reserved", "clone")
        return True

    def set_vm(self, name: str, src: tuple[str, ...], dst: str, why: str, **extra: Any) -> bool:
        vm = self.redis.hgetall(self.keys.vm(name))
        if not vm:
            return False
        rid = vm["request_id"]
        req = self.redis.hgetall(self.keys.request(rid))
        self.gap()
        if vm.get("state") not in src:
            return False
        self.redis.hset(
            self.keys.vm(name),
            mapping={"state": dst, "state_since": self.store.server_time(), **extra},
        )
        self.audit(rid, int(req.get("version", 0)) + 1, f"vm:{name}", vm["state"], dst, why)
        return True

    def release(self, rid: str, why: str) -> None:
        """vmpooler's remove_vms_for_failed_request: every live VM to completed."""
        for name in self.redis.smembers(self.keys.request_vms(rid)):
            self.set_vm(name, ("reserved", "pending", "running"), "completed", why)


class Manager:
    """One replica of the seed's manager."""

    def __init__(self, config: Config, url: str, seed: str) -> None:
        self.config = config
        self.redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=10, health_check_interval=5
        )
        self.keys = Keys(config.key_prefix)
        seed = f"{seed}:{os.getpid()}"  # a restarted replica draws new names
        self.rng = random.Random(seed)
        self.naive = NaiveStore(self.redis, self.keys, gap=gap_fn(random.Random(seed + "g")))
        self.ref = Reference(self.redis, self.keys, gap_fn(random.Random(seed + "r")))
        self.providers: dict[str, Provider] = dict(
            providers_from_config(self.redis, self.keys, config)
        )
        self.names = NameGenerator(config.hostname_prefix, random.Random(seed + "n"))
        self.request_mutex = [threading.Lock() for _ in range(STRIPES)]  # the PR's change 4
        self.vm_mutex = [threading.Lock() for _ in range(STRIPES)]
        self.checking: set[str] = set()
        self.checking_lock = threading.Lock()

    def _stripe(self, locks: list[threading.Lock], key: str) -> threading.Lock:
        return locks[zlib.crc32(key.encode()) % STRIPES]

    def run(self) -> None:
        loops = [self.provisioner, self.expiry_sweep, self.pending_loop, self.destroy_loop]
        threads = [threading.Thread(target=self._forever, args=(f,), daemon=True) for f in loops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _forever(self, step: Callable[[], None]) -> None:
        while True:
            try:
                step()
            except redis.RedisError as exc:  # vmpooler logs and carries on
                print(f"{step.__name__}: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(self.rng.uniform(0.5, 1.0))  # vmpooler's loop delay

    # -- provisioning -----------------------------------------------------------------
    def provisioner(self) -> None:
        while True:
            popped = self.redis.zpopmin(self.keys.provision_queue)
            if not popped:
                return
            rid = popped[0][0]
            self.provision(rid)

    def provision(self, rid: str) -> None:
        record = self.ref.store.get_request(rid)
        if record is None or record.status != "pending":
            return
        vms = {vm.name: vm for vm in self.ref.store.request_vms(rid)}
        for slot in record.slots:
            live = sum(
                1
                for vm in vms.values()
                if vm.alias == slot.alias
                and vm.pool == slot.pool
                and vm.state in ("reserved", "pending", "running")
            )
            pool = self.config.pools[slot.pool]
            for _ in range(slot.want - live):
                name = self.names()
                if self.ref.reserve(rid, name, slot.alias, pool):
                    threading.Thread(target=self.clone, args=(name, pool), daemon=True).start()

    def clone(self, name: str, pool: Any) -> None:
        provider = self.providers[pool.provider]
        with self._stripe(self.vm_mutex, name):
            try:
                provider.create_vm(pool.name, pool.template, name)
            except Exception as exc:
                self.vm_failed(name, f"create failed: {exc}")
                return
            self.ref.set_vm(
                name, ("reserved",), "pending", "created", created_at=self.ref.store.server_time()
            )

    def vm_failed(self, name: str, reason: str) -> None:
        outcome = self.naive.vm_failed(name, reason, actor=ACTOR)
        vm = self.ref.store.get_vm(name)
        if vm is None:
            return
        if outcome.code == "retry":
            self.redis.zadd(self.keys.provision_queue, {vm.request_id: time.time()})
        elif outcome.code == "request_failed":
            self.ref.release(vm.request_id, "request failed")

    # -- the expiry sweep: check_ondemand_requests_ready ----------------------------------
    def expiry_sweep(self) -> None:
        for rid in self.redis.zrange(self.keys.open_requests, 0, -1):
            with self._stripe(self.request_mutex, rid):
                status = self.redis.hget(self.keys.request(rid), "status")
                if status in ("failed", "deleted", "ready"):  # the PR's change 5
                    self.redis.zrem(self.keys.open_requests, rid)
                    continue
                # readiness first, then expiry; a failed request's VMs are released by it
                outcome = self.naive.expire_request(rid, actor=ACTOR)
                if outcome.ok:
                    self.redis.zrem(self.keys.open_requests, rid)

    # -- the pending check, one thread per VM per cycle --------------------------------------
    def pending_loop(self) -> None:
        for vm in self._vms(("reserved", "pending")):
            with self.checking_lock:
                if vm.name in self.checking:
                    continue
                self.checking.add(vm.name)
            threading.Thread(target=self._check_pending_vm, args=(vm.name,), daemon=True).start()

    def _check_pending_vm(self, name: str) -> None:
        try:
            vm = self.ref.store.get_vm(name)
            if vm is None:
                return
            pool = self.config.pools.get(vm.pool)
            timeout_s = pool.timeout_s if pool else self.config.timeout_s
            since = vm.created_at or vm.reserved_at or 0.0
            too_old = self.ref.store.server_time() - since > timeout_s
            if vm.state == "reserved":
                if too_old:  # a clone that died with its manager
                    with self._stripe(self.vm_mutex, name):
                        self.vm_failed(name, "clone never finished")
                return
            provider = self.providers[vm.provider]
            with self._stripe(self.vm_mutex, name):
                ready = provider.get_vm(vm.pool, name) is not None and provider.is_ready(
                    vm.pool, name
                )
                if ready:
                    # move_pending_vm_to_ready under the PR's request_mutex
                    with self._stripe(self.request_mutex, vm.request_id):
                        self.naive.vm_ready(name, actor=ACTOR)
                elif too_old:
                    self.vm_failed(name, "timeout")
        except redis.RedisError as exc:
            print(f"check_pending {name}: {type(exc).__name__}", flush=True)
        finally:
            with self.checking_lock:
                self.checking.discard(name)

    # -- destroying completed VMs -----------------------------------------------------------
    def destroy_loop(self) -> None:
        for vm in self._vms(("completed",)):
            provider = self.providers.get(vm.provider)
            if provider is None:
                continue
            with self._stripe(self.vm_mutex, vm.name):
                try:
                    provider.destroy_vm(vm.pool, vm.name)
                except Exception as exc:
                    print(f"destroy {vm.name}: {exc}", flush=True)
                    continue
                self.ref.set_vm(vm.name, ("completed",), "destroyed", "destroyed")

    def _vms(self, states: tuple[str, ...]) -> list[Any]:
        prefix = self.keys.vm_prefix()
        names = [
            k[len(prefix) :]
            for k in self.redis.scan_iter(match=self.keys.vm_pattern(), count=1000)
            if k.count(":") == 2
        ]
        return [vm for vm in self.ref.store.get_vms(names) if vm.state in states]


def api_app(config: Config, url: str, seed: str) -> Any:
    """vmpool's HTTP app with the seed's DELETE: read, decide, write, release."""
    from vmpool.api.app import create_app

    app = create_app(config, url)  # the seed's managers poll the provisioning queue
    st = app.state.vmpool
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
    keys = Keys(config.key_prefix)
    naive = NaiveStore(client, keys, gap=gap_fn(random.Random(seed + "api")))

    def delete_request(rid: str, *, actor: str, user: str = "") -> Any:
        if not client.exists(keys.request(rid)):
            from vmpool.state.records import Outcome

            return Outcome(False, "no_request")
        # api/v3.rb: HSET status deleted, then its VMs running -> completed (the naive
        # store's delete releases them, each on what it read)
        return naive.delete_request(rid, actor=actor, user=user)

    st.store.delete_request = delete_request  # the one route that writes state
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="THE REFERENCE OF THE BUG: not vmpool")
    sub = parser.add_subparsers(dest="what", required=True)
    api = sub.add_parser("api")
    api.add_argument("--port", type=int, required=True)
    manager = sub.add_parser("manager")
    manager.add_argument("--seed", default="1")
    args = parser.parse_args(argv)
    config = load_config(os.environ["VMPOOL_CONFIG"])
    url = os.environ["VMPOOL_REDIS_URL"]
    if args.what == "api":
        import uvicorn

        uvicorn.run(
            api_app(config, url, str(args.port)),
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
        )
        return 0
    Manager(config, url, args.seed).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The scripted burst of `vmpool up --demo`: a client's-eye run of the whole system.

It talks to the HTTP API like vmfloaty or ABS would (POST, poll GET, DELETE), with a
mix of requests: most on healthy pools, some deleted while their VMs boot, some on a
pool whose provider fails creates and boots. When every request has settled it
releases the ready ones, waits for their VMs to be destroyed, and reports: requests by
outcome, time to ready (p50/p95), VMs created and destroyed, and `vmpool audit`.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from vmpool.config import Config
from vmpool.local.supervisor import Supervisor
from vmpool.providers import providers_from_config
from vmpool.state.audit import CHECKED, Violation, audit_state
from vmpool.state.connection import connect
from vmpool.state.keys import Keys
from vmpool.state.store import Store
from vmpool.state.transitions import RequestStatus, VMState


@dataclass
class DemoRequest:
    request_id: str
    counts: dict[str, int]
    created_at: float
    delete_after_s: float | None = None
    outcome: RequestStatus = RequestStatus.PENDING  # as the client last saw it
    ready_after_s: float | None = None
    deleted_by_demo: bool = False


@dataclass
class DemoReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    time_to_ready_s: list[float] = field(default_factory=list)
    vms_created: int = 0
    vms_destroyed: int = 0
    violations: list[Violation] = field(default_factory=list)
    elapsed_s: float = 0.0
    # the pools whose provider fails on purpose, and the failed requests that asked them
    flaky_pools: list[str] = field(default_factory=list)
    failed_on_flaky: int = 0

    def percentile(self, p: float) -> float | None:
        data = sorted(self.time_to_ready_s)
        if not data:
            return None
        index = min(len(data) - 1, max(0, round(p / 100 * (len(data) - 1))))
        return data[index]

    def lines(self) -> list[str]:
        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}s"

        outcome_text = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        out = [
            "vmpool demo report",
            f"  requests:       {sum(self.outcomes.values())} ({outcome_text})",
            *self._failures(),
            f"  time to ready:  p50 {fmt(self.percentile(50))}, p95 {fmt(self.percentile(95))}",
            f"  VMs:            {self.vms_created} created, {self.vms_destroyed} destroyed",
            f"  elapsed:        {self.elapsed_s:.1f}s",
        ]
        if self.violations:
            out.append(f"  audit:          {len(self.violations)} violation(s)")
            out += [f"    {v.line()}" for v in self.violations]
        else:
            out.append(f"  audit:          clean (invariants {CHECKED} hold)")
        return out

    def _failures(self) -> list[str]:
        """Where the failed requests come from: the flaky pool fails on purpose."""
        failed = self.outcomes.get(RequestStatus.FAILED, 0)
        if not failed:
            return []
        lines = []
        if self.failed_on_flaky:
            lines.append(
                f"                  {self.failed_on_flaky} failed on purpose: they asked"
                f" {', '.join(self.flaky_pools)}, whose simulated cloud fails clones and boots"
            )
        if failed > self.failed_on_flaky:
            lines.append(
                f"                  {failed - self.failed_on_flaky} failed on a healthy pool:"
                " `vmpool request history <id>` says why"
            )
        return lines


class ApiClient:
    """The few calls of vmpooler's v3 on-demand API the demo needs (stdlib only)."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.base = base_url.rstrip("/") + "/api/v3"
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("X-AUTH-TOKEN", self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def create(self, counts: Mapping[str, int]) -> str:
        status, body = self._call("POST", "/ondemandvm", {k: str(v) for k, v in counts.items()})
        if status != 201 or not body.get("ok"):
            raise RuntimeError(f"POST /ondemandvm answered {status}: {body}")
        return str(body["request_id"])

    def get(self, request_id: str) -> tuple[int, dict[str, Any]]:
        return self._call("GET", f"/ondemandvm/{request_id}")

    def delete(self, request_id: str) -> tuple[int, dict[str, Any]]:
        return self._call("DELETE", f"/ondemandvm/{request_id}")


def plan_burst(
    pools: list[str], flaky_pools: list[str], rng: random.Random, total: int = 24
) -> list[tuple[dict[str, int], float | None]]:
    """(counts, delete_after_s) per request: a quarter deleted midway, a sixth flaky."""
    plan: list[tuple[dict[str, int], float | None]] = []
    for i in range(total):
        if flaky_pools and i % 6 == 5:
            counts = {rng.choice(flaky_pools): rng.randint(1, 3)}
        else:
            counts = {rng.choice(pools): rng.randint(1, 3)}
            if rng.random() < 0.3:
                counts[rng.choice(pools)] = counts.get(rng.choice(pools), 0) + 1
        delete_after = rng.uniform(0.5, 2.5) if i % 4 == 3 else None
        plan.append((counts, delete_after))
    return plan


def _progress(out: IO[str], requests: list[DemoRequest], elapsed: float) -> None:
    c = Counter(r.outcome for r in requests)
    line = f"\r  {elapsed:5.1f}s  " + "  ".join(
        f"{status} {c[status]:3d}" for status in RequestStatus
    )
    if out.isatty():
        out.write(line)
    else:
        out.write(line.lstrip("\r") + "\n")
    out.flush()


def _count_vms(store: Store) -> tuple[int, int]:
    created = destroyed = 0
    prefix = store.keys.vm_prefix()
    names = []
    for key in store.redis.scan_iter(match=store.keys.vm_pattern(), count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        if text.count(":") == 2:
            names.append(text[len(prefix) :])
    for vm in store.get_vms(names):
        if vm.created_at is not None:
            created += 1
        if vm.state == VMState.DESTROYED and vm.created_at is not None:
            destroyed += 1
    return created, destroyed


def run_demo(
    api: ApiClient,
    store: Store,
    providers: Mapping[str, Any],
    *,
    pools: list[str],
    flaky_pools: list[str],
    sweep_interval_s: float,
    settle_timeout_s: float = 150.0,
    seed: int = 1,
    total: int = 24,
    out: IO[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> DemoReport:
    """Run the burst and report, with an audit of the end state.

    Send the burst, follow every request until it settles, give back the ready ones, and
    wait for their VMs to be destroyed."""
    out = out or sys.stdout
    start = clock()
    out.write(f"demo: {total} on-demand requests against {api.base}")
    if flaky_pools:
        out.write(f" (some on {', '.join(flaky_pools)}, which fails on purpose)")
    out.write("\n")
    requests = [
        DemoRequest(api.create(counts), counts, clock(), delete_after)
        for counts, delete_after in plan_burst(pools, flaky_pools, random.Random(seed), total)
    ]
    deadline = start + settle_timeout_s
    _settle(api, requests, out, start=start, deadline=deadline, clock=clock)
    _release(api, requests, store, pools + flaky_pools, out, until=deadline + 60, clock=clock)
    report = DemoReport(flaky_pools=list(flaky_pools))
    for r in requests:
        report.outcomes[r.outcome] += 1
        if r.outcome == RequestStatus.FAILED and set(r.counts) & set(flaky_pools):
            report.failed_on_flaky += 1
        if r.ready_after_s is not None:
            report.time_to_ready_s.append(r.ready_after_s)
    report.vms_created, report.vms_destroyed = _count_vms(store)
    # the demo has no users: invariant 11 checks only that the kept counts agree
    report.violations = audit_state(
        store, providers, sweep_interval_s=sweep_interval_s, quota_of=lambda _: (None, None)
    )
    report.elapsed_s = clock() - start
    return report


def _settle(
    api: ApiClient,
    requests: list[DemoRequest],
    out: IO[str],
    *,
    start: float,
    deadline: float,
    clock: Callable[[], float],
) -> None:
    """Poll every pending request (deleting those due for it) until none is pending."""
    last_progress = 0.0
    while any(r.outcome == RequestStatus.PENDING for r in requests) and clock() < deadline:
        for r in requests:
            if r.outcome == RequestStatus.PENDING:
                _follow(api, r, clock())
        if clock() - last_progress >= 1.0:
            _progress(out, requests, clock() - start)
            last_progress = clock()
        time.sleep(0.25)  # the polling period of this client, as vmfloaty's 5 s
    _progress(out, requests, clock() - start)
    out.write("\n")


def _follow(api: ApiClient, r: DemoRequest, now: float) -> None:
    """One poll of a pending request, as a client would: delete it when due, then GET."""
    if r.delete_after_s is not None and now - r.created_at >= r.delete_after_s:
        api.delete(r.request_id)
        r.deleted_by_demo = True
    status, body = api.get(r.request_id)
    if status == 200 and body.get("ready"):
        r.outcome, r.ready_after_s = RequestStatus.READY, now - r.created_at
    elif status == 200:
        message = str(body.get("message", ""))
        r.outcome = RequestStatus.DELETED if "deleted" in message else RequestStatus.FAILED


def _release(
    api: ApiClient,
    requests: list[DemoRequest],
    store: Store,
    pools: list[str],
    out: IO[str],
    *,
    until: float,
    clock: Callable[[], float],
) -> None:
    """A client gives back what it got. Then wait for the fleet to destroy it."""
    for r in requests:
        if r.outcome == RequestStatus.READY:
            api.delete(r.request_id)
    out.write("demo: released the ready requests; waiting for their VMs to be destroyed\n")
    while clock() < until:
        by_pool = store.pool_counts(pools)
        if all(sum(states.values()) == 0 for states in by_pool.values()):
            break
        time.sleep(0.5)


def run_demo_on(
    config: Config, sup: Supervisor, stop: threading.Event, *, api_url: str, redis_url: str
) -> DemoReport:
    """The demo against the stack ``sup`` runs (`vmpool up --demo`), supervising it meanwhile.

    ``stop`` is set once the demo is done, which ends the supervision."""
    client = connect(redis_url, config.redis_options, decode_responses=True)
    store = Store(client, Keys(config.key_prefix))
    providers = providers_from_config(client, store.keys, config)
    flaky = [
        name
        for name, pool in config.pools.items()
        if config.providers[pool.provider].options.get("create_fail_percent")
    ]
    healthy = [name for name in config.pools if name not in flaky]
    watcher = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    watcher.start()
    try:
        return run_demo(
            ApiClient(api_url),
            store,
            providers,
            pools=healthy,
            flaky_pools=flaky,
            sweep_interval_s=config.schedule.sweep_expired,
        )
    finally:
        stop.set()
        watcher.join(timeout=5)
        client.close()

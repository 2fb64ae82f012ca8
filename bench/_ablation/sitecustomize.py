"""bench/api_rps.py's bounds: the API process with a part of its POST path taken away.

Put on the API process's PYTHONPATH by ``--creates-at-once`` or ``--post-floor``, never
installed; ``VMPOOL_BENCH_ABLATION`` names which. Each measures a bound (what POST ÷
/healthz would be without that part), not the API's behaviour.

- ``creates-at-once``: once the first batch of creates has run for real (the request
  the benchmark's GETs read), each batch of POST /ondemandvm's creates is answered
  ``created`` without its round trip to Redis. The POST's own Python and the HTTP layer
  stay; the round trip and Redis's work go.
- ``post-floor``: POST /ondemandvm served by the least a create does in this server
  stack. Its body is read and parsed, a new id made, and the route's own create call
  awaited (``_create_batched``: the store's script call in the turn's batch with its
  lane check, its outcome read; the plan made once); the reply goes as two raw ASGI
  messages. Gone: the route's auth check, idempotency key, validation, plan, priority
  and refusals, its counters and latency histogram, Starlette's Request and Response.
  Kept: uvicorn and h11, the access log, the unit of work around every call
  (vmpool.api.confirming), the hot route lookup, the batch and its round trip. What a
  POST could reach in uvicorn + h11 + redis-py with none of vmpool's route.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ABLATION_ENV = "VMPOOL_BENCH_ABLATION"


def _creates_at_once(module: ModuleType) -> None:
    batches = module.CreateBatches
    real = batches._send_batch
    ran = {"real": 0}

    def _send_batch(self: Any, calls: Sequence[Any], settle: Callable[[Any], None]) -> None:
        if ran["real"] < 1:
            ran["real"] += 1
            real(self, calls, settle)
            return
        settle([[1, "created", 1] for _ in calls])

    batches._send_batch = _send_batch


def _post_floor(module: ModuleType) -> None:
    from vmpool.api.quotas import request_priority
    from vmpool.api.routers.ondemand import _create_batched
    from vmpool.ids import new_request_id
    from vmpool.lifecycle.plan import plan_slots

    entry = module.Entry
    real = entry._serve
    made: dict[str, Any] = {}

    async def _serve(
        self: Any, route: Any, params: Any, scope: Any, receive: Any, send: Any
    ) -> None:
        if route.method != "POST" or route.param is not None:
            await real(self, route, params, scope, receive, send)
            return
        st = self.api.state.vmpool
        counts = json.loads((await receive())["body"])
        if not made:
            made["slots"] = plan_slots(st.config, counts, st.rng)
            made["priority"] = request_priority(st.config, "", None, sum(counts.values()))
        rid = new_request_id()
        await _create_batched(st, rid, made["slots"], None, made["priority"])
        body = json.dumps({"ok": True, "request_id": rid}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    entry._serve = _serve


# Each ablation: the module it patches, and how.
ABLATIONS: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    "creates-at-once": ("vmpool.api.create_batch", _creates_at_once),
    "post-floor": ("vmpool.api.hot_routes", _post_floor),
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, patch: Callable[[ModuleType], None]) -> None:
        self.target = target
        self.patch = patch

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != self.target:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.patch)
        return spec


_chosen = os.environ.get(ABLATION_ENV, "")
if _chosen not in ABLATIONS:
    sys.exit(f"{ABLATION_ENV} must be one of {', '.join(ABLATIONS)}, not {_chosen!r}")
sys.meta_path.insert(0, _Finder(*ABLATIONS[_chosen]))

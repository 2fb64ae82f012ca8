"""The layers around every request.

vmpooler's optional trailing slash, each call one unit of work (vmpool.api.confirming),
and the per-route response counters and latency histogram."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from vmpool.api.confirming import ConfirmedCalls
from vmpool.api.deps import LoopClients
from vmpool.api.metrics import ApiMetrics

__all__ = ["Observe", "TrailingSlash", "install_middleware"]


class TrailingSlash:
    """vmpooler's routes end in ``/?``: serve ``/x/`` as ``/x`` (no redirect)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if len(path) > 1 and path.endswith("/"):
                scope = dict(scope)
                scope["path"] = path.rstrip("/") or "/"
                raw = scope.get("raw_path")
                if isinstance(raw, bytes):
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class Observe:
    """Counts responses and latency per route template.

    A 404 that matched no route is counted as ``unmatched``, so hostile paths cannot grow
    the label set."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            m = self.metrics
            m.responses.labels(template, method, str(status["code"])).inc()
            m.latency.labels(template, method).observe(time.perf_counter() - start)


def install_middleware(app: FastAPI, metrics: ApiMetrics, clients: LoopClients) -> None:
    """:class:`Observe` in the app's middleware stack.

    :class:`TrailingSlash` around the whole built stack, Starlette's own error middleware
    included, so every layer sees the rewritten path; inside it, each call one unit of
    work (:class:`~vmpool.api.confirming.ConfirmedCalls`), its error answers included."""
    app.add_middleware(Observe, metrics=metrics)
    build_stack = app.build_middleware_stack

    def build() -> ASGIApp:
        return TrailingSlash(ConfirmedCalls(build_stack(), clients))

    app.build_middleware_stack = build  # type: ignore[method-assign]

"""The layer around every request that FastAPI routes, and vmpooler's trailing slash.

:class:`Observe` counts responses and latency per route template (the hot routes are
counted alike by :class:`~vmpool.api.hot_routes.Entry`, which serves them without this
stack). :func:`without_trailing_slash` is vmpooler's optional trailing slash, applied
by the entry layer before anything else sees the path. Outside both, each call is one
unit of work (:mod:`vmpool.api.confirming`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from vmpool.api.metrics import ApiMetrics

__all__ = ["Observe", "install_middleware", "without_trailing_slash"]


def without_trailing_slash(scope: Scope) -> Scope:
    """vmpooler's routes end in ``/?``: ``/x/`` is served as ``/x`` (no redirect)."""
    path = scope.get("path", "")
    if len(path) <= 1 or not path.endswith("/"):
        return scope
    scope = dict(scope)
    scope["path"] = path.rstrip("/") or "/"
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        scope["raw_path"] = raw.rstrip(b"/") or b"/"
    return scope


class Observe:
    """Counts responses and latency per route template.

    The template is the route's whole path, its router's prefix included (``templates``:
    id(route) -> template; FastAPI hands the route as its router declared it). A 404 that
    matched no route is counted as ``unmatched``, so hostile paths cannot grow the label
    set."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, templates: Mapping[int, str]):
        self.app = app
        self.metrics = metrics
        self.templates = templates

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
            template = self.templates.get(id(route)) or getattr(route, "path", None) or "unmatched"
            method = str(scope.get("method", ""))
            self.metrics.observe(template, method, status["code"], time.perf_counter() - start)


def install_middleware(app: FastAPI, metrics: ApiMetrics, templates: Mapping[int, str]) -> None:
    """:class:`Observe` in the app's middleware stack."""
    app.add_middleware(Observe, metrics=metrics, templates=templates)

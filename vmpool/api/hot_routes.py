"""The hot routes, served by the app's outermost layer without the framework's stack.

A POST /ondemandvm, a poll of GET /ondemandvm/<id> and a /healthz need no dependency
solving, no per-route exception middleware and no route search: :class:`Entry` serves
them itself. It keeps what the framework's path gives them: vmpooler's optional trailing
slash, the app's exception handlers (the most specific class registered on the app, as
Starlette picks it; an unexpected error is answered with its 500 and raised again, as
Starlette's server-error layer does), and the response counter and latency histogram by
route template. Every other request goes through FastAPI's stack, where
:class:`~vmpool.api.middleware.Observe` counts it. Of a POST's busy time in the event
loop, the framework's layers and routing were about a sixth (profiled:
docs/benchmarks.md).

A hot route is also registered with its router, under the same template (the table is
built from the routers' own paths), so FastAPI lists it and would serve it alike;
tests/test_api_parts.py checks that the router resolves each hot path to the same
endpoint.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from vmpool.api.metrics import ApiMetrics
from vmpool.api.middleware import without_trailing_slash

__all__ = ["Endpoint", "Entry", "HotRoute", "HotRoutes", "install_entry"]

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class HotRoute:
    """``method`` on ``template`` (FastAPI's path, at most one ``{param}``, last)."""

    method: str
    template: str
    endpoint: Endpoint

    @property
    def param(self) -> str | None:
        """The name of the template's path parameter, None for a fixed path."""
        last = self.template.rpartition("/")[2]
        return last[1:-1] if last.startswith("{") and last.endswith("}") else None


class HotRoutes:
    """A lookup of the hot routes by method and path: a dict, not a regex search."""

    def __init__(self, routes: Iterable[HotRoute]) -> None:
        self.fixed: dict[tuple[str, str], HotRoute] = {}
        self.by_prefix: dict[tuple[str, str], HotRoute] = {}
        for route in routes:
            if route.param is None:
                self.fixed[(route.method, route.template)] = route
            else:
                prefix = route.template.rpartition("/")[0]
                self.by_prefix[(route.method, prefix)] = route

    def match(self, method: str, path: str) -> tuple[HotRoute, dict[str, str]] | None:
        """The route of ``method`` ``path`` and its path parameters, None if no hot one."""
        route = self.fixed.get((method, path))
        if route is not None:
            return route, {}
        prefix, _, last = path.rpartition("/")
        route = self.by_prefix.get((method, prefix)) if last else None
        if route is None or route.param is None:
            return None
        return route, {route.param: last}


class Entry:
    """The app's outermost layer: the trailing slash, then a hot route or the stack."""

    def __init__(self, app: ASGIApp, api: FastAPI, routes: HotRoutes, metrics: ApiMetrics):
        self.app = app  # FastAPI's built middleware stack
        self.api = api
        self.routes = routes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = without_trailing_slash(scope)
        found = None
        if not scope.get("root_path"):
            found = self.routes.match(scope["method"], scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        await self._serve(found[0], found[1], scope, receive, send)

    async def _serve(
        self, route: HotRoute, params: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        start = time.perf_counter()
        scope["app"] = self.api
        scope["path_params"] = params
        request = Request(scope, receive)
        status = 500
        try:
            try:
                response = await route.endpoint(request)
            except Exception as exc:
                response, unexpected = await self._handled(request, exc)
                status = response.status_code
                await response(scope, receive, send)
                if unexpected:
                    raise
                return
            status = response.status_code
            await response(scope, receive, send)
        finally:
            self.metrics.observe(route.template, route.method, status, time.perf_counter() - start)

    async def _handled(self, request: Request, exc: Exception) -> tuple[Response, bool]:
        """The app's answer to ``exc``, and whether it is the catch-all's (re-raised)."""
        for cls in type(exc).__mro__:
            handler = self.api.exception_handlers.get(cls)
            if handler is not None:
                response = handler(request, exc)
                if inspect.isawaitable(response):
                    response = await response
                assert isinstance(response, Response)
                return response, cls is Exception
        raise exc


def install_entry(app: FastAPI, routes: HotRoutes, metrics: ApiMetrics) -> None:
    """:class:`Entry` around ``app``'s whole built stack, Starlette's error layer included."""
    build_stack = app.build_middleware_stack

    def build() -> ASGIApp:
        return Entry(build_stack(), app, routes, metrics)

    app.build_middleware_stack = build  # type: ignore[method-assign]

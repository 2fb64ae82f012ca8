"""vmpooler's dashboard on the API's port, and vmpool's live page.

- ``GET /``: 302 to ``/dashboard/``, as vmpooler.
- ``GET /dashboard/``: the live page (``vmpool/api/dashboard/``: one HTML file, one
  script, one stylesheet, written small, served from here: no build step, no CDN). It
  polls ``/dashboard/stats/vmpool/live`` and redraws without a reload.
- ``GET /dashboard/stats/vmpooler/pool[?history=1]`` and
  ``GET /dashboard/stats/vmpooler/running[?history=1]``: vmpooler's JSON
  (:mod:`vmpool.api.dashboard_data` has the shapes).
- ``GET /dashboard/stats/vmpool/live``: the page's feed.

All read-only and without a token, with the API's auth on or off: nothing here is a
secret (no user, no token; request ids as GET /ondemandvm/<id> serves them to anyone).
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Final

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from vmpool.api.dashboard_data import live_feed, pool_stats, running_stats, site_name
from vmpool.api.deps import State
from vmpool.api.responses import not_ok, reply

__all__ = ["router"]

router = APIRouter()

# The page's files, by the name it asks for them, and their media types.
ASSETS: Final = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
# Only the API's own files and its JSON: no inline script, no other origin.
PAGE_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
    " img-src 'self'; base-uri 'none'; form-action 'none'"
)


@cache
def _file(name: str) -> str:
    return resources.files("vmpool.api").joinpath("dashboard", name).read_text(encoding="utf-8")


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/dashboard/", status_code=302)


@router.get("/dashboard")
async def page(st: State) -> Response:
    body = _file("index.html").replace("{{site_name}}", html.escape(site_name(st)))
    headers = {"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"}
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


@router.get("/dashboard/assets/{name}")
async def asset(name: str) -> Response:
    media = ASSETS.get(name)
    if media is None:
        return not_ok(404)
    return Response(_file(name), media_type=media, headers={"Cache-Control": "no-cache"})


def _history(request: Request) -> bool:
    """vmpooler's ``if params[:history]``: the parameter given, whatever its value."""
    return "history" in request.query_params


@router.get("/dashboard/stats/vmpooler/pool")
async def vmpooler_pool(request: Request, st: State) -> Response:
    return reply(200, await run_in_threadpool(pool_stats, st, _history(request)))


@router.get("/dashboard/stats/vmpooler/running")
async def vmpooler_running(request: Request, st: State) -> Response:
    return reply(200, await run_in_threadpool(running_stats, st, _history(request)))


@router.get("/dashboard/stats/vmpool/live")
async def vmpool_live(st: State) -> Response:
    return reply(200, await run_in_threadpool(live_feed, st), {"Cache-Control": "no-store"})

"""The endpoints outside ``/api/v3``: liveness, readiness and Prometheus metrics.

/healthz, /readyz (Redis reachable and taking writes) and /metrics."""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import State
from vmpool.api.responses import hot_reply, not_ok, reply
from vmpool.state.redis_health import MESSAGES, RedisCondition, probe

__all__ = ["HOT", "METRICS_MEDIA_TYPE", "router"]

METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    return hot_reply(200, {"ok": True})


@router.get("/readyz")
async def readyz(st: State) -> Response:
    """200 when Redis takes a write (confirmed as every write is), else 503 naming why.

    unreachable, out of memory, read-only, too few replicas, not confirmed."""
    condition = await run_in_threadpool(probe, st.clients.text, st.keys)
    if condition is RedisCondition.OK:
        return reply(200, {"ok": True, "redis": "ok"})
    return not_ok(503, redis=condition, message=MESSAGES[condition])


@router.get("/metrics")
async def metrics(st: State) -> Response:
    data = await run_in_threadpool(st.metrics.render)
    return Response(data, media_type=METRICS_MEDIA_TYPE)


# (method, path, endpoint) of the hot routes here (vmpool.api.hot_routes).
HOT: Final = (("GET", "/healthz", healthz),)

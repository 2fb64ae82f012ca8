"""Outside ``/api/v3``: liveness (/healthz), readiness (/readyz: Redis answers) and
Prometheus metrics (/metrics)."""

from __future__ import annotations

import redis
from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vmpool.api.deps import State
from vmpool.api.responses import not_ok, reply

__all__ = ["METRICS_MEDIA_TYPE", "router"]

METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter()


@router.get("/healthz")
async def healthz() -> Response:
    return reply(200, {"ok": True})


@router.get("/readyz")
async def readyz(st: State) -> Response:
    if await run_in_threadpool(_redis_answers, st.clients.text):
        return reply(200, {"ok": True, "redis": "ok"})
    return not_ok(503, redis="unreachable")


@router.get("/metrics")
async def metrics(st: State) -> Response:
    data = await run_in_threadpool(st.metrics.render)
    return Response(data, media_type=METRICS_MEDIA_TYPE)


def _redis_answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False

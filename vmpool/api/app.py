"""The HTTP API app: vmpooler 3.9's v3 endpoints, status, health, metrics, the dashboard.

``create_app(config, redis_url)`` builds one FastAPI app from the routers in
:mod:`vmpool.api.routers`. Everything it needs lives in one
:class:`~vmpool.api.deps.ApiState` on ``app.state.vmpool``. There is no module-level
state, so several apps can share a process. ``app_from_env`` is the factory uvicorn
calls in each process of ``vmpool api --workers N``.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import redis
from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool

from vmpool.api.confirming import install_confirmed_calls
from vmpool.api.create_batch import CreateBatches
from vmpool.api.deps import ApiState, RedisClients
from vmpool.api.errors import install_error_handlers
from vmpool.api.hot_routes import HotRoute, HotRoutes, install_entry
from vmpool.api.metrics import ApiMetrics, RedisStateCollector
from vmpool.api.middleware import install_middleware
from vmpool.api.routers import (
    dashboard,
    health,
    ondemand,
    pools,
    status,
    summary,
    timeline,
    token,
    vm,
    vm_tasks,
)
from vmpool.api.turn_batch import ReadBatches
from vmpool.config import Config, load_config
from vmpool.state.keys import Keys
from vmpool.state.lua import load_missing
from vmpool.state.store import Store
from vmpool.state.tokens import TokenStore
from workers.batching import BatchDispatcher

__all__ = [
    "API_PREFIX",
    "LISTEN_HOST_ENV",
    "app_from_env",
    "create_app",
]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v3"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
LISTEN_HOST_ENV = "VMPOOL_API_HOST"  # set by `vmpool api` for its uvicorn workers


def create_app(
    config: Config,
    redis_url: str,
    *,
    rng: random.Random | None = None,
    listen_host: str | None = None,
) -> FastAPI:
    """The API app for ``config`` over the Redis at ``redis_url``.

    The one factory: ``vmpool api`` (and so ``vmpool up``) serves what it builds, and the
    tests build their apps with it (tests/apihelp.py). Arguments:

    - ``rng`` picks backends (tests seed it; None: the system's).
    - ``listen_host``: the address the server binds. ``/status`` warns when auth is off on
      one that is not loopback.

    A new request's provisioning goes to the fleet's RQ queues through the batching
    dispatcher. The app owns its Redis clients: its shutdown closes them.
    """
    st = _api_state(config, redis_url, rng)
    st.listen_host = listen_host
    app = FastAPI(
        title="vmpool",
        description="vmpooler v3 compatible on-demand VM API",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_lifespan(st),
    )
    app.state.vmpool = st
    install_error_handlers(app)
    templates: dict[int, str] = {}  # id(route) -> its whole path
    for router, prefix in _ROUTERS:
        app.include_router(router, prefix=prefix)
        templates.update((id(r), prefix + getattr(r, "path", "")) for r in router.routes)
    install_middleware(app, st.metrics, templates)
    install_entry(app, _hot_routes(), st.metrics)
    install_confirmed_calls(app, st.clients.aio)
    return app


# Every router, with the prefix it is served under (in the order they are matched).
_ROUTERS: tuple[tuple[APIRouter, str], ...] = (
    (ondemand.router, API_PREFIX),
    (token.router, API_PREFIX),
    (status.router, API_PREFIX),
    (vm.router, API_PREFIX),
    (vm_tasks.router, API_PREFIX),
    (pools.router, API_PREFIX),
    (summary.router, API_PREFIX),
    (timeline.router, API_PREFIX),
    (health.router, ""),
    (dashboard.router, ""),
)


def _hot_routes() -> HotRoutes:
    """The routes the entry layer serves itself (each also in its router, as above)."""
    routes = [HotRoute(m, API_PREFIX + path, e) for m, path, e in ondemand.HOT]
    routes += [HotRoute(m, path, e) for m, path, e in health.HOT]
    return HotRoutes(routes)


def _lifespan(st: ApiState) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """A lifespan that makes the scripts ready as the app starts (:func:`_warm`) and
    closes its clients when it shuts down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(_warm, st)
        try:
            yield
        finally:
            await _close_clients(st.clients)

    return lifespan


def _warm(st: ApiState) -> None:
    """The store's scripts composed and on the server before the first request (each
    composed on its first use, and answered NOSCRIPT once on a fresh Redis, otherwise).
    Redis down: the first requests load them, as they always could."""
    scripts = [*st.store.scripts.all(), st.store.quotas.place_script, *st.batch.scripts]
    try:
        load_missing(st.clients.text, scripts)
    except redis.RedisError as exc:
        log.warning("scripts not loaded at start: %s", exc)


async def _close_clients(clients: RedisClients) -> None:
    """Close the sync clients and this event loop's asyncio client.

    Each close disconnects the client's connection pool. An asyncio client of another
    loop is left alone: it can only be closed from its own loop.
    """
    clients.text.close()
    clients.raw.close()
    await clients.aio.aclose()


def _api_state(config: Config, redis_url: str, rng: random.Random | None) -> ApiState:
    clients = RedisClients.from_url(redis_url, config.redis_options)
    keys = Keys(config.key_prefix)
    store = Store(clients.text, keys)
    metrics = ApiMetrics()
    metrics.registry.register(RedisStateCollector.from_config(store, clients.raw, config))
    batch = BatchDispatcher(clients.raw, keys, config)
    return ApiState(
        config=config,
        clients=clients,
        keys=keys,
        store=store,
        tokens=TokenStore(clients.text, keys),
        metrics=metrics,
        batch=batch,
        creates=CreateBatches(clients.aio.pipeline, batch, metrics.enqueue_failures.inc),
        status_reads=ReadBatches(clients.aio.pipeline),
        rng=rng or random.SystemRandom(),
        started=time.monotonic(),
    )


def app_from_env() -> FastAPI:
    """The uvicorn factory (``vmpool.api.app:app_from_env``) for ``vmpool api --workers N``.

    The config comes from ``VMPOOL_CONFIG``, Redis from ``VMPOOL_REDIS_URL`` or the config.
    """
    config = load_config()
    url = os.environ.get("VMPOOL_REDIS_URL") or config.redis_url or DEFAULT_REDIS_URL
    return create_app(config, url, listen_host=os.environ.get(LISTEN_HOST_ENV) or None)

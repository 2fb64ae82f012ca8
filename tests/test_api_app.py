"""The tests' app is the production app: what tests/apihelp.py builds is what `vmpool api`
serves, for one process (``create_app``) and for ``--workers N`` (uvicorn's factory).

The two are compared by their shape: the routes and their handlers, the middleware stack
as built, the error handlers, the metrics exported, and the kinds and settings of
everything a handler reaches (the Redis clients, the asyncio clients, the dispatcher,
the stores). An app built another way (without the asyncio clients, without the fleet's
dispatcher, with other connection settings or listen address) differs in that shape,
and the test fails.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
from click.testing import CliRunner
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from vmpool.api.deps import ApiState, LoopClients
from vmpool.cli.main import cli
from vmpool.state.durability import ConfirmingAsyncRedis, ConfirmingRedis
from workers.batching import BatchDispatcher, lanes_for

from apihelp import make_app, spec_config, spec_data

# What `vmpool api --workers N` puts in its processes' environment for the factory.
FACTORY_ENV = ("VMPOOL_CONFIG", "VMPOOL_REDIS_URL", "VMPOOL_API_HOST")


def _name(obj: Any) -> str:
    """A class's or a function's full name."""
    return f"{obj.__module__}.{obj.__qualname__}"


def _kind(value: Any) -> str:
    """A state field's kind: its class (a random source is one kind, seeded or not)."""
    if isinstance(value, random.Random):
        return "random.Random"
    return _name(type(value))


def _connection(client: redis.Redis) -> dict[str, Any]:
    """How a client connects: its settings, an object among them by its class."""
    plain = (str, int, float, bool, type(None), dict, tuple)
    kwargs = client.get_connection_kwargs()
    return {k: v if isinstance(v, plain) else _kind(v) for k, v in kwargs.items()}


def _routes(app: FastAPI) -> list[tuple[str, str, str]]:
    """(path, method, the handler's operation id: its function's name) of every route."""
    paths = app.openapi()["paths"]
    return sorted((p, m, op["operationId"]) for p, ops in paths.items() for m, op in ops.items())


def _stack(app: FastAPI) -> list[str]:
    """The middleware stack as uvicorn runs it, outermost first, down to the router."""
    layers, layer = [], app.build_middleware_stack()
    while layer is not None:
        layers.append(_name(type(layer)))
        layer = getattr(layer, "app", None)
    return layers


def _metric_names(app: FastAPI) -> list[str]:
    """The metric families a scrape exports (the app's lifespan runs: it closes its clients)."""
    with TestClient(app) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    return sorted({f.name for f in text_string_to_metric_families(response.text)})


def shape(app: FastAPI) -> dict[str, Any]:
    """Everything that makes the app the program it is, but its seeded random source."""
    st = app.state.vmpool
    assert isinstance(st, ApiState)
    clients = st.clients
    return {
        "routes": _routes(app),
        "middleware": _stack(app),
        "errors": sorted((_name(k), _name(v)) for k, v in app.exception_handlers.items()),
        "state": {f.name: _kind(getattr(st, f.name)) for f in dataclasses.fields(st)},
        "clients": {
            "text": (_kind(clients.text), _connection(clients.text)),
            "raw": (_kind(clients.raw), _connection(clients.raw)),
            "aio": (_kind(clients.aio), clients.aio.url, clients.aio.options),
        },
        "batch": (
            _kind(st.batch),
            # its lanes are the config's: as many ids per batch job as batch_lanes gives
            all(len(lanes.ids) == 2 * lanes_for(st.config) for lanes in st.batch.lanes.values()),
            getattr(st.batch, "conn", None) is clients.raw,
        ),
        "listen_host": st.listen_host,
        "metrics": _metric_names(app),
    }


def served_app(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> FastAPI:
    """The app `vmpool api ARGS` hands uvicorn (built by uvicorn's factory for --workers N)."""
    served: dict[str, Any] = {}

    def run(app: Any, **options: Any) -> None:
        served.update(app=app, **options)

    monkeypatch.setattr(uvicorn, "run", run)
    for name in FACTORY_ENV:  # the CLI sets them for its workers: restored after the test
        monkeypatch.setenv(name, "")
    result = CliRunner().invoke(cli, ["api", *args])
    assert result.exit_code == 0, result.output
    app = served["app"]
    if isinstance(app, str):  # "module:factory", called in each worker process
        assert served["factory"] is True
        module, _, factory = app.partition(":")
        app = getattr(importlib.import_module(module), factory)()
    assert isinstance(app, FastAPI)
    return app


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "vmpool.yaml"
    path.write_text(json.dumps(spec_data(auth=True)))
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_tests_app_is_the_app_vmpool_api_serves(
    monkeypatch: pytest.MonkeyPatch,
    config_file: Path,
    redis_url: str,
    redis_client: redis.Redis,
    workers: str,
) -> None:
    """Proves: apihelp.make_app builds, from the same config, an app of the same shape
    as the one `vmpool api` serves (its default --host, one worker or uvicorn's factory
    in each of several), and that shape is the production one: asyncio clients for the
    hot paths, durability-confirming clients, the fleet's batching dispatcher (the
    lifespan that closes the clients: test_api.py's shutdown test)."""
    cli_args = ["--config", str(config_file), "--redis-url", redis_url, "--workers", workers]
    served = shape(served_app(monkeypatch, cli_args))
    tests = shape(make_app(spec_config(auth=True), redis_url))
    assert tests == served
    assert served["clients"]["aio"][0] == _name(LoopClients)
    assert served["clients"]["text"][0] == served["clients"]["raw"][0] == _name(ConfirmingRedis)
    assert served["batch"] == (_name(BatchDispatcher), True, True)
    assert ("/api/v3/ondemandvm", "post") in {r[:2] for r in served["routes"]}


def test_the_asyncio_clients_confirm_durability(redis_url: str, redis_client: redis.Redis) -> None:
    """Proves: the client the hot paths await is the confirming kind (a plain one would
    acknowledge writes no replica holds)."""
    app = make_app(spec_config(), redis_url)

    async def client_kind() -> type:
        return type(app.state.vmpool.clients.aio.get())

    with TestClient(app) as client:
        assert client.portal.call(client_kind) is ConfirmingAsyncRedis

"""The HTTP API (FastAPI): vmpooler's v3 API, health, readiness and metrics.

- ``app``: ``create_app`` (the app factory) and ``app_from_env`` (uvicorn's factory).
- ``routers/``: one ``APIRouter`` per resource: ``ondemand`` (POST /ondemandvm, its
  path form, GET/DELETE /ondemandvm/<id>), ``token``, ``status``, ``health``
  (/healthz, /readyz, /metrics).
- ``deps``: the per-app state and the callers' identity (token, HTTP Basic).
- ``parsing``: request bodies and paths -> what is asked for (plain functions).
- ``responses``, ``errors``, ``middleware``: vmpooler's JSON, every error as one JSON
  reply, the trailing slash and per-route metrics.
- ``metrics``: the Prometheus registry and the fleet's state read at scrape time.

Imports go downward only: ``app`` -> ``routers`` -> ``deps``/``parsing`` ->
``errors``/``responses``/``metrics``. The package uses workers, lifecycle, config,
state and ids, never the CLI.
"""

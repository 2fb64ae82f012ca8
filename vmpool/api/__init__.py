"""The HTTP API (FastAPI): vmpooler's v3 API, health, readiness and metrics."""

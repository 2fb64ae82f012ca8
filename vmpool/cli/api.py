"""``vmpool api``: the HTTP API (vmpooler v3 compatible) under uvicorn."""

from __future__ import annotations

import logging
import os

import click

from vmpool.cli.context import LOCAL_REDIS_URL, CliContext, with_context
from vmpool.cli.strict import check_redis_at_start, strict_option
from vmpool.config import mask_url_password

__all__ = ["api_command"]

log = logging.getLogger(__name__)


@click.command("api")
@with_context(fallback_redis_url=LOCAL_REDIS_URL, follow_fleet=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="uvicorn worker processes.",
)
@click.option("--log-level", default="info", show_default=True)
@strict_option
def api_command(
    cli: CliContext, host: str, port: int, workers: int, log_level: str, strict: bool
) -> None:
    """Serve the HTTP API (vmpooler v3 compatible) with uvicorn."""
    import uvicorn

    url = cli.redis_url
    check_redis_at_start(url, who="vmpool api", strict=strict)
    cli.publish_config("vmpool api")
    click.echo(
        f"vmpool api: http://{host}:{port}/api/v3 (redis {mask_url_password(url)},"
        f" {workers} worker{'s' if workers != 1 else ''})",
        err=True,
    )
    from vmpool.api.app import LISTEN_HOST_ENV, create_app
    from vmpool.api.routers.status import exposure_warning

    warning = exposure_warning(cli.config.auth is not None, host)
    if warning:
        log.warning("vmpool api: %s", warning)
    if workers == 1:
        app = create_app(cli.config, url, listen_host=host)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
        return
    # Several processes: each builds its app from the environment (uvicorn's factory).
    if cli.config_path:
        os.environ["VMPOOL_CONFIG"] = os.path.abspath(cli.config_path)
    os.environ["VMPOOL_REDIS_URL"] = url
    os.environ[LISTEN_HOST_ENV] = host
    uvicorn.run(
        "vmpool.api.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
    )

"""``vmpool api``: the HTTP API (vmpooler v3 compatible) under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import os

import click

from vmpool.cli.context import LOCAL_REDIS_URL, CliContext, with_context
from vmpool.cli.identity_check import lost_marks_at_start
from vmpool.cli.strict import check_redis_at_start, strict_option
from vmpool.config import mask_url_password

__all__ = ["FORWARDED_ALLOW_IPS_ENV", "api_command", "parse_forwarded_allow_ips"]

log = logging.getLogger(__name__)

FORWARDED_ALLOW_IPS_ENV = "VMPOOL_FORWARDED_ALLOW_IPS"


def parse_forwarded_allow_ips(
    ctx: click.Context | None, param: click.Parameter | None, value: str | None
) -> str | None:
    """``*``, or a comma-separated list of IP addresses and CIDR networks.

    Anything else is a usage error naming the item (uvicorn would take it as a literal
    that never matches, and silently trust nobody)."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",") if item.strip()]
    if items == ["*"]:
        return "*"
    if not items:
        raise click.BadParameter("give addresses, CIDR networks or '*'", ctx, param)
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise click.BadParameter(
                f"{item!r} is not an IP address or network (or '*')", ctx, param
            ) from None
    return ",".join(items)


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
@click.option(
    "--forwarded-allow-ips",
    metavar="IPS",
    envvar=FORWARDED_ALLOW_IPS_ENV,
    default=None,
    callback=parse_forwarded_allow_ips,
    help="The proxies (addresses, CIDR networks, or '*') whose X-Forwarded-For and"
    " X-Forwarded-Proto are believed: behind an ingress, the client's own address then"
    " counts for the per-address login limit. Trust only what can reach the API"
    f" [env {FORWARDED_ALLOW_IPS_ENV}; default: 127.0.0.1,::1].",
)
@strict_option
def api_command(
    cli: CliContext,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    forwarded_allow_ips: str | None,
    strict: bool,
) -> None:
    """Serve the HTTP API (vmpooler v3 compatible) with uvicorn."""
    url = cli.redis_url
    check_redis_at_start(url, cli.config.redis_options, who="vmpool api", strict=strict)
    lost_marks_at_start(url, cli.config.redis_options, cli.keys)
    cli.publish_config("vmpool api")
    click.echo(
        f"vmpool api: http://{host}:{port}/api/v3 (redis {mask_url_password(url)},"
        f" {workers} worker{'s' if workers != 1 else ''})",
        err=True,
    )
    from vmpool.api.routers.status import exposure_warning

    warning = exposure_warning(cli.config.auth is not None, host)
    if warning:
        log.warning("vmpool api: %s", warning)
    _serve(cli, url, host, port, workers, log_level, forwarded_allow_ips)


def _serve(
    cli: CliContext,
    url: str,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    forwarded_allow_ips: str | None,
) -> None:
    """uvicorn with one app, or ``workers`` processes each building its own.

    ``forwarded_allow_ips`` None: uvicorn's default (loopback, or its
    FORWARDED_ALLOW_IPS). uvicorn's logging, its access log written off the event loop
    (vmpool.api.access_log)."""
    import uvicorn

    from vmpool.api.access_log import uvicorn_log_config
    from vmpool.api.app import LISTEN_HOST_ENV, create_app

    if workers == 1:
        app = create_app(cli.config, url, listen_host=host)
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            log_config=uvicorn_log_config(),
            proxy_headers=True,
            forwarded_allow_ips=forwarded_allow_ips,
        )
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
        log_config=uvicorn_log_config(),
        proxy_headers=True,
        forwarded_allow_ips=forwarded_allow_ips,
    )

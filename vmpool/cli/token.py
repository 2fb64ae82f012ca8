"""``vmpool api`` (the HTTP API under uvicorn) and ``vmpool token create|revoke``."""

from __future__ import annotations

import os

import click
import redis

from vmpool.cli.main import (
    CliError,
    CliFailure,
    common_options,
    echo_json,
    json_option,
    load_cli_config,
)
from vmpool.config import Config, mask_url_password
from vmpool.state.keys import Keys
from vmpool.state.tokens import TokenStore

__all__ = ["api_command", "token_group"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_url(config: Config) -> str:
    return config.redis_url or DEFAULT_REDIS_URL


def _connect(config: Config) -> redis.Redis:
    url = _redis_url(config)
    client: redis.Redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise CliFailure(f"cannot reach Redis at {mask_url_password(url)}: {exc}") from None
    return client


@click.command("api")
@common_options
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
def api_command(
    config_path: str | None,
    redis_url: str | None,
    host: str,
    port: int,
    workers: int,
    log_level: str,
) -> None:
    """Serve the HTTP API (vmpooler v3 compatible) with uvicorn."""
    import uvicorn

    config = load_cli_config(config_path, redis_url)
    url = _redis_url(config)
    click.echo(
        f"vmpool api: http://{host}:{port}/api/v3 (redis {mask_url_password(url)},"
        f" {workers} worker{'s' if workers != 1 else ''})",
        err=True,
    )
    if workers == 1:
        from vmpool.api.app import create_app

        uvicorn.run(create_app(config, url), host=host, port=port, log_level=log_level)
        return
    # Several processes: each builds its app from the environment (uvicorn's factory).
    if config_path:
        os.environ["VMPOOL_CONFIG"] = os.path.abspath(config_path)
    os.environ["VMPOOL_REDIS_URL"] = url
    uvicorn.run(
        "vmpool.api.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
    )


@click.group("token")
def token_group() -> None:
    """Mint or revoke API tokens (admin: straight to Redis)."""


@token_group.command("create")
@common_options
@json_option
@click.argument("user")
def token_create(config_path: str | None, redis_url: str | None, as_json: bool, user: str) -> None:
    """Mint a token for USER and print it (shown once; only its SHA-256 is stored)."""
    if not user.strip():
        raise CliError("USER must not be empty")
    config = load_cli_config(config_path, redis_url)
    token = TokenStore(_connect(config), Keys(config.key_prefix)).create(user)
    if as_json:
        echo_json({"ok": True, "user": user, "token": token})
    else:
        click.echo(token)


@token_group.command("revoke")
@common_options
@json_option
@click.argument("token")
def token_revoke(config_path: str | None, redis_url: str | None, as_json: bool, token: str) -> None:
    """Revoke TOKEN (exit 1 when no such token exists)."""
    config = load_cli_config(config_path, redis_url)
    revoked = TokenStore(_connect(config), Keys(config.key_prefix)).revoke(token)
    if as_json:
        echo_json({"ok": revoked})
    if not revoked:
        raise CliFailure("no such token")
    if not as_json:
        click.echo("revoked")

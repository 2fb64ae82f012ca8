"""``vmpool token create|revoke``: API tokens, minted and revoked straight in Redis."""

from __future__ import annotations

import click

from vmpool.cli.context import LOCAL_REDIS_URL, CliContext, echo_json, with_context
from vmpool.cli.errors import CliError, CliFailure

__all__ = ["token_group"]


@click.group("token")
def token_group() -> None:
    """Mint or revoke API tokens (admin: straight to Redis)."""


@token_group.command("create")
@with_context(json=True, fallback_redis_url=LOCAL_REDIS_URL)
@click.argument("user")
def token_create(cli: CliContext, user: str) -> None:
    """Mint a token for USER and print it (shown once; only its SHA-256 is stored)."""
    if not user.strip():
        raise CliError("USER must not be empty")
    token = cli.tokens.create(user)
    if cli.as_json:
        echo_json({"ok": True, "user": user, "token": token})
    else:
        click.echo(token)


@token_group.command("revoke")
@with_context(json=True, fallback_redis_url=LOCAL_REDIS_URL)
@click.argument("token")
def token_revoke(cli: CliContext, token: str) -> None:
    """Revoke TOKEN (exit 1 when no such token exists)."""
    revoked = cli.tokens.revoke(token)
    if cli.as_json:
        echo_json({"ok": revoked})
    if not revoked:
        raise CliFailure("no such token")
    if not cli.as_json:
        click.echo("revoked")

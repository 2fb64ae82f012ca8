"""``vmpool token create|revoke``: API tokens, minted and revoked straight in Redis."""

from __future__ import annotations

from datetime import datetime, timezone

import click

from vmpool.cli.context import LOCAL_REDIS_URL, CliContext, echo_json, with_context
from vmpool.cli.errors import CliError, CliFailure
from vmpool.ids import InvalidIdentifier, validate_token, validate_user_name

__all__ = ["token_group"]

DEFAULT_MAX_TOKENS = 100  # as :auth: max_tokens_per_user's default


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@click.group("token")
def token_group() -> None:
    """Mint or revoke API tokens (admin: straight to Redis)."""


@token_group.command("create")
@with_context(json=True, fallback_redis_url=LOCAL_REDIS_URL)
@click.argument("user")
def token_create(cli: CliContext, user: str) -> None:
    """Mint a token for USER and print it (shown once: only its SHA-256 is stored)."""
    try:
        validate_user_name(user)  # the same rule as everywhere a user name is taken in
    except InvalidIdentifier as exc:
        raise CliError(f"USER: {exc}") from None
    auth = cli.config.auth
    _warn_if_unknown(cli, user)
    minted = cli.tokens.mint(
        user,
        ttl_s=auth.token_ttl_s if auth else None,
        max_tokens=auth.max_tokens_per_user if auth else DEFAULT_MAX_TOKENS,
    )
    expires = None if minted.expires is None else _utc(minted.expires)
    if cli.as_json:
        body: dict[str, object] = {"ok": True, "user": user, "token": minted.token}
        if expires:
            body["expires"] = expires
        echo_json(body)
        return
    click.echo(minted.token)  # alone on stdout, for scripts
    if expires:
        click.echo(f"expires {expires}", err=True)


def _warn_if_unknown(cli: CliContext, user: str) -> None:
    """A token for a user the config does not know works all the same: say so."""
    auth = cli.config.auth
    if auth is None:
        click.echo(
            f"warning: {cli.config.source} has no :auth: section: the API asks for no"
            " token until it has one",
            err=True,
        )
    elif auth.provider == "static" and user not in auth.users:
        click.echo(
            f"warning: {user!r} is not one of the users under :auth: in {cli.config.source};"
            " the token works all the same (`vmpool token revoke TOKEN` ends it)",
            err=True,
        )


@token_group.command("revoke")
@with_context(json=True, fallback_redis_url=LOCAL_REDIS_URL)
@click.argument("token")
def token_revoke(cli: CliContext, token: str) -> None:
    """Revoke TOKEN (exit 1 when no such token exists)."""
    try:
        validate_token(token)
    except InvalidIdentifier as exc:  # its message never echoes the token
        raise CliError(f"TOKEN: {exc}") from None
    revoked = cli.tokens.revoke(token)
    if cli.as_json:
        echo_json({"ok": revoked})
    if not revoked:
        raise CliFailure("no such token")
    if not cli.as_json:
        click.echo("revoked")

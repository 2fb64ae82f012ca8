"""Redis URLs: which ones vmpool takes, and how one is shown without its password."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

from vmpool.providers.options import show

__all__ = ["REDIS_SCHEMES", "mask_url_password", "validate_redis_url"]

REDIS_SCHEMES: Final = ("redis", "rediss", "unix")


def mask_url_password(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``; fit to print or log."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def validate_redis_url(url: str) -> str:
    """``url`` stripped, if it is a usable redis://, rediss:// or unix:// URL; else
    ValueError with a one-line reason (the password never appears in it)."""
    url = url.strip()
    shown = show(mask_url_password(url))
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"not a valid URL: {shown}") from None
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {shown}")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"has no socket path: {shown}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"has no host: {shown}")
    return url

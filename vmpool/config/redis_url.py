"""Redis URLs: which ones vmpool takes, and how one is shown without its password.

The forms and their parsing live with the connection factory
(:mod:`vmpool.state.redis_target`). This module checks a URL given in the config, on
the command line or in the environment.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from vmpool.providers.options import show
from vmpool.state.redis_target import (
    REDIS_SCHEMES,
    is_sentinel_url,
    mask_url_password,
    parse_sentinel_url,
)

__all__ = ["REDIS_SCHEMES", "mask_url_password", "validate_redis_url"]


def validate_redis_url(url: str) -> str:
    """``url`` stripped, if it is a usable Redis URL.

    Usable: redis://, rediss://, unix:// or redis+sentinel://. Otherwise ValueError with a
    one-line reason. The password never appears in it.
    """
    url = url.strip()
    shown = show(mask_url_password(url))
    if is_sentinel_url(url):
        try:
            parse_sentinel_url(url)
        except ValueError as exc:
            raise ValueError(f"{exc}: {shown}") from None
        return url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"not a valid URL: {shown}") from None
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError(
            f"must be a redis://, rediss://, unix:// or redis+sentinel:// URL, got {shown}"
        )
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"has no socket path: {shown}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"has no host: {shown}")
    return url

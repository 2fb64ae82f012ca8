"""Where Redis is: the URL forms vmpool takes, parsed, composed and shown masked.

Every process is given one URL and hands the same URL to the processes it starts. It
comes from ``--redis-url``, ``VMPOOL_REDIS_URL`` or ``:redis: url``, or is composed from
``:redis:``'s parts or its ``sentinel`` section.

The forms:

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix://PATH``:
  one server (redis-py's own URL forms).
- ``redis+sentinel://[[user]:password@]h1:26379,h2:26379,.../MASTER[/db]
  [?sentinel_password=...]``: the primary of the group ``MASTER`` as the sentinels
  name it, found again after every failover. The password (and user) are the
  primary's. ``sentinel_password`` is the sentinels' own (``requirepass`` on them),
  when they have one. The form without the query is the one rq-dashboard reads too.

A password never appears in an error message: :func:`mask_url_password` shows a URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

__all__ = [
    "REDIS_SCHEMES",
    "SENTINEL_PORT",
    "SENTINEL_SCHEME",
    "SentinelTarget",
    "is_sentinel_url",
    "mask_url_password",
    "parse_sentinel_url",
]

SENTINEL_SCHEME: Final = "redis+sentinel"
REDIS_SCHEMES: Final = ("redis", "rediss", "unix", SENTINEL_SCHEME)
SENTINEL_PORT: Final = 26379
SENTINEL_PASSWORD_PARAM: Final = "sentinel_password"
MASK: Final = "***"


@dataclass(frozen=True)
class SentinelTarget:
    """A Sentinel-managed primary: the group's name, the sentinels, and credentials."""

    master: str
    hosts: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def url(self) -> str:
        """The ``redis+sentinel://`` URL of this target.

        :func:`parse_sentinel_url` parses it back to an equal target.
        """
        auth = ""
        if self.password is not None:
            user = quote(self.username or "", safe="")
            auth = f"{user}:{quote(self.password, safe='')}@"
        elif self.username:
            auth = f"{quote(self.username, safe='')}@"
        hosts = ",".join(f"{_host_text(h)}:{p}" for h, p in self.hosts)
        query = ""
        if self.sentinel_password is not None:
            query = "?" + urlencode({SENTINEL_PASSWORD_PARAM: self.sentinel_password})
        return f"{SENTINEL_SCHEME}://{auth}{hosts}/{quote(self.master, safe='')}/{self.db}{query}"


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The target of a ``redis+sentinel://`` URL.

    ValueError with a one-line reason, which never contains a password.
    """
    rest = url.strip()[len(SENTINEL_SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        hostlist, userinfo = netloc, ""
    username, password = _credentials(userinfo) if at else (None, None)
    hosts = tuple(_sentinel_host(text) for text in hostlist.split(","))
    parts = [unquote(p) for p in path.split("/") if p]
    if not parts:
        raise ValueError("names no master: write redis+sentinel://HOST:PORT,.../MASTER[/db]")
    if len(parts) > 2:
        raise ValueError("has more than MASTER/db in its path")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"database must be a non-negative integer, got {parts[1]!r}")
        db = int(parts[1])
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - {SENTINEL_PASSWORD_PARAM})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (only {SENTINEL_PASSWORD_PARAM})")
    return SentinelTarget(
        master=parts[0],
        hosts=hosts,
        db=db,
        username=username,
        password=password,
        sentinel_password=options.get(SENTINEL_PASSWORD_PARAM),
    )


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _sentinel_host(text: str) -> tuple[str, int]:
    text = text.strip()
    if not text:
        raise ValueError("has an empty sentinel address")
    if text.startswith("["):  # [IPv6]:port
        host, _, port_text = text[1:].partition("]")
        port_text = port_text.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"has a sentinel address without a host: {text!r}")
    if not port_text:
        return host, SENTINEL_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"has a sentinel port that is not 1-65535: {text!r}")
    return host, int(port_text)


def _host_text(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def mask_url_password(url: str) -> str:
    """``url`` with its passwords (if any) replaced by ``***``. Fit to print or log."""
    if is_sentinel_url(url):
        return _mask_sentinel(url)
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{hostinfo}"))


def _mask_sentinel(url: str) -> str:
    head, sep, query = url.partition("?")
    scheme, _, rest = head.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + MASK
    masked = f"{scheme}://{userinfo}{at}{hosts}{slash}{path}"
    if sep:
        pairs = parse_qsl(query, keep_blank_values=True)
        shown = [(k, MASK if k == SENTINEL_PASSWORD_PARAM else v) for k, v in pairs]
        masked += "?" + urlencode(shown, safe="*")
    return masked

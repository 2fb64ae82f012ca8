"""The one Redis connection factory: every vmpool process makes its clients here.

:func:`connect` (and :func:`connect_async` for the API's event loop) takes a URL and the
``:redis:`` settings (:class:`RedisOptions`). The URL is any form vmpool accepts
(:mod:`vmpool.state.redis_target`): one server, or a Sentinel group.

The client it gives:

- Finds the primary through the sentinels for a ``redis+sentinel://`` URL. That is the
  address a majority of them name (:class:`~vmpool.state.sentinel.MajoritySentinel`).
- Follows a failover. The client watches the group (:mod:`vmpool.state.group_watch`):
  every connection leads to the primary a majority of the sentinels name now, and one
  open to another server reopens there before it sends
  (:class:`~vmpool.state.sentinel.FollowingConnection`). A connection that meets
  READONLY (its server became a replica) is dropped, the sentinels are asked again,
  and the command is retried where they name.
- Notices a dead or frozen connection within bounded time. It has a socket timeout on
  every read (``socket_timeout``), a connect timeout, a PING before reusing a connection
  idle for ``health_check_interval``, and TCP keepalive (:data:`KEEPALIVE`) for peers
  that vanish while a connection idles.
- Retries a command that meets a dead connection once, on a new connection (not
  inside :func:`one_try`: a blocking command with a deadline). A server restart costs
  no error. The pool's idle connections are closed with it
  (:class:`ResettingRetry`): they lead to the same dead or frozen server, and would each
  cost one more socket timeout.
- Confirms the durability of every script it runs (:mod:`vmpool.state.durability`):
  through Sentinel, held by every replica the sentinels could promote.

RQ needs ``decode_responses=False``. The store works with either.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import inspect
import socket
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, cast

import redis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from vmpool.state.durability import (
    ConfirmingAsyncRedis,
    ConfirmingRedis,
    DurabilitySetting,
    resolve_durability,
)
from vmpool.state.group_watch import Address, FollowingDurability, GroupWatch, read_view
from vmpool.state.redis_target import SentinelTarget, is_sentinel_url, parse_sentinel_url
from vmpool.state.sentinel import (
    AsyncFollowingConnection,
    AsyncMajoritySentinel,
    FollowingConnection,
    MajoritySentinel,
)

__all__ = [
    "KEEPALIVE",
    "RETRY_ON",
    "RedisOptions",
    "connect",
    "connect_async",
    "node_kwargs",
    "one_try",
    "sentinel_clients",
]

# TCP keepalive on every connection: the first probe after 10 s idle, then every 5 s,
# given up after 3 unanswered: a peer gone without a word is noticed within ~25 s even
# by a connection that sends nothing (a pubsub, an idle pool member).
KEEPALIVE: Final[dict[int, int]] = {
    opt: value
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if (opt := getattr(socket, name, None)) is not None
}
# One retry, soon, on a new connection: enough for a pooled connection a restart or a
# failover left dead. More retries would multiply the socket timeout a frozen Redis
# costs before the process hears of it.
RETRY_ON: Final = (redis.ConnectionError, redis.TimeoutError)
_RETRIES: Final = 1
_BACKOFF: Final = ExponentialBackoff(cap=0.5, base=0.05)
# Set inside :func:`one_try`: the commands of this thread (or task) are sent once.
_ONE_TRY: Final[ContextVar[bool]] = ContextVar("vmpool_one_try", default=False)


@contextlib.contextmanager
def one_try() -> Iterator[None]:
    """The commands sent inside are not retried: a dead connection raises at once.

    For a blocking command that ends at a deadline (the scheduler's wait for a wake-up):
    redis-py's retry sends it again with the whole of its timeout, counted from the
    retry, so a connection killed in the middle of a 1 s block made it last up to 2 s.
    The connection is closed as on any failure; the caller decides what to do. The same
    for an asyncio client (vmpool.state.direct_pipeline: a batch overdue on its own
    connection, sent once more).
    """
    token = _ONE_TRY.set(True)
    try:
        yield
    finally:
        _ONE_TRY.reset(token)


class _PoolRetry:
    """The retry of one client's connections: a failure closes the idle ones too.

    redis-py deep-copies the retry into each connection. The pool it resets is shared, not
    copied. A connection that failed (timed out, reset) leads to a server its idle siblings
    lead to, and they are most likely as dead: a node gone, frozen connections. They are
    closed at once. The next commands then reconnect, instead of each waiting out its own
    socket timeout, one after the other.
    """

    pool: Any = None
    # Through Sentinel: called on every failure, before the retry. A demoted primary
    # (READONLY) or a lost server is a reason to ask the sentinels again, and the retry
    # goes where they name.
    refresh: Callable[[], Any] | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        clone = copy.copy(self)
        clone._backoff = copy.deepcopy(self._backoff, memo)  # type: ignore[attr-defined]
        return clone


class ResettingRetry(_PoolRetry, Retry):
    def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        def failed(error: Exception, *rest: Any) -> Any:
            if self.refresh is not None:
                self.refresh()
            if self.pool is not None:
                self.pool.disconnect(inuse_connections=False)
            return fail(error, *rest)

        if _ONE_TRY.get():
            try:
                return do()
            except self._supported_errors as error:  # type: ignore[misc]
                if kwargs.get("with_failure_count", len(args) > 1 and args[1]):
                    failed(error, 1)  # the first failure, and the last
                else:
                    failed(error)
                raise
        return super().call_with_retry(do, failed, *args, **kwargs)


class AsyncResettingRetry(_PoolRetry, AsyncRetry):
    async def call_with_retry(self, do: Any, fail: Any, *args: Any, **kwargs: Any) -> Any:
        async def failed(error: Exception, *rest: Any) -> Any:
            if self.refresh is not None:
                await asyncio.to_thread(self.refresh)
            if self.pool is not None:
                await self.pool.disconnect(inuse_connections=False)
            result = fail(error, *rest)
            return await result if inspect.isawaitable(result) else result

        if _ONE_TRY.get():
            try:
                return await do()
            except self._supported_errors as error:  # type: ignore[misc]
                if kwargs.get("with_failure_count", len(args) > 1 and args[1]):
                    await failed(error, 1)  # the first failure, and the last
                else:
                    await failed(error)
                raise
        return await super().call_with_retry(do, failed, *args, **kwargs)


@dataclass(frozen=True)
class RedisOptions:
    """The ``:redis:`` settings a connection is made with, in seconds.

    Defaults and bounds: :class:`vmpool.config.settings.RedisSection`.
    """

    socket_timeout_s: float
    connect_timeout_s: float
    health_check_interval_s: float
    durability: DurabilitySetting

    def client_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments for a client (or a connection pool)."""
        return {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "socket_keepalive": True,
            "socket_keepalive_options": dict(KEEPALIVE),
            "health_check_interval": self.health_check_interval_s,
        }

    def sentinel_kwargs(self, target: SentinelTarget) -> dict[str, Any]:
        """Keyword arguments of the connections to the sentinels themselves.

        No retry: a question to the sentinels goes to each of them, and one dead is one
        voice missing. redis-py's default (10 retries with backoff) spent about 5 s on each
        dead server, and a view of the group made that slowly was stale when it came.
        """
        kwargs: dict[str, Any] = {
            "socket_timeout": self.socket_timeout_s,
            "socket_connect_timeout": self.connect_timeout_s,
            "socket_keepalive": True,
            "socket_keepalive_options": dict(KEEPALIVE),
            "retry": Retry(NoBackoff(), 0),
        }
        if target.sentinel_password is not None:
            kwargs["password"] = target.sentinel_password
        return kwargs


def connect(
    url: str,
    options: RedisOptions,
    *,
    decode_responses: bool,
    max_connections: int | None = None,
) -> ConfirmingRedis:
    """A client of the Redis at ``url`` (see the module docstring).

    Nothing is sent until it is used.
    """
    kwargs = options.client_kwargs()
    retry = ResettingRetry(_BACKOFF, _RETRIES, supported_errors=RETRY_ON)
    kwargs["retry"] = retry
    kwargs["decode_responses"] = decode_responses
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    client: ConfirmingRedis
    if not is_sentinel_url(url):
        client = cast(ConfirmingRedis, ConfirmingRedis.from_url(url, **kwargs))
        client.durability = resolve_durability(options.durability)
        retry.pool = client.connection_pool  # before any connection copies the retry
        return client
    target = parse_sentinel_url(url)
    sentinel = MajoritySentinel(  # type: ignore[no-untyped-call]
        list(target.hosts), sentinel_kwargs=options.sentinel_kwargs(target)
    )
    following = _following(sentinel, target, options)
    if following is not None:
        kwargs["named_primary"] = following.watch.named_primary
        retry.refresh = following.watch.refresh
    client = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.master, redis_class=ConfirmingRedis, connection_class=FollowingConnection,
        **_auth(target), **kwargs,
    )  # fmt: skip
    _follow(client, following, options)
    retry.pool = client.connection_pool  # before any connection copies the retry
    return client


def connect_async(
    url: str, options: RedisOptions, *, decode_responses: bool
) -> ConfirmingAsyncRedis:
    """:func:`connect` for asyncio: one per event loop (a connection belongs to its loop).

    Through Sentinel it watches the group with synchronous clients of its own, in the
    watch's thread.
    """
    kwargs = options.client_kwargs()
    retry = AsyncResettingRetry(_BACKOFF, _RETRIES, supported_errors=RETRY_ON)
    kwargs["retry"] = retry
    kwargs["decode_responses"] = decode_responses
    client: ConfirmingAsyncRedis
    if not is_sentinel_url(url):
        client = cast(ConfirmingAsyncRedis, ConfirmingAsyncRedis.from_url(url, **kwargs))
        client.durability = resolve_durability(options.durability)
        retry.pool = client.connection_pool  # before any connection copies the retry
        return client
    target = parse_sentinel_url(url)
    sentinels = AsyncMajoritySentinel(  # type: ignore[no-untyped-call]
        list(target.hosts), sentinel_kwargs=options.sentinel_kwargs(target)
    )
    watcher = MajoritySentinel(  # type: ignore[no-untyped-call]
        list(target.hosts), sentinel_kwargs=options.sentinel_kwargs(target)
    )
    following = _following(watcher, target, options)
    if following is not None:
        kwargs["named_primary"] = following.watch.named_primary
        retry.refresh = following.watch.refresh
    client = sentinels.master_for(
        target.master, redis_class=ConfirmingAsyncRedis,
        connection_class=AsyncFollowingConnection, **_auth(target), **kwargs,
    )  # fmt: skip
    _follow(client, following, options)
    retry.pool = client.connection_pool  # before any connection copies the retry
    return client


def _following(
    sentinel: Sentinel, target: SentinelTarget, options: RedisOptions
) -> FollowingDurability | None:
    """The durability that follows ``target``'s group (None: ``durability: none``)."""
    setting = options.durability
    if setting.mode == "none":
        return None
    reader = _ReplicationReader(node_kwargs(target, options))
    watch = GroupWatch(functools.partial(read_view, sentinel.sentinels, target.master, reader))
    return FollowingDurability(watch, setting.replicas, setting.timeout_s)


def _follow(
    client: ConfirmingRedis | ConfirmingAsyncRedis,
    following: FollowingDurability | None,
    options: RedisOptions,
) -> None:
    client.via_sentinel = True
    if following is None:
        client.durability = resolve_durability(options.durability)
    else:
        client.source = following


def node_kwargs(target: SentinelTarget, options: RedisOptions) -> dict[str, Any]:
    """Keyword arguments of a client of one data node of ``target``'s group.

    Its credentials, the socket settings of the sentinels' clients (no retry); no
    database.
    """
    kwargs = {k: v for k, v in options.sentinel_kwargs(target).items() if k != "password"}
    kwargs.update(_auth(target))
    kwargs.pop("db", None)
    return kwargs


def sentinel_clients(target: SentinelTarget, options: RedisOptions) -> list[redis.Redis]:
    """A client of each of ``target``'s sentinels (for an operator's command)."""
    return [
        redis.Redis(host=host, port=port, **options.sentinel_kwargs(target))
        for host, port in target.hosts
    ]


# Clients a replication reader keeps: a group's data nodes, with room for the addresses
# a restarted pod leaves behind (the oldest asked is closed beyond it).
READER_CLIENTS: Final = 8


class _ReplicationReader:
    """``INFO replication`` of a server the watch names, on one client per address.

    Called from the watch's refresh only (one at a time). The :data:`READER_CLIENTS`
    addresses asked last keep their client; an older one's is closed (a pod's old
    address is never asked again).
    """

    def __init__(self, kwargs: dict[str, Any], keep: int = READER_CLIENTS) -> None:
        self.kwargs = kwargs
        self.keep = keep
        self.clients: dict[Address, redis.Redis] = {}  # in the order last asked

    def __call__(self, address: Address) -> dict[str, Any]:
        client = self.clients.pop(address, None)
        if client is None:
            client = redis.Redis(host=address[0], port=address[1], **self.kwargs)
        self.clients[address] = client
        while len(self.clients) > self.keep:
            self.clients.pop(next(iter(self.clients))).close()
        return dict(client.info("replication"))


def _auth(target: SentinelTarget) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"db": target.db}
    if target.username is not None:
        kwargs["username"] = target.username
    if target.password is not None:
        kwargs["password"] = target.password
    return kwargs

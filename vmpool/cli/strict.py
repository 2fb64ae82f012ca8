"""``--strict``: refuse to start on a Redis not set up as vmpool assumes.

Every long-running command (api, worker, scheduler, up) checks Redis's
``maxmemory-policy``, persistence and the durability of its writes when it starts
(vmpool/state/redis_check.py): a warning per problem, or, with ``--strict``
(``VMPOOL_STRICT=1``), one line and exit 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click
import redis

from vmpool.cli.errors import CliFailure
from vmpool.config import mask_url_password
from vmpool.state.connection import RedisOptions, connect
from vmpool.state.redis_check import RedisCheck, RedisMisconfigured, startup_check

__all__ = ["STRICT_ENV", "check_redis_at_start", "strict_option"]

STRICT_ENV = "VMPOOL_STRICT"

F = TypeVar("F", bound=Callable[..., object])


def strict_option(func: F) -> F:
    return click.option(
        "--strict",
        is_flag=True,
        envvar=STRICT_ENV,
        help="Refuse to start (exit 1) when Redis is not set up as vmpool assumes"
        " (maxmemory-policy noeviction, appendonly yes, appendfsync always; through Sentinel,"
        f" writes that wait for a replica); without it, a warning [env {STRICT_ENV}].",
    )(func)


def check_redis_at_start(
    url: str, options: RedisOptions, *, who: str, strict: bool
) -> RedisCheck | None:
    """The start-up check on its own short-lived connection.

    An unreachable Redis is left to the command's own handling (it waits, or says so in
    one line): None."""
    client = connect(url, options, decode_responses=False)
    try:
        return startup_check(client, who=who, strict=strict)
    except RedisMisconfigured as exc:
        raise CliFailure(f"{exc} (redis {mask_url_password(url)})") from None
    except redis.ConnectionError:
        return None
    finally:
        client.close()

"""rq-dashboard beside the fleet on one machine (``vmpool up --dashboard``).

rq-dashboard (the ``dashboard`` extra: ``pip install 'vmpool[dashboard]'``) shows RQ's
queues, jobs and workers on the same Redis. It runs as one more supervised child. The
Redis URL reaches it through ``RQ_DASHBOARD_REDIS_URL`` (rq-dashboard reads its options
from ``RQ_DASHBOARD_*`` variables), never the command line, where any user of the
machine could read a password in it. ``RQ_DASHBOARD_USERNAME`` / ``_PASSWORD`` set in the
environment of ``vmpool up`` turn on its basic auth.
"""

from __future__ import annotations

import importlib.util
import sys
import urllib.error
import urllib.request
from dataclasses import replace

from vmpool.local.supervisor import ChildSpec
from vmpool.state.redis_target import is_sentinel_url, parse_sentinel_url

__all__ = [
    "DEFAULT_PORT",
    "dashboard_answers",
    "dashboard_installed",
    "dashboard_redis_env",
    "dashboard_spec",
]

DEFAULT_PORT = 9181  # rq-dashboard's own default


def dashboard_installed() -> bool:
    return importlib.util.find_spec("rq_dashboard") is not None


def dashboard_spec(*, host: str, port: int, redis_url: str) -> ChildSpec:
    argv = [sys.executable, "-m", "rq_dashboard", "--bind", host, "--port", str(port)]
    return ChildSpec("dashboard", argv, dashboard_redis_env(redis_url))


def dashboard_redis_env(redis_url: str) -> dict[str, str]:
    """The variables that give rq-dashboard vmpool's Redis.

    It reads ``redis+sentinel://[:password@]h1:26379,.../MASTER[/db]`` itself, but not
    vmpool's ``sentinel_password`` query option (it would ignore it without a word): that
    goes in ``RQ_DASHBOARD_REDIS_SENTINEL_PASSWORD`` instead."""
    if not is_sentinel_url(redis_url):
        return {"RQ_DASHBOARD_REDIS_URL": redis_url}
    target = parse_sentinel_url(redis_url)
    env = {"RQ_DASHBOARD_REDIS_URL": replace(target, sentinel_password=None).url()}
    if target.sentinel_password is not None:
        env["RQ_DASHBOARD_REDIS_SENTINEL_PASSWORD"] = target.sentinel_password
    return env


def dashboard_answers(url: str) -> bool:
    """True once the dashboard serves HTTP (401 counts: basic auth is on)."""
    try:
        with urllib.request.urlopen(url + "/", timeout=2) as resp:
            return bool(resp.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError):
        return False

"""rq-dashboard beside the fleet on one machine (``vmpool up --dashboard``).

rq-dashboard (the ``dashboard`` extra: ``pip install 'vmpool[dashboard]'``) shows RQ's
queues, jobs and workers on the same Redis. It runs as one more supervised child. The
Redis URL reaches it through ``RQ_DASHBOARD_REDIS_URL`` (rq-dashboard reads its options
from ``RQ_DASHBOARD_*`` variables), never the command line, where any user of the
machine could read a password in it; ``RQ_DASHBOARD_USERNAME`` / ``_PASSWORD`` set in the
environment of ``vmpool up`` turn on its basic auth.
"""

from __future__ import annotations

import importlib.util
import sys
import urllib.error
import urllib.request

from vmpool.local.supervisor import ChildSpec

__all__ = ["DEFAULT_PORT", "dashboard_answers", "dashboard_installed", "dashboard_spec"]

DEFAULT_PORT = 9181  # rq-dashboard's own default


def dashboard_installed() -> bool:
    return importlib.util.find_spec("rq_dashboard") is not None


def dashboard_spec(*, host: str, port: int, redis_url: str) -> ChildSpec:
    argv = [sys.executable, "-m", "rq_dashboard", "--bind", host, "--port", str(port)]
    return ChildSpec("dashboard", argv, {"RQ_DASHBOARD_REDIS_URL": redis_url})


def dashboard_answers(url: str) -> bool:
    """True once the dashboard serves HTTP (401 counts: basic auth is on)."""
    try:
        with urllib.request.urlopen(url + "/", timeout=2) as resp:
            return bool(resp.status < 500)
    except urllib.error.HTTPError as exc:
        return exc.code == 401
    except (urllib.error.URLError, OSError):
        return False

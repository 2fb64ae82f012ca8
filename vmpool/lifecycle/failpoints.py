"""Named failpoints: places in vmpool's steps where a test can pause or kill the process.

Off unless ``VMPOOL_FAILPOINTS`` is set in the process's environment, which only tests
and chaos runs do. The value is a comma-separated list of ``POINT=ACTION[@ONCE_FILE]``:

- ``stop``: the process sends itself SIGSTOP, exactly at that point (a test then waits
  past the lock's expiry and sends SIGCONT): a GC pause or a frozen VM, modelled.
- ``kill``: SIGKILL itself there (a crash between two steps).
- ``sleep:SECONDS``: sleep there.
- ``raise``: raise :class:`FailpointError`.

With ``@ONCE_FILE`` the action fires only for the first process that creates that file
(``O_CREAT|O_EXCL``), so one failpoint fires once across a whole fleet sharing a
filesystem. The points are named ``<step>.<where>``, e.g. ``create_vm.before_commit``
(the API's: ``api.<where>``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

ENV = "VMPOOL_FAILPOINTS"


class FailpointError(RuntimeError):
    pass


def _first_time(path: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def failpoint(name: str, env: Mapping[str, str] | None = None) -> None:
    """Run the action configured for ``name``, if any. Otherwise do nothing (cheap)."""
    spec = (os.environ if env is None else env).get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        point, _, action = item.strip().partition("=")
        if point != name or not action:
            continue
        action, _, once_file = action.partition("@")
        if once_file and not _first_time(once_file):
            return
        kind, _, arg = action.partition(":")
        if kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "sleep":
            time.sleep(float(arg or "1"))
        elif kind == "raise":
            raise FailpointError(f"failpoint {name}")
        return

"""The vSphere provider's session with vCenter: credentials, connecting, health.

A session is checked with ``CurrentTime`` (vmpooler's health check) before its next
call after a failure that may have been the session's (a dropped connection, an expired
login: ``suspect()``) or after ``health_check_s`` unused, and made again when the check
fails. Between those, calls go straight through: no extra round trip per call.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from vmpool.providers.base import PermanentProviderError
from vmpool.providers.vsphere.adapter import VSphereAdapter
from vmpool.providers.vsphere.options import VSphereOptions, split_server

__all__ = ["Session", "connect", "credentials"]

log = logging.getLogger(__name__)


def credentials(name: str, o: VSphereOptions) -> tuple[str, str]:
    """The user and password.

    The options, else VSPHERE_USER / VSPHERE_PASSWORD, else ``password_file``."""
    user = o.username or os.environ.get("VSPHERE_USER")
    password = o.password.get_secret_value() if o.password else None
    password = password or os.environ.get("VSPHERE_PASSWORD")
    if not password and o.password_file:
        try:
            password = Path(o.password_file).read_text().strip()
        except OSError as exc:
            raise PermanentProviderError(
                f"configuration error: provider {name!r} cannot read password_file"
                f" {o.password_file!r} ({exc.strerror})"
            ) from None
    if not user or not password:
        raise PermanentProviderError(
            f"configuration error: provider {name!r} has no vCenter credentials"
            " (username/password, VSPHERE_USER/VSPHERE_PASSWORD, or password_file)"
        )
    return user, password


def connect(name: str, o: VSphereOptions) -> VSphereAdapter:
    """A new session with the vCenter of ``server`` (pyVmomi is imported now)."""
    try:
        from vmpool.providers.vsphere.pyvmomi_adapter import PyVmomiAdapter
    except ImportError as exc:
        raise PermanentProviderError(
            f"configuration error: provider {name!r} needs pyVmomi"
            f" (pip install 'vmpool[vsphere]'): {exc}"
        ) from None
    host, port = split_server(o.server)
    user, password = credentials(name, o)
    return PyVmomiAdapter(
        host,
        port,
        user,
        password,
        insecure=o.insecure,
        ca_file=o.ca_file,
        timeout=o.timeout,
        task_timeout=o.task_timeout,
    )


class Session:
    """The provider's one session, made on first use and again when it is gone."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], VSphereAdapter],
        clock: Callable[[], float],
        calls: Counter[str],
        health_check_s: float = 60.0,
    ) -> None:
        self.name = name
        self._connect = connect
        self._clock = clock
        self._calls = calls
        self.health_check_s = health_check_s
        self._adapter: VSphereAdapter | None = None
        self._used = clock()
        self._suspect = False
        self._lock = threading.Lock()

    def suspect(self) -> None:
        """The last call failed in a way that may have been the session's."""
        self._suspect = True

    def adapter(self) -> VSphereAdapter:
        """The session, checked first when suspect or unused for ``health_check_s``."""
        with self._lock:
            now = self._clock()
            stale = self._suspect or now - self._used > self.health_check_s
            if self._adapter is not None and stale:
                self._calls["health"] += 1
                try:
                    self._adapter.current_time()
                except Exception as exc:
                    log.info("%s: vCenter session lost (%s); reconnecting", self.name, exc)
                    self._adapter.close()
                    self._adapter = None
            if self._adapter is None:
                self._calls["connect"] += 1
                self._adapter = self._connect()
            self._suspect = False
            self._used = now
            return self._adapter

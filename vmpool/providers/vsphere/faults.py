"""vSphere faults, and which of them a retry can fix.

The adapter (``pyvmomi_adapter``) turns every fault vCenter answers, a call's or a
failed task's, into a :class:`VSphereFault` carrying the fault's type name and its
ancestors' (``InsufficientCpuResourcesFault``, ``InsufficientResourcesFault``,
``VimFault``, ...), so that the provider and the tests' in-memory adapter speak of
faults without pyVmomi. :func:`classify` sorts them, the most specific name first:

- quota (:class:`QuotaExceededError`): the cluster or host lacks the resources or the
  licence (``InsufficientResourcesFault`` and its kind, ``NoDiskSpace``, ...)
- transient: vCenter or a host is busy or unreachable (``TaskInProgress``,
  ``InvalidState``, ``HostCommunication``, ``NotAuthenticated``: an expired session,
  re-established on the next call), a stale reference (``ManagedObjectNotFound``), any
  other system fault (``RuntimeFault``), timeouts and dropped connections
- permanent: the request is wrong (``NoPermission``, ``NotFound``, ``InvalidLogin``,
  ``DuplicateName``, ``InvalidArgument``, any other ``VimFault``).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Final

from vmpool.providers.base import (
    PermanentProviderError,
    ProviderError,
    QuotaExceededError,
    TransientProviderError,
    is_permanent_error,
)

__all__ = ["PERMANENT", "QUOTA", "RECONNECT", "TRANSIENT", "VSphereFault", "classify"]


class VSphereFault(Exception):
    """A fault vCenter answered: ``kinds`` is its type name, then its ancestors'."""

    def __init__(self, kinds: Sequence[str], message: str = "") -> None:
        self.kinds = tuple(kinds) or ("MethodFault",)
        self.message = message or self.kinds[0]
        super().__init__(f"{self.kinds[0]}: {self.message}")

    @property
    def kind(self) -> str:
        return self.kinds[0]

    def is_a(self, kind: str) -> bool:
        return kind in self.kinds


QUOTA: Final = frozenset(
    {
        "InsufficientResourcesFault",  # the parent of the CPU, memory, host capacity, ...
        "InsufficientStorageSpace",
        "NoDiskSpace",
        "NotEnoughLicenses",
        "VmLimitLicense",
    }
)
# The session is gone (expired, or vCenter restarted): reconnect, then retry.
RECONNECT: Final = frozenset({"NotAuthenticated"})
TRANSIENT: Final = frozenset(
    {
        *RECONNECT,
        "TaskInProgress",
        "InvalidState",  # InvalidPowerState, InvalidHostState, ...: the object is busy
        "HostCommunication",
        "HostConnectFault",
        "HostNotConnected",
        "HostNotReachable",
        "Timedout",
        "RequestCanceled",
        "ConcurrentAccess",
        "ResourceInUse",
        "FileLocked",
        # a reference gone stale (the adapter forgets what it had looked up): look again
        "ManagedObjectNotFound",
        "RuntimeFault",  # a system fault: SystemError, HostCommunication, ...
    }
)
# Looked for in the same pass, most specific name first: NoPermission decides before
# its ancestor RuntimeFault does (NotAuthenticated, a NoPermission, before either).
PERMANENT: Final = frozenset(
    {
        "NotFound",
        "DuplicateName",
        "InvalidName",
        "InvalidDatastore",
        "FileNotFound",
        "AlreadyExists",
        "NoPermission",
        "InvalidLogin",
        "InvalidArgument",
        "InvalidRequest",
        "NotSupported",
        "NotImplemented",
        "InvalidType",
        "VimFault",  # any other fault of the application: a wrong request
    }
)


def classify(exc: BaseException) -> ProviderError:
    """``exc`` as a :class:`ProviderError`.

    quota, transient or permanent, with vCenter's own message."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, VSphereFault):
        return _fault(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return PermanentProviderError(
            f"configuration error: vCenter's certificate: {exc} (set ca_file, or insecure)"
        )
    if isinstance(exc, OSError):  # a dropped connection, a timeout: the next call may pass
        return TransientProviderError(f"{type(exc).__name__}: {exc}")
    if is_permanent_error(exc):  # a TypeError, ...: vmpooler's permanent_error?
        return PermanentProviderError(f"{type(exc).__name__}: {exc}")
    # http.client's errors (BadStatusLine, IncompleteRead, ...): the next call may pass.
    return TransientProviderError(f"{type(exc).__name__}: {exc}")


def _fault(fault: VSphereFault) -> ProviderError:
    message = f"{fault.kind}: {fault.message}" if fault.message != fault.kind else fault.kind
    for kind in fault.kinds:  # the most specific name decides
        if kind in QUOTA:
            return QuotaExceededError(message)
        if kind in TRANSIENT:
            return TransientProviderError(message)
        if kind in PERMANENT:
            return PermanentProviderError(message)
    return TransientProviderError(message)

"""Which cloud failures a retry can fix, read from libcloud's exceptions.

Transient (retried with backoff, ``Retry-After`` respected): throttling (429,
``RequestLimitExceeded``, ``Throttling``), 5xx, timeouts and connection errors.
Quota and capacity (:class:`~vmpool.providers.QuotaExceededError`, a transient error
that is not retried in the call: the VM waits reserved until capacity frees): EC2's
``VcpuLimitExceeded``, ``InstanceLimitExceeded``, ``InsufficientInstanceCapacity``,
Nova's 403 "Quota exceeded", GCE's ``QUOTA_EXCEEDED`` and
``ZONE_RESOURCE_POOL_EXHAUSTED``.
Permanent (the VM fails at once, with the cloud's message): bad credentials, missing
image or key pair, invalid parameters, any other 4xx.

libcloud is imported only when a cloud call has failed, so a fleet without a cloud
provider never imports it (the demo runs without the ``cloud`` extra).
"""

from __future__ import annotations

import socket
import ssl
from typing import Any, Final

from vmpool.providers.base import (
    PermanentProviderError,
    ProviderError,
    QuotaExceededError,
    TransientProviderError,
    is_permanent_error,
)

__all__ = [
    "QUOTA_CODES",
    "TRANSIENT_CODES",
    "backoff_s",
    "classify",
    "is_final",
    "retry_after_of",
]

# Error codes and words (EC2's, GCE's, Nova's) that say "no capacity for you now": the
# account's limits or the zone's stock. Waiting helps. Retrying at once does not.
QUOTA_CODES: Final = (
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "MaxSpotInstanceCountExceeded",
    "VolumeLimitExceeded",
    "QUOTA_EXCEEDED",
    "quotaExceeded",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "Quota exceeded",
)

# Error codes (EC2's, OpenStack's and GCE's reasons) that say "later", whatever the HTTP
# status carrying them.
TRANSIENT_CODES: Final = (
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "Unavailable",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "RESOURCE_EXHAUSTED",
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "backendError",
)


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds the cloud asked us to wait (``Retry-After``), when it said."""
    value = getattr(exc, "retry_after", None)
    if value is None:
        headers = getattr(exc, "headers", None) or {}
        value = {str(k).lower(): v for k, v in dict(headers).items()}.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def backoff_s(attempt: int, error: ProviderError, base: float, ceiling: float) -> float:
    """The wait before retrying a failed call: ``base`` doubled per attempt.

    At least what the cloud asked for (``Retry-After``), at most ``ceiling``."""
    delay = base * 2.0**attempt
    asked = retry_after_of(error)
    if asked is not None:
        delay = max(delay, asked)
    return min(delay, ceiling)


def is_final(error: ProviderError) -> bool:
    """Whether a failed call is not retried by the provider itself.

    A permanent error, or the cloud's quota (the VM waits reserved for capacity, and a
    worker sleeping on it helps nobody)."""
    return error.permanent or isinstance(error, QuotaExceededError)


def _transient(message: str, exc: BaseException) -> TransientProviderError:
    error = TransientProviderError(message)
    error.retry_after = retry_after_of(exc)  # type: ignore[attr-defined]
    return error


def _says_later(message: str) -> bool:
    return any(code.lower() in message.lower() for code in TRANSIENT_CODES)


def _says_quota(message: str) -> bool:
    return any(code.lower() in message.lower() for code in QUOTA_CODES)


def _quota(message: str, exc: BaseException) -> QuotaExceededError:
    error = QuotaExceededError(message)
    error.retry_after = retry_after_of(exc)  # type: ignore[attr-defined]
    return error


def _http_code(exc: BaseException) -> int | None:
    """The HTTP status of a failed call.

    libcloud puts it in ``code`` or, for Google, ``http_code``, whose ``code`` is a reason
    such as ``notFound``."""
    for attr in ("http_code", "code"):
        try:
            return int(getattr(exc, attr))
        except (TypeError, ValueError, AttributeError):
            continue
    return None


def _cloud_message(exc: BaseException) -> str:
    """The cloud's words: its error code first, then its message and HTTP status.

    The error code is Google's reason or operation code, which libcloud keeps apart from
    the message."""
    message = getattr(exc, "message", None) or getattr(exc, "value", None) or str(exc)
    if isinstance(message, dict):  # Google's error item: {'reason', 'message', ...}
        message = f"{message.get('reason', '')}: {message.get('message', '')}".strip(": ")
    code = _http_code(exc)
    text = str(message).strip() or type(exc).__name__
    reason = getattr(exc, "code", None)
    if isinstance(reason, str) and reason and not reason.isdigit() and reason not in text:
        text = f"{reason}: {text}"
    return f"{text} (HTTP {code})" if code else text


def classify(exc: BaseException) -> ProviderError:
    """``exc`` as a :class:`ProviderError` whose ``permanent`` says whether to retry.

    It carries the cloud's own message (and ``retry_after`` when the cloud gave one)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, (socket.timeout, TimeoutError, ConnectionError, ssl.SSLError)):
        return _transient(f"{type(exc).__name__}: {exc}", exc)
    message = _cloud_message(exc)
    if _says_quota(message) or type(exc).__name__ == "QuotaExceededError":
        return _quota(message, exc)
    verdict = _libcloud_verdict(exc)
    if verdict is not None:
        return verdict
    if isinstance(exc, OSError) or _says_later(message):
        return _transient(message, exc)
    if is_permanent_error(exc):
        return PermanentProviderError(message)
    return _transient(message, exc)


def _libcloud_verdict(exc: BaseException) -> ProviderError | None:
    from libcloud.common import exceptions as lc_exc  # only once something failed
    from libcloud.common import types as lc_types
    from libcloud.compute import types as compute_types

    message = _cloud_message(exc)
    permanent: tuple[type[BaseException], ...] = (
        lc_types.InvalidCredsError,
        compute_types.KeyPairDoesNotExistError,
    )
    idempotent = _optional(("libcloud.compute.drivers.ec2", "IdempotentParamError"))
    if isinstance(exc, lc_exc.RateLimitReachedError):
        return _transient(f"rate limited: {message}", exc)
    if isinstance(exc, (*permanent, *idempotent)):
        return PermanentProviderError(message)
    google = _google_verdict(exc, message)
    if google is not None:
        return google
    if isinstance(exc, lc_types.ServiceUnavailableError):
        return _transient(message, exc)
    code = _http_code(exc)
    if code is None:
        return None
    if code == 429 or code >= 500 or _says_later(message):
        return _transient(message, exc)
    if 400 <= code < 500:
        return PermanentProviderError(message)
    return None


def _google_verdict(exc: BaseException, message: str) -> ProviderError | None:
    found = _optional(
        ("libcloud.common.google", "QuotaExceededError"),
        ("libcloud.common.google", "GoogleBaseError"),
    )
    if len(found) < 2:
        return None
    quota, base = found
    if isinstance(exc, quota):
        return _quota(message, exc)
    if isinstance(exc, base):
        code = _http_code(exc)
        if _says_later(message) or (code is not None and (code == 429 or code >= 500)):
            return _transient(message, exc)
        return PermanentProviderError(message)
    return None


def _optional(*names: tuple[str, str]) -> tuple[type[BaseException], ...]:
    """Exception classes that exist in this libcloud (modules import lazily)."""
    import importlib

    found: list[Any] = []
    for module, attr in names:
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(found)

"""Quotas and priorities at the API: what a POST may ask, what a checkout over quota
answers, where a pending request stands.

The counting and the checks that hold under any concurrency are the store's
(:mod:`vmpool.state.quotas`); here only what the caller's config says of one user, and
the words of the replies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vmpool.api.errors import Rejected
from vmpool.config import Config
from vmpool.state.quotas import NO_LIMITS, Place, QuotaLimits

__all__ = ["checkout_limits", "over_quota_message", "place_fields", "request_priority"]


def request_priority(config: Config, user: str, asked: int | None, vms: int) -> int:
    """The priority a new request of ``user`` for ``vms`` VMs takes.

    The priority it asked, else the user's. Rejected (403, vmpooler's shape) when it
    asks a priority above the user's, or more VMs than the user's whole quota (it could
    never be served).
    """
    quota = config.quotas.of(user)
    who = f"user {user}" if user else "a request without a token"
    if asked is not None and asked < quota.priority:
        raise Rejected(
            403,
            message=f"priority {asked} is above the highest {who} may ask ({quota.priority})",
        )
    if user and quota.max_vms is not None and vms > quota.max_vms:
        raise Rejected(
            403,
            message=f"requested {vms} VMs, over the quota of {who} (max_vms {quota.max_vms})",
        )
    return asked if asked is not None else quota.priority


def checkout_limits(config: Config, user: str) -> QuotaLimits:
    """The quota a checkout of ``user`` is checked against (the VMs' own cores count)."""
    if not user:
        return NO_LIMITS
    quota = config.quotas.of(user)
    return QuotaLimits(quota.max_vms, quota.max_cores)


def over_quota_message(config: Config, user: str, code: str, held: int, asked: int) -> str:
    """The message of a checkout refused for ``user``'s quota (``quota_max_vms`` ...)."""
    quota = config.quotas.of(user)
    name = code.removeprefix("quota_")
    limit = quota.max_vms if name == "max_vms" else quota.max_cores
    unit = "VMs" if name == "max_vms" else "cores"
    return (
        f"quota exceeded: user {user} holds {held} {unit} of {name} {limit};"
        f" {asked} more VMs asked, none handed out"
    )


def place_fields(place: Place | None) -> Mapping[str, Any]:
    """A pending request's ``position`` and ``eta_s`` (vmpool's, beside vmpooler's fields).

    ``eta_s`` is null while the request waits for its user's quota."""
    return {} if place is None else place.fields()

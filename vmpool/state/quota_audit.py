"""Invariant 11: no user holds more than their quota, now or ever (docs/invariants.md).

Checked by ``vmpool audit`` over what Redis holds, two ways that do not trust each other:

- **live**: the VMs whose record names a user (``quota_user``) in a counted state
  (reserved, booting, running), per user, against the user's quota, and against the
  count the scripts keep (``Keys.quota_vms``, ``Keys.quota_cores``): a count out of step
  with the records is reported too;
- **the trails**: every trail's entries replayed in time order, each VM counted for its
  user from the entry that starts its holding (reserved for a request, claimed from a
  warm pool, checked out) to the one that ends it: the most each user held at once (the
  per-user peak), against the quota. The trails outlive their records for ``data_ttl``,
  so the peak covers that much history.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from vmpool.state.records import AuditEntry, RequestRecord, VMRecord

__all__ = ["COUNTED", "Peak", "QuotaOf", "check_quotas", "user_peaks"]

# The states in which a VM counts against its user's quota (scripts/_quota.lua).
COUNTED = frozenset({"reserved", "pending", "running"})
CHECKOUT_REASON = "checked out by "

# A user's (max_vms, max_cores), None for no limit.
QuotaOf = Callable[[str], tuple[int | None, int | None]]


@dataclass(frozen=True)
class Peak:
    """The most a user held at once, by the trails."""

    vms: int
    cores: int


def _holdings(
    requests: Mapping[str, RequestRecord],
    request_trails: Sequence[Sequence[AuditEntry]],
    vm_trails: Mapping[str, Sequence[AuditEntry]],
) -> Iterable[tuple[str, str, AuditEntry]]:
    """Every entry that starts or ends a user's holding: (user, VM name, entry)."""
    for req, trail in zip(requests.values(), request_trails, strict=True):
        if not req.token_user:
            continue
        for e in trail:
            if e.entity.startswith("vm:") and ((e.src in COUNTED) != (e.dst in COUNTED)):
                yield req.token_user, e.entity[3:], e
    for name, trail in vm_trails.items():
        user = ""
        for e in trail:
            if e.src == "ready" and e.dst == "running":
                held_by = e.reason.removeprefix(CHECKOUT_REASON)
                user = held_by if e.reason.startswith(CHECKOUT_REASON) else ""
                if user == "anonymous":
                    user = ""
            if user and (e.src in COUNTED) != (e.dst in COUNTED):
                yield user, name, e


def user_peaks(
    requests: Mapping[str, RequestRecord],
    request_trails: Sequence[Sequence[AuditEntry]],
    vm_trails: Mapping[str, Sequence[AuditEntry]],
    vms: Mapping[str, VMRecord],
) -> dict[str, Peak]:
    """Per user, the most VMs (and cores) held at once, by replaying the trails.

    At one instant a VM freed counts before a VM taken (a unit that frees and one that
    takes cannot share a server time, but two entries may print the same)."""
    events = []
    for user, name, e in _holdings(requests, request_trails, vm_trails):
        cores = vms[name].cores if name in vms else 1
        delta = 1 if e.dst in COUNTED else -1
        events.append((e.time, delta, user, cores))
    held: dict[str, list[int]] = {}
    peaks: dict[str, Peak] = {}
    for _, delta, user, cores in sorted(events, key=lambda ev: (ev[0], ev[1])):
        now = held.setdefault(user, [0, 0])
        now[0] += delta
        now[1] += delta * cores
        best = peaks.get(user, Peak(0, 0))
        peaks[user] = Peak(max(best.vms, now[0]), max(best.cores, now[1]))
    return peaks


def check_quotas(
    counted: Mapping[str, tuple[int, int]],
    vms: Mapping[str, VMRecord],
    peaks: Mapping[str, Peak],
    quota_of: QuotaOf,
) -> list[tuple[str, str]]:
    """Invariant 11: (subject, what is wrong) for each user above quota, now or in the
    trails, and each user whose kept count (``counted``: user -> (VMs, cores), the
    scripts' hashes) is out of step with the records."""
    live: dict[str, list[int]] = {}
    for vm in vms.values():
        if vm.quota_user and vm.state in COUNTED:
            now = live.setdefault(vm.quota_user, [0, 0])
            now[0] += 1
            now[1] += vm.cores
    out: list[tuple[str, str]] = []
    for user in sorted(set(live) | set(counted) | set(peaks)):
        max_vms, max_cores = quota_of(user)
        vms_now, cores_now = live.get(user, [0, 0])
        if counted.get(user, (0, 0)) != (vms_now, cores_now):
            vms_kept, cores_kept = counted.get(user, (0, 0))
            seen = f"{vms_now} VMs/{cores_now} cores"
            out.append((user, f"counted {vms_kept} VMs/{cores_kept} cores, holds {seen}"))
        for what, value, limit in (
            ("holds", vms_now, max_vms),
            ("held at once (trails)", peaks.get(user, Peak(0, 0)).vms, max_vms),
        ):
            if limit is not None and value > limit:
                out.append((user, f"{what} {value} VMs, above max_vms {limit}"))
        for what, value in (("holds", cores_now), ("held at once (trails)", _cores(peaks, user))):
            if max_cores is not None and value > max_cores:
                out.append((user, f"{what} {value} cores, above max_cores {max_cores}"))
    return out


def _cores(peaks: Mapping[str, Peak], user: str) -> int:
    return peaks.get(user, Peak(0, 0)).cores

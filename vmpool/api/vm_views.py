"""The bodies of vmpooler's per-VM endpoints, built from the store's records.

Pure functions of records, config and the server's clock: the router
(:mod:`vmpool.api.routers.vm`) reads, calls these, and replies. Shapes follow vmpooler
3.9's lib/vmpooler/api/v3.rb (GET /vm/<hostname>, checkout, PUT's failures, GET
/token/<token>). The page docs/api.md lists where vmpool differs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vmpool.api.errors import Rejected
from vmpool.config import Config
from vmpool.ids import is_address
from vmpool.state.records import VMRecord
from vmpool.state.transitions import VMState

__all__ = [
    "MAX_DISK_GB",
    "TAG_KEY_RE",
    "checkout_body",
    "disk_failures",
    "filter_tags",
    "modify_failures",
    "short_hostname",
    "vm_body",
]

# vmpooler's input_validator.rb
TAG_KEY_RE = re.compile(r"[a-zA-Z0-9_\-.]+")
_TAG_VALUE_BAD = re.compile(r"[^\w\s\-.@:/]")
MAX_TAG_KEY = 50
MAX_TAG_VALUE = 255
_HOSTNAME_RE = re.compile(
    r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*", re.I
)


def short_hostname(hostname: str) -> str:
    """vmpooler's hostname_shorten (the first label), after its validate_hostname.

    400 ``{"ok": false, "error": ...}`` for a malformed name."""
    if not hostname:
        raise Rejected(400, error="Hostname is required")
    if len(hostname) > 253:
        raise Rejected(400, error="Hostname too long")
    if not _HOSTNAME_RE.fullmatch(hostname):
        raise Rejected(400, error="Invalid hostname format")
    return hostname.split(".", 1)[0].lower()


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _hours(seconds: float) -> float:
    return round(seconds / 3600.0, 2)


def vm_body(vm: VMRecord, config: Config, now: float) -> dict[str, Any]:
    """GET /vm/<hostname>'s entry for one VM, in vmpooler's key order."""
    # vmpooler's `template` is the POOL's name (clients and dashboards group by it).
    # The provider's template (image) the VM was made from is an extra field.
    entry: dict[str, Any] = {"template": vm.pool, "provider_template": vm.template}
    start = vm.checkout_at if vm.checkout_at is not None else vm.ready_at
    held = vm.state == VMState.RUNNING and start is not None and vm.lifetime_end is not None
    if held and start is not None and vm.lifetime_end is not None:
        entry["lifetime"] = round((vm.lifetime_end - start) / 3600.0)
        entry["running"] = _hours(now - start)
        entry["remaining"] = _hours(vm.lifetime_end - now)
        entry["start_time"] = _rfc3339(start)
        entry["end_time"] = _rfc3339(vm.lifetime_end)
        entry["state"] = VMState.RUNNING
    else:
        entry["lifetime"] = round(config.vm_lifetime_s / 3600.0)
        if vm.state == VMState.ON_HOLD and vm.hold_until is not None:
            entry["state"] = VMState.ON_HOLD  # vmpool's: failed its check, kept for debugging
            entry["hold_until"] = _rfc3339(vm.hold_until)
        elif vm.state in (VMState.COMPLETED, VMState.DESTROYED):
            if start is not None and vm.state_since is not None:
                entry["running"] = _hours(vm.state_since - start)
            entry["state"] = VMState.DESTROYED
        else:
            entry["state"] = VMState.READY if vm.state == VMState.READY else VMState.PENDING
    if vm.tags:
        entry["tags"] = dict(vm.tags)
    if vm.snapshots:
        entry["snapshots"] = list(vm.snapshots)
    if vm.disks:
        entry["disk"] = list(vm.disks)
    # vmpooler answers "" when its DNS lookup fails. No lookup here, but a cloud VM is
    # known by the address its cloud reported when it turned ready.
    entry["ip"] = vm.address or (vm.hostname if is_address(vm.hostname) else "")
    pool = config.pools.get(vm.pool)
    domain = pool.domain if pool is not None else None
    if domain:
        entry["fqdn"] = f"{vm.name}.{domain}"
        entry["domain"] = domain
    return entry


def checkout_body(
    wanted: Sequence[tuple[str, str, int]],
    handed: Sequence[tuple[str, str]],
    config: Config,
    hostnames: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """vmpooler's checkout answer.

    ``{"ok": true, "<name asked>": {"hostname": fqdn or [fqdn, ...]}}``. ``wanted`` is
    (name asked, pool chosen, count) in request order. ``handed`` the (VM, pool) pairs the
    store handed out. ``hostnames`` the hostname each VM's record holds (the cloud's
    address for a pool without a domain), else the name and the pool's domain."""
    by_pool: dict[str, list[str]] = {}
    for name, pool in handed:
        domain = config.pools[pool].domain if pool in config.pools else None
        default = f"{name}.{domain}" if domain else name
        by_pool.setdefault(pool, []).append((hostnames or {}).get(name) or default)
    body: dict[str, Any] = {"ok": True}
    for asked, pool, count in wanted:
        hosts = [by_pool[pool].pop(0) for _ in range(count)]
        entry = body.setdefault(asked, {})
        previous = entry.get("hostname")
        if previous is None:
            entry["hostname"] = hosts[0] if len(hosts) == 1 else hosts
        else:
            entry["hostname"] = [*([previous] if isinstance(previous, str) else previous), *hosts]
    return body


def _lifetime_failures(value: Any, config: Config) -> list[str]:
    failures: list[str] = []
    try:
        hours = int(str(value).strip())
    except ValueError:
        hours = 0
    if hours <= 0:
        return [f"Lifetime must be a positive integer (got {value})"]
    limit = config.max_lifetime_upper_limit_s
    if limit is not None and hours * 3600 >= limit:
        failures.append(
            f"You provided a lifetime ({value}) that exceeds the configured maximum of"
            f" {int(limit // 3600)}."
        )
    return failures


def _tag_failures(tags: Any) -> list[str]:
    if not isinstance(tags, Mapping):
        return [f"You provided tags ({tags}) as something other than a hash."]
    failures: list[str] = []
    for key, value in tags.items():
        if not key:
            failures.append("Tag key is required")
        elif len(key) > MAX_TAG_KEY:
            failures.append("Tag key too long")
        elif not TAG_KEY_RE.fullmatch(key):
            failures.append("Invalid tag key format")
        elif not isinstance(value, str):
            failures.append("Tag value must be a string")
        elif len(value) > MAX_TAG_VALUE:
            failures.append("Tag value too long")
        elif _TAG_VALUE_BAD.search(value):
            failures.append("Tag value contains invalid characters")
    return failures


def _unsupported_tags(tags: Any, allowed: tuple[str, ...] | None) -> list[str]:
    """vmpooler's ``allowed_tags`` check: a tag name outside the list is refused.

    Its message, spelling and the tags as Ruby prints a hash included."""
    if allowed is None or not isinstance(tags, Mapping) or not set(tags) - set(allowed):
        return []
    shown = ", ".join(f"{json.dumps(str(k))}=>{json.dumps(v)}" for k, v in tags.items())
    return [f"You provided unsuppored tags ({{{shown}}})."]


MAX_DISK_GB = 2048  # vmpooler's validate_disk_size


def disk_failures(value: Any) -> list[str]:
    """vmpooler's validate_disk_size: an integer of GB from 1 to 2048 (digits only)."""
    text = str(value).strip() if isinstance(value, int | str) and value is not True else ""
    if not text.isdigit() or not text.isascii():
        return ["Disk size must be a valid integer"]
    gb = int(text) if len(text) < 10 else MAX_DISK_GB + 1
    if gb < 1:
        return ["Disk size must be at least 1"]
    return [f"Disk size must be at most {MAX_DISK_GB}"] if gb > MAX_DISK_GB else []


def modify_failures(body: Mapping[str, Any], config: Config) -> list[str]:
    """PUT /vm/<hostname>'s checks, vmpooler's messages: an empty list means valid.

    ``disk`` (vmpool's addition: what vmfloaty's ``modify --disk`` sends) adds a disk."""
    failures: list[str] = []
    for param, arg in body.items():
        if param == "lifetime":
            failures += _lifetime_failures(arg, config)
        elif param == "tags":
            failures += _tag_failures(arg) + _unsupported_tags(arg, config.allowed_tags)
        elif param == "disk":
            failures += disk_failures(arg)
        else:
            failures.append(f"Unknown argument {arg}.")
    return failures


def filter_tags(tags: Mapping[str, str], tagfilter: Mapping[str, str]) -> dict[str, str]:
    """vmpooler's filter_tags: each tag as the :tagfilter: patterns keep it.

    A tag with a pattern keeps what the pattern's groups match, joined, when it matches.
    Other tags are kept as given."""
    out: dict[str, str] = {}
    for name, value in tags.items():
        pattern = tagfilter.get(name)
        match = re.search(pattern, value) if pattern else None
        out[name] = "".join(g or "" for g in match.groups()) if match else value
    return out

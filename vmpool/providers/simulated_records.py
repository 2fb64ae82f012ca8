"""The simulated cloud's replies read as :class:`~vmpool.providers.ProviderVM`.

A simulated VM is a hash (vmpool/providers/simulated.py); its state is worked out from
the server's time: running once its ``ready_at`` has passed, unless it never gets ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vmpool.providers.base import ProviderVM, ProviderVMState

__all__ = ["created_vm", "decoded", "listed_vm", "seconds", "text", "vm_of"]


def vm_of(fields: Mapping[str, str], now: float) -> ProviderVM:
    """The VM of a simulated VM's hash, as of server time ``now``."""
    ready = fields.get("never_ready", "") != "1" and float(fields["ready_at"]) <= now
    return ProviderVM(
        name=fields["name"],
        pool=fields["pool"],
        template=fields["template"],
        state=ProviderVMState.RUNNING if ready else ProviderVMState.BOOTING,
        created_at=float(fields["created_at"]),
        hostname=fields["name"],
    )


def created_vm(reply: Any) -> ProviderVM:
    """The VM of simulated_create.lua's reply (created, the server's time, its fields)."""
    _created, now, flat = reply
    return vm_of(decoded(dict(zip(flat[::2], flat[1::2], strict=True))), float(text(now)))


def listed_vm(name: str, line: str, now: float) -> ProviderVM:
    """The VM of one line of a simulated_list.lua page, as of ``now``."""
    pool, template, created_at, ready_at, never_ready = line.split("\t")
    fields = {"name": name, "pool": pool, "template": template, "created_at": created_at}
    return vm_of({**fields, "ready_at": ready_at, "never_ready": never_ready}, now)


def seconds(server_time: tuple[int, int]) -> float:
    """A Redis TIME reply (seconds, microseconds) as float seconds."""
    whole, micros = server_time
    return float(whole) + float(micros) / 1_000_000


def text(value: str | bytes) -> str:
    """Replies are str with decode_responses=True. Accept a bytes client as well."""
    return value.decode() if isinstance(value, bytes) else value


def decoded(fields: Mapping[Any, Any]) -> dict[str, str]:
    """A hash reply with str keys and values."""
    return {text(key): text(value) for key, value in fields.items()}

"""A planned switch of a Sentinel group's primary that loses no write.

``SENTINEL FAILOVER`` alone promotes a replica while the old primary still takes writes,
and the writes it takes then are lost when it becomes a replica of the new one. Any
client that waits for fewer replicas than the group has (``WAIT 1`` with two replicas)
is told they are done. :func:`switchover` closes that window:

1. It finds the primary a majority of the sentinels name, and the replicas it could
   switch to: those the sentinels could promote that follow the primary now.
2. ``CLIENT PAUSE <ms> WRITE`` on the primary: every client's writes wait. The pause
   ends by itself after the time given, should this process die.
3. It waits until every one of those replicas has processed the primary's whole
   replication stream (its ``master_repl_offset``): whichever is promoted holds every
   write.
4. ``SENTINEL FAILOVER``, then it waits until a majority of the sentinels name another
   primary and that server says it is one.
5. ``REPLICAOF`` the new primary on the old one, at once rather than the sentinels'
   later ``+convert-to-slave``: the writes that waited in the pause are refused
   (READONLY) instead of run on the old primary, and their clients go to the new one.
6. ``CLIENT UNPAUSE``, whatever happened.

Each step is reported as it happens (``report``). A step that fails raises
:class:`SwitchoverFailed` with one line; the writes are resumed first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis

from vmpool.state.connection import RedisOptions, node_kwargs, sentinel_clients
from vmpool.state.group_watch import Address, GroupView, read_view
from vmpool.state.redis_target import is_sentinel_url, parse_sentinel_url

__all__ = ["GroupAccess", "Switched", "SwitchoverFailed", "group_access", "switchover"]

_POLL_S: Final = 0.05
# The pause outlives the switch's own deadline by this much (a safety net only).
_PAUSE_MARGIN_S: Final = 5.0


class SwitchoverFailed(RuntimeError):
    """The switch did not happen, or not wholly: one line saying which step and why."""


@dataclass(frozen=True)
class GroupAccess:
    """How to reach a group: its sentinels, its name, and a client of any data node."""

    sentinels: Sequence[redis.Redis]
    service: str
    node: Callable[[Address], redis.Redis]

    def replication(self, address: Address) -> dict[str, Any]:
        return dict(self.node(address).info("replication"))

    def view(self) -> GroupView:
        return read_view(self.sentinels, self.service, self.replication)


def group_access(url: str, options: RedisOptions) -> GroupAccess:
    """The group of a ``redis+sentinel://`` URL. ValueError (one line) for another URL."""
    if not is_sentinel_url(url):
        raise ValueError(
            "a switchover needs Redis reached through Sentinel (a redis+sentinel:// URL,"
            " or :redis: sentinel: in the config)"
        )
    target = parse_sentinel_url(url)
    kwargs = node_kwargs(target, options)
    nodes: dict[Address, redis.Redis] = {}

    def node(address: Address) -> redis.Redis:
        if address not in nodes:
            nodes[address] = redis.Redis(host=address[0], port=address[1], **kwargs)
        return nodes[address]

    return GroupAccess(sentinel_clients(target, options), target.master, node)


@dataclass(frozen=True)
class Switched:
    """What a switch did: from which primary to which, and how long writes waited."""

    old: Address
    new: Address
    offset: int  # the replication offset every replica held before the failover
    paused_s: float
    took_s: float


def show(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


def switchover(group: GroupAccess, *, timeout_s: float, report: Callable[[str], None]) -> Switched:
    """Switch ``group``'s primary to one of its replicas (module docstring).

    ``timeout_s`` bounds the catch-up and the promotion together.
    """
    start = time.monotonic()
    old, targets = _plan(group.view())
    report(f"primary {show(old)}; replicas that could take over: {_list(targets)}")
    primary = group.node(old)
    pause_ms = round((timeout_s + _PAUSE_MARGIN_S) * 1000)
    primary.client_pause(pause_ms, all=False)  # CLIENT PAUSE <ms> WRITE
    paused = time.monotonic()
    report(f"writes paused on {show(old)} (for at most {pause_ms / 1000:g} s)")
    deadline = paused + timeout_s
    try:
        offset = _caught_up(group, old, targets, deadline)
        report(f"every replica holds offset {offset}: {_list(targets)}")
        _ask_failover(group, report)
        new = _promoted(group, old, deadline)
        report(f"the sentinels name {show(new)} the primary")
        primary.replicaof(new[0], str(new[1]))
        report(f"{show(old)} follows {show(new)}")
    finally:
        primary.client_unpause()
        report(f"writes resumed after {time.monotonic() - paused:.2f} s")
    now = time.monotonic()
    return Switched(old, new, offset, now - paused, now - start)


def _plan(view: GroupView) -> tuple[Address, list[Address]]:
    """The primary, and the replicas it could switch to. SwitchoverFailed if none."""
    if view.primary is None:
        raise SwitchoverFailed("no primary is named by a majority of the sentinels")
    targets = [r.address for r in view.promotable() if r.address in view.linked]
    if not targets:
        raise SwitchoverFailed(
            f"{show(view.primary)} has no replica online that the sentinels could promote"
        )
    return view.primary, targets


def _caught_up(group: GroupAccess, old: Address, targets: list[Address], deadline: float) -> int:
    """The primary's offset, once every target has processed it (writes are paused)."""
    offset = int(group.replication(old)["master_repl_offset"])
    behind = list(targets)
    while behind:
        behind = [t for t in behind if _offset(group, t) < offset]
        if behind and time.monotonic() > deadline:
            raise SwitchoverFailed(
                f"{_list(behind)} did not reach offset {offset} in time: no failover asked"
            )
        if behind:
            time.sleep(_POLL_S)
    return offset


def _offset(group: GroupAccess, replica: Address) -> int:
    """How much of the primary's stream ``replica`` has processed (-1: cannot say)."""
    try:
        info = group.replication(replica)
    except redis.RedisError:
        return -1
    if info.get("master_link_status") != "up":
        return -1
    return int(info.get("slave_repl_offset", -1))


def _ask_failover(group: GroupAccess, report: Callable[[str], None]) -> None:
    """``SENTINEL FAILOVER`` of the first sentinel that takes it."""
    errors = []
    for sentinel in group.sentinels:
        try:
            sentinel.sentinel_failover(group.service)
        except redis.RedisError as exc:
            errors.append(str(exc))
            continue
        kwargs = sentinel.connection_pool.connection_kwargs
        report(f"SENTINEL FAILOVER asked of {kwargs.get('host')}:{kwargs.get('port')}")
        return
    raise SwitchoverFailed(f"no sentinel took SENTINEL FAILOVER: {'; '.join(errors)}")


def _promoted(group: GroupAccess, old: Address, deadline: float) -> Address:
    """The new primary, once a majority names it and it says it is one."""
    while True:
        view = group.view()
        new = view.primary
        if new is not None and new != old and _is_primary(group, new):
            return new
        if time.monotonic() > deadline:
            raise SwitchoverFailed(
                "the sentinels had not promoted a replica in time (SENTINEL FAILOVER was"
                " asked: check the group with SENTINEL MASTERS)"
            )
        time.sleep(_POLL_S)


def _is_primary(group: GroupAccess, address: Address) -> bool:
    try:
        return group.replication(address).get("role") == "master"
    except redis.RedisError:
        return False


def _list(addresses: Sequence[Address]) -> str:
    return ", ".join(show(a) for a in addresses)

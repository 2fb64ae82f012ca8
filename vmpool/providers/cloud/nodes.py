"""What vmpool reads of a libcloud node (or of a node-shaped record).

Its state, its address, its image, when it was made, and whether a port on it answers.

Nodes are typed loosely (``Any``) so that libcloud stays an optional import.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

__all__ = [
    "GONE_STATES",
    "Node",
    "alive",
    "created_at",
    "node_address",
    "node_state",
    "node_template",
    "port_answers",
]

Node = Any  # a libcloud Node. Typed loosely so libcloud stays an optional import

# States of an instance that is going or gone: nobody's VM any more.
GONE_STATES = ("terminated", "terminating", "shutting-down")


def node_template(node: Node) -> str:
    extra = getattr(node, "extra", None) or {}
    image = getattr(node, "image", None) or extra.get("image_id") or extra.get("imageId") or ""
    return str(getattr(image, "id", image) if not isinstance(image, str) else image)


def node_state(node: Node) -> str:
    return str(getattr(node, "state", "")).lower()


def alive(node: Node) -> bool:
    return node_state(node) not in GONE_STATES


def node_address(node: Node) -> str | None:
    """The public address if any, else the private one."""
    for ips in (getattr(node, "public_ips", None), getattr(node, "private_ips", None)):
        for ip in ips or ():
            if ip:
                return str(ip)
    return None


def created_at(tags: Mapping[str, str], tag: str, node: Node) -> float:
    """A node's launch time: the ``tag`` vmpool set, else the cloud's, else now.

    An instance missing the tag (made by another version, or by hand with the fleet's
    mark) still ages and is reaped once past the grace. Now, when nothing tells the age,
    so the reconciler's grace protects the node."""
    try:
        return float(tags[tag])
    except (KeyError, ValueError):
        pass
    made = getattr(node, "created_at", None)
    if isinstance(made, datetime):
        return made.timestamp()
    if isinstance(made, (int, float)) and not isinstance(made, bool):
        return float(made)
    return time.time()


def port_answers(address: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to ``address:port`` is accepted within ``timeout_s``.

    vmpooler's ready check, with port 22."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False

"""Names of things, and the one validator for each kind.

Every identifier that becomes part of a Redis key, an RQ job id or a log line is
checked here, with a full match (``re.fullmatch``: ``$`` alone would also match before a
final newline), by the API, the CLI, the store and the workers alike. Nothing else
spells these patterns.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DEFAULT_PREFIX",
    "KEY_PREFIX_RE",
    "POOL_NAME_RE",
    "REQUEST_ID_RE",
    "VM_NAME_RE",
    "InvalidIdentifier",
    "validate_key_prefix",
    "validate_pool_name",
    "validate_request_id",
    "validate_vm_name",
]

DEFAULT_PREFIX: Final = "vmpool"

# vmpooler's clients send uuid4s; ABS sends its own ids. Letters, digits, '-', '_' and
# '.' cover both, and nothing here can open a hash tag or split a key.
REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
VM_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
POOL_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
KEY_PREFIX_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


class InvalidIdentifier(ValueError):
    """A request id, VM name, pool name or key prefix that may not become part of a key."""


def _full(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def validate_request_id(request_id: str) -> str:
    if not _full(REQUEST_ID_RE, request_id):
        raise InvalidIdentifier(
            "request_id must be 1-128 characters of letters, digits, '-', '_' or '.',"
            " starting with a letter or digit"
        )
    return request_id


def validate_vm_name(name: str) -> str:
    if not _full(VM_NAME_RE, name):
        raise InvalidIdentifier(f"invalid VM name {name!r}")
    return name


def validate_pool_name(name: str) -> str:
    if not _full(POOL_NAME_RE, name):
        raise InvalidIdentifier(f"invalid pool name {name!r}")
    return name


def validate_key_prefix(prefix: str) -> str:
    if not _full(KEY_PREFIX_RE, prefix):
        raise InvalidIdentifier(
            f"must be 1-64 letters, digits, '_', '.', ':' or '-', got {prefix!r}"
        )
    return prefix

"""Names of things: the one validator for each kind, and the names of the jobs.

Every identifier that becomes part of a Redis key, an RQ job id or a log line is
checked here, with a full match (``re.fullmatch``: ``$`` alone would also match before a
final newline), by the API, the CLI, the store and the workers alike. Nothing else
spells these patterns.

:class:`Job` is the closed vocabulary of job names, here so that every layer (the
work sets of the state, the lifecycle's dispatch, the workers) names a job by it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "ANONYMOUS_USER",
    "DEFAULT_PREFIX",
    "KEY_PREFIX_RE",
    "POOL_NAME_RE",
    "REQUEST_ID_RE",
    "TOKEN_RE",
    "USER_NAME_RE",
    "VALIDATORS",
    "VM_NAME_RE",
    "VM_TASK_RE",
    "InvalidIdentifier",
    "Job",
    "is_address",
    "new_request_id",
    "shown",
    "validate",
    "validate_key_prefix",
    "validate_pool_name",
    "validate_request_id",
    "validate_token",
    "validate_user_name",
    "validate_vm_name",
    "validate_vm_task",
]

DEFAULT_PREFIX: Final = "vmpool"

# vmpooler's clients send uuid4s. ABS sends its own ids. Letters, digits, '-', '_' and
# '.' cover both, and nothing here can open a hash tag or split a key.
REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
VM_NAME_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
POOL_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# A VM task (the vm_task job's subject): "<VM name>:<snapshot|revert|disk>:<task id>",
# the id being the API's 32-character snapshot id or a revert's or disk's own.
VM_TASK_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}:(snapshot|revert|disk):[a-z0-9]{1,32}")
KEY_PREFIX_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# API token text as a client sends it in X-AUTH-TOKEN: vmpooler's (and ours) are 32 of
# [a-z0-9]. Letters, digits, '_' and '-' leave room for other minting schemes
# (base64url) while nothing unbounded or unprintable is ever hashed, looked up or logged.
TOKEN_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
# A user name (the HTTP Basic user, the owner stored with a token, `vmpool token create
# USER`): login names and e-mail-like names. No space, ':' (HTTP Basic's separator) or
# control character, so it is safe in a log line and a token record.
USER_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
_SHOWN_MAX: Final = 40


class Job(StrEnum):
    """The name of each job vmpool runs: a misspelt one fails the type check.

    The value is the one spelling of the job's name wherever it appears: its RQ function
    (``workers.jobs.<name>``), its job ids, its work set, the ``:schedule:`` key of a
    periodic job, the ``job`` label of the ``vmpool_worker_jobs`` metric and the docs.
    The rest of a job's facts (queue, argument, timeout, schedule) are its row of the
    job table, ``workers/table.py``.
    """

    PROVISION_REQUEST = "provision_request"
    CHECK_REQUEST = "check_request"
    CREATE_VM = "create_vm"
    CHECK_PENDING_VM = "check_pending_vm"
    DESTROY_VM = "destroy_vm"
    VM_TASK = "vm_task"
    PROVISION_BATCH = "provision_batch"
    CREATE_VM_BATCH = "create_vm_batch"
    CHECK_PENDING_BATCH = "check_pending_batch"
    SWEEP_EXPIRED = "sweep_expired"
    PROVISION_SWEEP = "provision_sweep"
    CHECK_PENDING_SWEEP = "check_pending_sweep"
    REAP_RUNNING = "reap_running"
    DESTROY_SWEEP = "destroy_sweep"
    RECONCILE = "reconcile"
    TOP_UP_POOLS = "top_up_pools"
    CHECK_READY = "check_ready"
    RECORD_HISTORY = "record_history"


class InvalidIdentifier(ValueError):
    """A name that does not match its validator.

    Any kind of name: request id, VM name, pool name, key prefix, token, user.
    """


def _full(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def shown(value: object) -> str:
    """``value`` as it may appear in a message or a log line.

    Its repr (control characters escaped), cut to a bounded length, so hostile input is
    never echoed unbounded.
    """
    text = repr(value)
    if len(text) <= _SHOWN_MAX:
        return text
    return f"{text[:_SHOWN_MAX]}...({len(text)} chars)"


def validate_request_id(request_id: str) -> str:
    if not _full(REQUEST_ID_RE, request_id):
        raise InvalidIdentifier(
            "request_id must be 1-128 characters of letters, digits, '-', '_' or '.',"
            " starting with a letter or digit"
        )
    return request_id


def new_request_id() -> str:
    """A new request id as vmpooler's clients make theirs: a random (version 4) UUID.

    The text of ``str(uuid.uuid4())``, made from the random bytes' hex: a third of the
    CPU of uuid's way (an int, then its text), on every POST that names no id."""
    h = os.urandom(16).hex()
    # the version nibble (4) and the variant's two high bits (10: RFC 4122)
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


def validate_vm_name(name: str) -> str:
    if not _full(VM_NAME_RE, name):
        raise InvalidIdentifier(f"invalid VM name {shown(name)}")
    return name


def validate_vm_task(task: str) -> str:
    if not _full(VM_TASK_RE, task):
        raise InvalidIdentifier(f"invalid VM task {shown(task)}")
    return task


def validate_pool_name(name: str) -> str:
    if not _full(POOL_NAME_RE, name):
        raise InvalidIdentifier(f"invalid pool name {shown(name)}")
    return name


def validate_key_prefix(prefix: str) -> str:
    if not _full(KEY_PREFIX_RE, prefix):
        raise InvalidIdentifier(
            f"must be 1-64 letters, digits, '_', '.', ':' or '-', got {shown(prefix)}"
        )
    return prefix


def validate_token(token: str) -> str:
    """API token text (never echoed: a token is a secret, even a malformed one)."""
    if not _full(TOKEN_RE, token):
        raise InvalidIdentifier("a token is 1-128 letters, digits, '_' or '-'")
    return token


# Who acts on a VM without a token when auth is on: no user name can be it (a name
# starts with a letter or digit), so it never matches a VM's holder.
ANONYMOUS_USER: Final = "*anonymous"


def validate_user_name(user: str) -> str:
    if not _full(USER_NAME_RE, user):
        raise InvalidIdentifier(
            "a user name is 1-64 letters, digits, '_', '.', '@', '+' or '-',"
            f" starting with a letter or digit; got {shown(user)}"
        )
    return user


# Each kind of name and its validator, for code that checks a name by its kind (the
# job table's subjects: "request", "vm", "vm_task").
VALIDATORS: Final[Mapping[str, Callable[[str], str]]] = MappingProxyType(
    {
        "request": validate_request_id,
        "vm": validate_vm_name,
        "vm_task": validate_vm_task,
        "pool": validate_pool_name,
        "key_prefix": validate_key_prefix,
        "token": validate_token,
        "user": validate_user_name,
    }
)


def validate(kind: str, value: str) -> str:
    """``value`` checked by the validator of ``kind`` (a key of :data:`VALIDATORS`)."""
    return VALIDATORS[kind](value)


def is_address(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (a hostname the cloud gave a VM)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True

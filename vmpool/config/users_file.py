"""``:auth: users_file``: the API users' password hashes, in a file of their own.

Under Kubernetes the users belong in a Secret, not in the ConfigMap with the rest of
vmpool.yaml. The Secret is mounted as a file and the config names it.

Format: YAML (or JSON), a mapping of user name to password hash, as ``:auth: users``.
Its users are added to those of the config.

Errors: a user named in both places, a missing or unreadable file, or a bad hash is a
config error naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from vmpool.config.errors import ConfigError
from vmpool.config.fields import PasswordHash
from vmpool.providers.options import problems

__all__ = ["read_users_file", "resolve_users_file"]

_USERS: TypeAdapter[dict[str, PasswordHash]] = TypeAdapter(dict[str, PasswordHash])
KEY = "auth.users_file"


def resolve_users_file(name: str, source: str) -> Path:
    """A relative ``users_file`` is read from the config file's directory."""
    path = Path(name).expanduser()
    if path.is_absolute() or not source or source.startswith("<"):
        return path
    return Path(source).parent / path


def read_users_file(name: str, source: str, users: dict[str, str]) -> dict[str, str]:
    """``users`` plus the users of the file ``name``. ConfigError on any problem."""
    path = resolve_users_file(name, source)
    try:
        loaded: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(source, KEY, f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(source, KEY, f"{path} is not valid YAML{where}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(source, KEY, f"{path} must map user names to password hashes")
    try:
        extra = _USERS.validate_python(loaded)
    except ValidationError as exc:
        loc, message = problems(exc)[0]
        raise ConfigError(source, KEY, f"{path}: user {loc[0]!s}: {message}") from None
    both = sorted(set(users) & set(extra))
    if both:
        raise ConfigError(source, KEY, f"{path} names users also in auth.users: {', '.join(both)}")
    return {**users, **extra}

"""OpenStack's ``clouds.yaml``: the credentials file every OpenStack client reads.

A Kubernetes Secret holding a ``clouds.yaml`` (as the OpenStack CLI and Horizon's
"download clouds.yaml" make it) mounted into the worker pods is the usual way to give
a pod OpenStack credentials. :func:`load_cloud` reads one entry of it: the file is
``OS_CLIENT_CONFIG_FILE`` when set, else the first of ``./clouds.yaml``,
``~/.config/openstack/clouds.yaml`` and ``/etc/openstack/clouds.yaml`` that exists (the
clients' own search order). The entry is the provider's ``cloud`` option, else
``OS_CLOUD``. Password auth (``v3password``, the default) only: an application
credential or a token entry is a clear configuration error, not a silent wrong login.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from vmpool.providers.base import PermanentProviderError

__all__ = ["CloudEntry", "cloud_name", "clouds_file", "load_cloud"]

SEARCH = ("clouds.yaml", "~/.config/openstack/clouds.yaml", "/etc/openstack/clouds.yaml")
PASSWORD_AUTH = ("password", "v3password", None)


@dataclass(frozen=True)
class CloudEntry:
    """The fields of a clouds.yaml entry the OpenStack provider uses."""

    auth_url: str | None
    username: str | None
    password: str | None
    project_name: str | None
    user_domain_name: str | None
    region_name: str | None

    def __repr__(self) -> str:
        return f"CloudEntry(auth_url={self.auth_url!r}, username={self.username!r})"


def clouds_file(env: Mapping[str, str]) -> Path | None:
    explicit = env.get("OS_CLIENT_CONFIG_FILE")
    if explicit:
        return Path(explicit)
    for candidate in SEARCH:
        path = Path(candidate).expanduser()
        if path.is_file():
            return path
    return None


def load_cloud(name: str, env: Mapping[str, str], provider: str) -> CloudEntry:
    """Entry ``name`` of the clouds.yaml ``env`` points at.

    A configuration error (naming the file and the entry, never a value) when it cannot be
    used."""
    path = clouds_file(env)
    where = f"provider {provider!r}: clouds.yaml"
    if path is None:
        raise PermanentProviderError(
            f"configuration error: {where} not found (OS_CLIENT_CONFIG_FILE, or"
            f" {', '.join(SEARCH)})"
        )
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PermanentProviderError(
            f"configuration error: {where} {path}: cannot read it ({type(exc).__name__})"
        ) from None
    clouds = data.get("clouds") if isinstance(data, dict) else None
    entry = clouds.get(name) if isinstance(clouds, dict) else None
    if not isinstance(entry, dict):
        raise PermanentProviderError(f"configuration error: {where} {path} has no cloud {name!r}")
    if entry.get("auth_type") not in PASSWORD_AUTH:
        raise PermanentProviderError(
            f"configuration error: {where} {path}: cloud {name!r} uses auth_type"
            f" {entry.get('auth_type')!r}; vmpool supports password auth (v3password)"
        )
    raw_auth = entry.get("auth")
    auth: dict[str, Any] = raw_auth if isinstance(raw_auth, dict) else {}
    return CloudEntry(
        auth_url=_get(auth, "auth_url"),
        username=_get(auth, "username"),
        password=_get(auth, "password"),
        project_name=_get(auth, "project_name"),
        user_domain_name=_get(auth, "user_domain_name") or _get(auth, "domain_name"),
        region_name=_get(entry, "region_name"),
    )


def _get(mapping: Mapping[str, Any], key: str) -> str | None:
    value = mapping.get(key)
    return None if value is None else str(value)


def cloud_name(option: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The clouds.yaml entry to use: the provider's ``cloud`` option, else OS_CLOUD."""
    return option or (env if env is not None else os.environ).get("OS_CLOUD")

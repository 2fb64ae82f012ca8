"""``:auth: ldap:``: vmpooler's LDAP settings, as vmpool reads them.

vmpooler's form (lib/vmpooler/api/helpers.rb ``authenticate``)::

    :auth:
      provider: ldap
      :ldap:
        host: ldap.example.com
        port: 389                         # default 389
        base: ou=users,dc=example,dc=com  # or a list of bases
        user_object: uid                  # or a list
        encryption:                       # default: start_tls
          :method: :start_tls             # or :simple_tls (LDAPS)
          :tls_options:
            ca_file: /etc/ssl/ldap-ca.pem # default: the system's CAs
            :ssl_version: TLSv1_2         # default: negotiate (TLS 1.2 or newer)
        service_account_hash:             # optional: search, then bind as the user
          :user_dn: cn=vmpool,ou=services,dc=example,dc=com
          :password: secret

No ``encryption`` means start_tls, as in vmpooler: a password never goes to the
directory in clear, so a plain method is a config error. Every base is tried with every
user_object (``<user_object>=<name>,<base>``, or the service account's search under
that base for ``(<user_object>=<name>)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

from pydantic import Field

from vmpool.config.fields import Password, Port, Section, Text

__all__ = ["LdapConfig", "LdapSection", "build_ldap", "ssl_version"]

Method = Literal["start_tls", "simple_tls"]


class LdapServiceAccount(Section):
    user_dn: Text = Field(description="The service account's DN (it searches for users)")
    password: Password = Field(description="The service account's password")


class LdapSection(Section):
    """``:auth: ldap:`` (vmpooler's keys)."""

    host: Text = Field(description="The directory's host name")
    port: Port = Field(default=389, description="Its port (LDAPS usually 636)")
    base: Text | list[Text] = Field(description="Where users are: one base DN or a list")
    user_object: Text | list[Text] = Field(
        description="The attribute naming a user (uid, cn, ...): one or a list"
    )
    encryption: Any = Field(
        default=None,
        description="{method: start_tls | simple_tls, tls_options: {ca_file: PATH}};"
        " default start_tls with the system's CAs (never plain)",
    )
    service_account_hash: LdapServiceAccount | None = Field(
        default=None, description="{user_dn, password}: search for the user, then bind"
    )
    timeout: float = Field(
        default=5.0, gt=0, le=60, description="Seconds to wait for the directory (vmpool)"
    )


@dataclass(frozen=True)
class LdapConfig:
    host: str
    port: int
    bases: tuple[str, ...]
    user_objects: tuple[str, ...]
    method: Method
    ca_file: str | None
    service_user_dn: str | None
    service_password: str | None
    timeout_s: float
    # vmpooler's tls_options.ssl_version, as ssl.TLSVersion's name ("TLSv1_2"), pinning
    # the connection's TLS version; None: negotiate (TLS 1.2 or newer on a current system)
    tls_version: str | None


def _listed(value: str | list[str]) -> tuple[str, ...]:
    # vmpooler splits a string on whitespace (Ruby's String#split)
    return tuple(value.split()) if isinstance(value, str) else tuple(value)


# vmpooler's ssl_version (Ruby OpenSSL's names) -> the version pinned; None: negotiate.
SSL_VERSIONS: Final = MappingProxyType(
    {"TLSv1_2": "TLSv1_2", "TLSv1_3": "TLSv1_3", "SSLv23": None, "TLS": None}
)
# Versions no current OpenSSL speaks by default: a warning, and the connection negotiates.
OBSOLETE_SSL_VERSIONS: Final = ("TLSv1", "TLSv1_1")


def ssl_version(raw: Any) -> tuple[str | None, str | None]:
    """(version to pin, warning) for ``encryption``'s ``tls_options: ssl_version``.

    ValueError for a name that is not a TLS version."""
    options = raw.get("tls_options") if isinstance(raw, Mapping) else None
    given = options.get("ssl_version") if isinstance(options, Mapping) else None
    if given is None:
        return None, None
    name = str(given).lstrip(":")
    if name in OBSOLETE_SSL_VERSIONS:
        return None, (
            f"ssl_version {name!r} is obsolete (no current OpenSSL speaks it by default):"
            " the connection negotiates TLS 1.2 or newer"
        )
    if name not in SSL_VERSIONS:
        known = ", ".join([*SSL_VERSIONS, *OBSOLETE_SSL_VERSIONS])
        raise ValueError(f"encryption.tls_options.ssl_version {name!r}: use one of {known}")
    return SSL_VERSIONS[name], None


def _encryption(raw: Any) -> tuple[str, str | None]:
    """(method, ca_file) from vmpooler's ``encryption`` hash, or a bare method name.

    ValueError for anything else, a plain method included.
    """
    if raw is None:
        return "start_tls", None
    options: Mapping[str, Any] = {}
    if isinstance(raw, str):
        method = raw
    elif isinstance(raw, Mapping):
        method = str(raw.get("method", "start_tls"))
        options = raw.get("tls_options") or {}
        if not isinstance(options, Mapping):
            raise ValueError("encryption.tls_options must be a mapping")
    else:
        raise ValueError("encryption must be a mapping with `method` (start_tls, simple_tls)")
    method = method.lstrip(":")
    if method not in ("start_tls", "simple_tls"):
        raise ValueError(
            f"encryption method {method!r}: use start_tls or simple_tls (passwords never go"
            " to the directory in clear)"
        )
    ca = options.get("ca_file")
    return method, None if ca is None else str(ca)


def build_ldap(section: LdapSection, base_dir: Path | None) -> LdapConfig:
    """The LDAP settings resolved: lists, the method, the ca_file.

    A relative ca_file is read from the config file's directory. ValueError names what is
    wrong.
    """
    method, ca_file = _encryption(section.encryption)
    tls_version, _ = ssl_version(section.encryption)
    if ca_file is not None and base_dir is not None and not Path(ca_file).is_absolute():
        ca_file = str(base_dir / ca_file)
    bases, objects = _listed(section.base), _listed(section.user_object)
    if not bases or not objects:
        raise ValueError("base and user_object must name at least one each")
    account = section.service_account_hash
    return LdapConfig(
        host=section.host,
        port=section.port,
        bases=bases,
        user_objects=objects,
        method=method,  # type: ignore[arg-type]
        ca_file=ca_file,
        service_user_dn=account.user_dn if account else None,
        service_password=account.password if account else None,
        timeout_s=section.timeout,
        tls_version=tls_version,
    )

"""LDAP logins (``:auth: provider: ldap``), as vmpooler's ``authenticate_ldap`` makes them.

With ldap3, which is pure Python (the ``ldap`` extra).

For each base, for each user_object: either a direct bind as
``<user_object>=<name>,<base>``, or, with a service account, a search under the base
for ``(<user_object>=<name>)`` and a bind as the one entry found. The first that
succeeds logs the user in.

Never in clear: the connection is start_tls (the default) or LDAPS (``simple_tls``),
with the certificate checked against ``ca_file`` (or the system's CAs), before any
password is sent. An empty password is refused before the directory is asked (many
directories take it for an anonymous bind, which succeeds). A directory that cannot be
reached, refuses TLS, or answers that it cannot tell now (busy, unavailable) is
:class:`DirectoryUnavailable` (the API's 503), never a login nor a failed one. The next
login asks again. Passwords are never logged. vmpooler's ``ssl_version`` pins the TLS
version.
"""

from __future__ import annotations

import functools
import logging
import ssl
from typing import Any

from vmpool.config.ldap import LdapConfig

__all__ = ["DirectoryUnavailable", "ldap_login"]

log = logging.getLogger(__name__)

INVALID_CREDENTIALS = 49  # LDAP result code
# Result codes of a directory that cannot tell now (timeLimitExceeded, adminLimitExceeded,
# busy, unavailable): no login, and no failed login either.
CANNOT_TELL = frozenset({3, 11, 51, 52})


class DirectoryUnavailable(Exception):
    """The directory could not answer (down, unreachable, TLS refused): no login."""


def ldap_login(cfg: LdapConfig, user: str, password: str) -> bool:
    """Whether ``user``/``password`` log in at the directory.

    DirectoryUnavailable when it cannot tell."""
    if not password:
        return False
    try:
        import ldap3  # noqa: F401  (the optional extra)
    except ImportError:
        raise DirectoryUnavailable(
            "the ldap3 package is not installed (pip install 'vmpool[ldap]')"
        ) from None
    for base in cfg.bases:
        for user_object in cfg.user_objects:
            if _attempt(cfg, base, user_object, user, password):
                return True
    return False


def _attempt(cfg: LdapConfig, base: str, user_object: str, user: str, password: str) -> bool:
    from ldap3.core.exceptions import LDAPException

    try:
        if cfg.service_user_dn is None:
            return _direct_bind(cfg, base, user_object, user, password)
        return _search_and_bind(cfg, base, user_object, user, password)
    except LDAPException as exc:
        log.warning(
            "ldap: the directory %s:%d did not answer: %s", cfg.host, cfg.port, type(exc).__name__
        )
        raise DirectoryUnavailable(f"the directory {cfg.host}:{cfg.port} is unavailable") from None
    except (OSError, ssl.SSLError) as exc:
        log.warning("ldap: %s:%d: %s", cfg.host, cfg.port, type(exc).__name__)
        raise DirectoryUnavailable(f"the directory {cfg.host}:{cfg.port} is unavailable") from None


def _connect(cfg: LdapConfig, dn: str, password: str) -> Any:
    """An open connection (TLS established: start_tls or LDAPS), not yet bound."""
    from ldap3 import NONE, SIMPLE, Connection, Server, Tls

    tls = (
        Tls(validate=ssl.CERT_REQUIRED, version=ssl.PROTOCOL_TLS_CLIENT, ca_certs_file=cfg.ca_file)
        if cfg.tls_version is None
        else _pinned_tls(cfg.tls_version)(validate=ssl.CERT_REQUIRED, ca_certs_file=cfg.ca_file)
    )
    server = Server(
        cfg.host,
        port=cfg.port,
        use_ssl=cfg.method == "simple_tls",
        tls=tls,
        get_info=NONE,
        connect_timeout=cfg.timeout_s,
    )
    conn = Connection(
        server,
        user=dn,
        password=password,
        authentication=SIMPLE,
        receive_timeout=max(1, round(cfg.timeout_s)),  # ldap3 packs it as an integer
        raise_exceptions=False,
        read_only=True,
    )
    conn.open()
    if cfg.method == "start_tls" and not conn.start_tls():
        conn.unbind()
        raise DirectoryUnavailable(f"the directory {cfg.host}:{cfg.port} refused start_tls")
    return conn


@functools.cache
def _pinned_tls(version: str) -> type[Any]:
    """ldap3's Tls with the connection's TLS version pinned (vmpooler's ssl_version).

    ldap3 makes its SSL context itself and sets a version only through the deprecated
    PROTOCOL_* constants: this one makes it with the minimum and maximum at ``version``,
    the certificate required and checked by ldap3 after the handshake, as ldap3 does."""
    from ldap3 import Tls
    from ldap3.core.tls import check_hostname

    pinned = ssl.TLSVersion[version]

    class PinnedTls(Tls):  # type: ignore[misc]
        def wrap_socket(self, connection: Any, do_handshake: bool = False) -> None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = context.maximum_version = pinned
            context.check_hostname = False  # ldap3's check below, as for its own contexts
            if self.ca_certs_file:
                context.load_verify_locations(self.ca_certs_file)
            else:
                context.load_default_certs(ssl.Purpose.SERVER_AUTH)
            context.verify_mode = self.validate
            wrapped = context.wrap_socket(
                connection.socket, server_side=False, do_handshake_on_connect=do_handshake
            )
            if do_handshake:
                check_hostname(wrapped, connection.server.host, self.valid_names)
            connection.socket = wrapped

    return PinnedTls


def _bound(conn: Any, what: str) -> bool:
    """The bind's verdict: True, False for bad credentials (or another refusal, logged).

    DirectoryUnavailable when the directory answered that it cannot tell (busy)."""
    if conn.bound:
        return True
    _answered(conn, what)
    code = conn.result.get("result") if conn.result else None
    if code != INVALID_CREDENTIALS:
        log.info("ldap: bind as %s refused: %s", what, conn.result.get("description"))
    return False


def _answered(conn: Any, what: str) -> None:
    """DirectoryUnavailable when the last operation's result says the directory cannot
    tell now (busy, unavailable, a limit hit)."""
    result = conn.result or {}
    if result.get("result") in CANNOT_TELL:
        host, port = conn.server.host, conn.server.port
        log.warning("ldap: %s:%d answered %s to %s", host, port, result.get("description"), what)
        raise DirectoryUnavailable(f"the directory {host}:{port} is {result.get('description')}")


def _direct_bind(cfg: LdapConfig, base: str, user_object: str, user: str, password: str) -> bool:
    from ldap3.utils.dn import escape_rdn

    dn = f"{user_object}={escape_rdn(user)},{base}"
    conn = _connect(cfg, dn, password)
    try:
        conn.bind()
        return _bound(conn, "the user")
    finally:
        conn.unbind()


def _search_and_bind(
    cfg: LdapConfig, base: str, user_object: str, user: str, password: str
) -> bool:
    from ldap3.utils.conv import escape_filter_chars

    conn = _connect(cfg, cfg.service_user_dn or "", cfg.service_password or "")
    try:
        conn.bind()
        if not _bound(conn, "the service account"):
            raise DirectoryUnavailable("the service account cannot bind (check its password)")
        conn.search(
            base, f"({user_object}={escape_filter_chars(user)})", attributes=[], size_limit=2
        )
        _answered(conn, "the search")
        found = [e["dn"] for e in conn.response or [] if e.get("type") == "searchResEntry"]
        if len(found) != 1:
            return False
        conn.rebind(user=found[0], password=password)
        return _bound(conn, "the user")
    finally:
        conn.unbind()

"""A throwaway OpenLDAP server for the LDAP tests: its own config, data and TLS (a CA
made here) in a temporary directory, on free loopback ports, started and stopped by pid.

Needs Debian's ``slapd`` (it brings ``slapadd``); :func:`slapd_or_skip` skips with a
message naming the package when it is absent. The server refuses a simple bind without
TLS (``security simple_bind=128``), so a login that works proves the password went over
TLS.

Directory (suffix ``dc=example,dc=com``)::

    uid=alice,ou=people      password alice-pw    (found by uid)
    cn=bob,ou=staff          password bob-pw      (found by cn)
    cn=svc                   password svc-pw      (the service account)
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import socketserver
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vmpool.local.redis_server import free_port

SUFFIX = "dc=example,dc=com"
USERS = {"alice": "alice-pw", "bob": "bob-pw"}
SERVICE_DN = f"cn=svc,{SUFFIX}"
SERVICE_PW = "svc-pw"
SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
SCHEMAS = ("core", "cosine", "inetorgperson")

DATA = f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: example
o: Example

dn: ou=people,{SUFFIX}
objectClass: organizationalUnit
ou: people

dn: ou=staff,{SUFFIX}
objectClass: organizationalUnit
ou: staff

dn: uid=alice,ou=people,{SUFFIX}
objectClass: inetOrgPerson
uid: alice
cn: Alice
sn: A
userPassword: alice-pw

dn: cn=bob,ou=staff,{SUFFIX}
objectClass: inetOrgPerson
cn: bob
sn: B
userPassword: bob-pw

dn: {SERVICE_DN}
objectClass: inetOrgPerson
cn: svc
sn: S
userPassword: {SERVICE_PW}
"""


def slapd_or_skip() -> None:
    if not (Path(SLAPD).exists() and Path(SLAPADD).exists()):
        pytest.skip("needs OpenLDAP's server: Debian package slapd")
    for schema in SCHEMAS:
        if not Path(f"/etc/ldap/schema/{schema}.schema").exists():
            pytest.skip(f"needs /etc/ldap/schema/{schema}.schema: Debian package slapd")


def _pem(obj: x509.Certificate) -> bytes:
    return obj.public_bytes(serialization.Encoding.PEM)


def make_tls(directory: Path) -> None:
    """ca.pem, server.pem (for 127.0.0.1 and localhost) and server.key in ``directory``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vmpool test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    (directory / "ca.pem").write_bytes(_pem(ca))
    (directory / "server.pem").write_bytes(_pem(cert))
    (directory / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class BindAnswers:
    """What a slapd built with ``bind_socket`` answers to binds: a Unix socket server
    (slapd's sock overlay, ``sockops bind``) that lets each bind through (``code`` None)
    or answers it with the LDAP result ``code`` (51 busy, 52 unavailable) itself."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ldapsock-"))  # short: a socket path
        self.path = self.dir / "binds"
        self.code: int | None = None
        self.asked = 0
        answers = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while self.rfile.readline().strip():  # the request, up to its blank line
                    pass
                answers.asked += 1
                code = answers.code
                reply = "CONTINUE\n" if code is None else f"RESULT\ncode: {code}\ninfo: test\n"
                self.wfile.write(reply.encode())

        self.server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Slapd:
    """One slapd: ``ldap_port`` (start_tls) and ``ldaps_port`` (simple_tls).

    ``bind_socket``: binds go first to the program listening there (:class:`BindAnswers`)."""

    root: Path
    ldap_port: int = field(default_factory=free_port)
    ldaps_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    bind_socket: Path | None = None

    @property
    def ca_file(self) -> str:
        return str(self.root / "ca.pem")

    def prepare(self) -> None:
        (self.root / "data").mkdir(parents=True)
        make_tls(self.root)
        schemas = "\n".join(f"include /etc/ldap/schema/{s}.schema" for s in SCHEMAS)
        (self.root / "slapd.conf").write_text(
            f"""{schemas}
pidfile {self.root}/slapd.pid
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload back_sock
TLSCACertificateFile {self.root}/ca.pem
TLSCertificateFile {self.root}/server.pem
TLSCertificateKeyFile {self.root}/server.key
security simple_bind=128
database mdb
suffix "{SUFFIX}"
rootdn "cn=admin,{SUFFIX}"
directory {self.root}/data
maxsize 10485760
{self._overlay()}"""
        )
        (self.root / "data.ldif").write_text(DATA)
        subprocess.run(
            [SLAPADD, "-f", str(self.root / "slapd.conf"), "-l", str(self.root / "data.ldif")],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip

    def _overlay(self) -> str:
        if self.bind_socket is None:
            return ""
        return f"overlay sock\nsocketpath {self.bind_socket}\nsockops bind\n"

    def start(self) -> None:
        urls = f"ldap://127.0.0.1:{self.ldap_port}/ ldaps://127.0.0.1:{self.ldaps_port}/"
        log = open(self.root / "slapd.log", "ab")  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            [SLAPD, "-f", str(self.root / "slapd.conf"), "-h", urls, "-d", "0"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "slapd.log").read_text()[-2000:])
            try:
                with socket.create_connection(("127.0.0.1", self.ldap_port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("slapd did not start listening within 20 s")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def ldap_section(server: Slapd, **overrides: object) -> dict[str, object]:
    """vmpooler's :auth: for ``server`` (direct bind over two bases and two user
    objects, start_tls with the test CA), with ``overrides`` applied to :ldap:."""
    ldap: dict[str, object] = {
        "host": "127.0.0.1",
        "port": server.ldap_port,
        "base": [f"ou=people,{SUFFIX}", f"ou=staff,{SUFFIX}"],
        "user_object": ["uid", "cn"],
        "encryption": {":method": ":start_tls", ":tls_options": {"ca_file": server.ca_file}},
        "timeout": 3,
    }
    ldap.update(overrides)
    return {"provider": "ldap", ":ldap": ldap}


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)

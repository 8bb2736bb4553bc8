"""An asyncio Redis client for a ``--store`` URL: one server (plain, TLS or a Unix socket), a
Sentinel-managed primary, or a Redis Cluster (the ``redis`` extra).

======================================================================  ===============================
URL                                                                     client
======================================================================  ===============================
``redis://[[user]:password@]host[:port][/db]``                          one server
``rediss://[[user]:password@]host[:port][/db]``                         one server over TLS
``unix://[[user]:password@]/path/to/redis.sock[?db=N]``                 one server, Unix socket
``redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/name[/db]``  the primary the
                                                                        Sentinels name ``name``
``redis+cluster://[[user]:password@]host[:port][,host[:port]…]``        a Redis Cluster
``rediss+cluster://…``                                                  a Redis Cluster over TLS
======================================================================  ===============================

Sentinels listen on 26379 by default, cluster nodes on 6379. The user and password are the data
nodes' (the Sentinels are asked without them). Query options are redis-py's connection options
(``socket_timeout=5``, ``ssl_ca_certs=/path/ca.pem``, ``ssl_cert_reqs=none``, …), given to every
connection. A cluster has one database: ``/0`` or none, and needs redis-py 8.0 or later (its
asyncio client's pub/sub). Percent-encode ``@ : / ,`` in a password.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

SINGLE = ("redis", "rediss", "unix")
SENTINEL = ("redis+sentinel",)
CLUSTER = ("redis+cluster", "rediss+cluster")
SCHEMES = SINGLE + SENTINEL + CLUSTER


try:
    from redis.exceptions import RedisClusterException, RedisError

    #: What a failing server, Sentinel or cluster raises (an unreachable cluster raises
    #: ``RedisClusterException``, which is not a ``RedisError``).
    FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)
except ImportError:  # pragma: no cover - the extra is not installed
    FAILURES = (OSError,)


class RedisUrlError(ValueError):
    """A store URL that names no Redis deployment this package can reach."""


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def split_hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    """``host[:port],…`` (``[v6]:port`` for IPv6) as ``(host, port)`` pairs."""
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        part = part.strip()
        if not part:
            raise RedisUrlError("an empty host in the Redis URL")
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else rest
        else:
            host, _, port_text = part.rpartition(":") if ":" in part else (part, "", "")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise RedisUrlError(f"a bad port in the Redis URL host {part!r}") from None
        if not host or not 0 < port < 65536:
            raise RedisUrlError(f"a bad host in the Redis URL: {part!r}")
        hosts.append((unquote(host), port))
    return hosts


def connection_options(url: str) -> dict[str, Any]:
    """redis-py's connection options of a multi-host URL: its user and password, its query
    options, TLS for a ``rediss+…`` scheme (``ssl=True``); no host, port or database."""
    from redis.asyncio.connection import parse_url

    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    tls = scheme_of(url).startswith("rediss")
    # redis-py parses the credentials and casts the query options; the host is a placeholder.
    options: dict[str, Any] = dict(parse_url(f"redis://{userinfo + '@' if userinfo else ''}h:1?{parts.query}"))
    for key in ("host", "port", "db", "connection_class"):
        options.pop(key, None)
    if tls:
        options["ssl"] = True
    return options


def redis_client(url: str) -> Any:
    """A client (``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``) for ``url``; nothing
    is connected until its first command. :class:`RedisUrlError` for a URL it cannot use."""
    try:
        import redis.asyncio as aioredis
        from redis.asyncio.cluster import ClusterNode, RedisCluster
        from redis.asyncio.sentinel import Sentinel
    except ImportError:  # pragma: no cover - the extra is not installed
        raise ImportError("a Redis store needs the redis extra: pip install 'responses-cache[redis]'") from None
    scheme = scheme_of(url)
    if scheme in SINGLE:
        try:
            return aioredis.from_url(url)
        except ValueError as e:
            raise RedisUrlError(f"bad Redis URL: {e}") from None
    if scheme not in SENTINEL + CLUSTER:
        raise RedisUrlError(f"unsupported Redis URL scheme {scheme!r}: use one of {', '.join(s + '://' for s in SCHEMES)}")
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    try:
        options = connection_options(url)
    except ValueError as e:
        raise RedisUrlError(f"bad Redis URL options: {e}") from None
    path = [unquote(p) for p in parts.path.split("/") if p]
    if scheme in SENTINEL:
        if not 1 <= len(path) <= 2:
            raise RedisUrlError("a Sentinel URL names the primary: redis+sentinel://host:26379[,host:port…]/NAME[/DB]")
        db = _db(path[1] if len(path) == 2 else "0")
        sentinel = Sentinel(split_hosts(netloc, 26379), db=db, **options)  # type: ignore[no-untyped-call]
        # A command that finds no primary (killed, not yet replaced) is tried again for about as
        # long as a Sentinel takes to promote a replica, instead of failing at once: the turns
        # that end meanwhile are stored, not lost (options given in the URL take precedence).
        return sentinel.master_for(path[0], **({"retry": failover_retry()} if "retry" not in options else {}))
    if path and path != ["0"]:
        raise RedisUrlError("a Redis Cluster has database 0 only: redis+cluster://host:port[,host:port…]")
    if not hasattr(RedisCluster, "pubsub"):  # background cancels travel by pub/sub
        raise ImportError("a Redis Cluster store needs redis-py 8.0 or later (cluster pub/sub): pip install -U 'redis>=8'")
    nodes = [ClusterNode(host, port) for host, port in split_hosts(netloc, 6379)]
    return RedisCluster(startup_nodes=nodes, **options)


def failover_retry() -> Any:
    """redis-py's own retry for a Sentinel-managed primary: on a connection error, a timeout or
    "no primary found", the command is tried again after 0.1, 0.2, 0.4 and then 0.5 s pauses,
    about 6 s in all (a Sentinel with ``down-after-milliseconds`` of a few seconds and a prompt
    election promotes a replica within that)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError

    return Retry(ExponentialBackoff(cap=0.5, base=0.05), 14, supported_errors=(ConnectionError, TimeoutError))


def _db(text: str) -> int:
    try:
        db = int(text)
    except ValueError:
        raise RedisUrlError(f"a bad database number in the Redis URL: {text!r}") from None
    if db < 0:
        raise RedisUrlError(f"a bad database number in the Redis URL: {text!r}")
    return db

"""``--store`` URLs to Redis clients (:mod:`responses_cache.storage.redis_client`): every form's hosts,
credentials, database, TLS and options reach the client, and a URL it cannot use is a clear
error. (The deployments themselves are exercised in ``tests/store``: one server, a 3-node cluster,
a Sentinel.)"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection
from redis.asyncio.sentinel import SentinelConnectionPool

from responses_cache.server.cli import main
from responses_cache.storage.redis_client import RedisUrlError, redis_client


def _kwargs(client: Any) -> dict[str, Any]:
    return dict(client.connection_pool.connection_kwargs)


def test_one_server_plain_tls_and_unix_socket() -> None:
    plain = redis_client("redis://app:s%40cret@cache.internal:6380/2?socket_timeout=5")
    assert isinstance(plain, Redis)
    kw = _kwargs(plain)
    assert (kw["host"], kw["port"], kw["db"]) == ("cache.internal", 6380, 2)
    assert (kw["username"], kw["password"], kw["socket_timeout"]) == ("app", "s@cret", 5.0)
    tls = redis_client("rediss://:pw@cache.internal?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem")
    assert tls.connection_pool.connection_class is SSLConnection
    kw = _kwargs(tls)
    assert (kw["password"], kw["ssl_cert_reqs"], kw["ssl_ca_certs"]) == ("pw", "none", "/etc/ca.pem")
    unix = redis_client("unix:///run/redis.sock?db=1")
    assert unix.connection_pool.connection_class is UnixDomainSocketConnection and _kwargs(unix)["db"] == 1


def test_sentinel_hosts_primary_name_database_and_credentials() -> None:
    client = redis_client("redis+sentinel://app:pw@s1.internal,s2.internal:5000,[::1]:5001/cache-primary/3")
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "cache-primary"
    kw = dict(pool.connection_kwargs)
    assert (kw["db"], kw["username"], kw["password"]) == (3, "app", "pw")  # the primary's
    sentinels = pool.sentinel_manager.sentinels
    assert [(_kwargs(s)["host"], _kwargs(s)["port"]) for s in sentinels] == [
        ("s1.internal", 26379), ("s2.internal", 5000), ("::1", 5001)
    ]
    assert all(_kwargs(s).get("password") is None for s in sentinels)  # Sentinels are asked without them
    assert dict(redis_client("redis+sentinel://s1/cache").connection_pool.connection_kwargs)["db"] == 0


def test_cluster_startup_nodes_credentials_and_tls() -> None:
    client = redis_client("redis+cluster://app:pw@n1.internal,n2.internal:7001?socket_timeout=2")
    assert isinstance(client, RedisCluster)
    nodes = sorted((n.host, n.port) for n in client.nodes_manager.startup_nodes.values())
    assert nodes == [("n1.internal", 6379), ("n2.internal", 7001)]
    kw = client.connection_kwargs
    assert (kw["username"], kw["password"], kw["socket_timeout"]) == ("app", "pw", 2.0)
    assert kw["connection_class"] is not SSLConnection
    tls = redis_client("rediss+cluster://:pw@n1.internal:7000/0?ssl_cert_reqs=none")
    assert tls.connection_kwargs["connection_class"] is SSLConnection
    assert tls.connection_kwargs["ssl_cert_reqs"] == "none"


def test_a_tls_sentinel_url_is_refused_not_downgraded_to_plain() -> None:
    with pytest.raises(RedisUrlError, match="unsupported Redis URL scheme 'rediss\\+sentinel'"):
        redis_client("rediss+sentinel://s1/cache")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://n1:7000/1", "database 0 only"),
        ("redis+sentinel://s1:26379", "names the primary"),
        ("redis+sentinel://s1:26379/a/b/c", "names the primary"),
        ("redis+sentinel://s1/cache/x", "bad database number"),
        ("redis+cluster://n1:port", "bad port"),
        ("redis+cluster://n1:70000", "bad host"),
        ("redis+cluster://n1,,n2", "empty host"),
        ("redis+cluster://n1?socket_timeout=soon", "bad Redis URL options"),
        ("memcached://m1:11211", "unsupported Redis URL scheme 'memcached'"),
    ],
)
def test_a_url_it_cannot_use_is_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(RedisUrlError, match=message):
        redis_client(url)


def test_serve_refuses_a_bad_store_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--store", "redis+cluster://n1:7000/3"]) == 2
    assert "database 0 only" in capsys.readouterr().err

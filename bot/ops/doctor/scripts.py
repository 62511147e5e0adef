"""3. What runs on the store: do lastword's Lua scripts load on every node, and does it keep
writes as `LASTWORD_DURABILITY` asks.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bot.config.settings import Settings
from bot.ops.check import Check, guarded

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

from bot.ops.doctor.memory import SAFE_POLICY, memory_check
from bot.ops.doctor.store import cluster_client, cluster_enabled, store_client


def store_scripts() -> dict[str, str]:
    """Every Lua script of the store, by file name, each as it runs (the prelude in front):
    the declared steps (`bot.store.scripts.ALL`)."""
    from bot.store import scripts

    return {name: script.source for name, script in scripts.ALL.items()}


async def server_checks(settings: Settings, timeout_s: float) -> list[Check]:
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
        memory_check(url, where, timeout_s),
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
    probe = store_client(url, timeout_s)
    try:
        cluster = await cluster_enabled(probe)
    except RedisError as exc:
        return Check("scripts", False, f"cannot reach Redis{where}: {exc}")
    finally:
        await probe.aclose()
    client: Redis | RedisCluster = (
        cluster_client(url, timeout_s) if cluster else store_client(url, timeout_s)
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
            client = store_client(settings.redis_url, timeout_s)
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

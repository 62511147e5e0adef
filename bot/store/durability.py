"""Durability: what a step that the platform (or the user) is told about waits for.

Three steps promise something outside Redis: `ingest` (the platform is acknowledged), `presend`
(the reply goes out) and `commit` (the reply is not sent again); and `acquire`, whose answer
alone sends a crashed holder's outbox again. `LASTWORD_DURABILITY` says what they wait for
before that promise is made:

- `fast`: nothing. The server fsyncs its append-only file as configured (`everysec`: up to
  about a second of acknowledged writes lost in a crash), and an asynchronous replica
  promoted at a failover lacks whatever it had not received yet.
- `local`: the write is fsynced to the local append-only file: `WAITAOF 1 0 <timeout>` on the
  same connection, right after the script; on a server without WAITAOF (before Redis 7.2),
  only if it runs `appendfsync always` (it then fsyncs before it answers).
- `replicated`: as `local`, and one replica has the write too (`WAIT 1 <timeout>`). No
  replica answering within the timeout is `StoreUnavailable`: nothing is acknowledged that is
  not on two nodes.

WAIT and WAITAOF count the writes of the connection that sends them, so each step is one
non-transactional pipeline [EVALSHA, the waits]: one round trip, one connection. What the
server can do is probed once (`Durability.prepare`, at start-up); a level it cannot honour
is refused with the fix (`Refused`). In cluster mode a pipeline is split by node and a
keyless WAIT is not routed with the script, so `local` and `replicated` are refused there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

Level = Literal["fast", "local", "replicated"]
LEVELS: tuple[Level, ...] = get_args(Level)
# fast: a second of acknowledged writes at risk, as before, and no cost per message. See the
# README for why this is the default.
DEFAULT_LEVEL: Level = "fast"
# How long a step waits for the fsync or the replica before it counts as a store outage. Well
# under the client's 5 s command timeout, so the wait's own answer always arrives.
WAIT_TIMEOUT_MS = 2000
# The fix for a server that cannot fsync on demand and does not fsync every write.
NO_WAITAOF_FIX = "use Redis ≥ 7.2 / Valkey ≥ 8, or set appendfsync always"
NO_AOF_FIX = "set appendonly yes (and CONFIG REWRITE or redis.conf), or LASTWORD_DURABILITY=fast"
CLUSTER_FIX = "use LASTWORD_DURABILITY=fast with Redis Cluster, or a single primary"
NO_REPLICA_FIX = (
    "set LASTWORD_REDIS_URL to a primary with a replica, or use LASTWORD_DURABILITY=local"
)

Wait = tuple[str | int, ...]


def embedded_appendfsync(level: Level) -> str:
    """How the embedded store fsyncs its append-only file at `level`. Above `fast` it fsyncs
    every write before answering: that holds without WAITAOF (Redis 7.0), and with it a
    WAITAOF then returns at once, where under `everysec` it waits for the server's next
    background fsync (about 100 ms, measured by benchmarks/durability.py)."""
    return "everysec" if level == "fast" else "always"


class Refused(Exception):
    """The level cannot be honoured by this server. `fix` says what to change."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}: {fix}")
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class Server:
    """What the start-up probe found."""

    waitaof: bool  # the server has WAITAOF (Redis ≥ 7.2, Valkey)
    appendonly: bool
    appendfsync: str | None  # None: CONFIG GET is refused (a managed service)
    cluster: bool = False
    embedded: bool = False


def waits_for(level: Level, server: Server) -> tuple[Wait, ...]:
    """The commands that follow each durable step's script, or `Refused`."""
    if level == "fast":
        return ()
    if server.cluster:
        raise Refused(f"LASTWORD_DURABILITY={level} is not supported in cluster mode", CLUSTER_FIX)
    if level == "replicated" and server.embedded:
        raise Refused(
            f"LASTWORD_DURABILITY={level}: the embedded store has no replica", NO_REPLICA_FIX
        )
    if not server.appendonly:
        raise Refused(f"LASTWORD_DURABILITY={level}: the server runs without AOF", NO_AOF_FIX)
    waits: tuple[Wait, ...] = ()
    if server.waitaof:
        waits = (("WAITAOF", 1, 0, WAIT_TIMEOUT_MS),)
    elif server.appendfsync != "always":
        found = server.appendfsync or "unknown (CONFIG GET refused)"
        raise Refused(
            f"LASTWORD_DURABILITY={level}: the server has no WAITAOF and appendfsync is {found}",
            NO_WAITAOF_FIX,
        )
    if level == "replicated":
        waits += (("WAIT", 1, WAIT_TIMEOUT_MS),)
    return waits


async def probe(redis: Redis | RedisCluster, *, embedded: bool = False) -> Server:
    """Ask the server what it can do: WAITAOF (tried with nothing to wait for), the AOF."""
    if isinstance(redis, RedisCluster):
        return Server(waitaof=False, appendonly=False, appendfsync=None, cluster=True)
    cluster = await redis.info("cluster")
    if str(cluster.get("cluster_enabled", "0")) == "1":
        # A plain client on one node of a cluster (doctor's).
        return Server(waitaof=False, appendonly=False, appendfsync=None, cluster=True)
    try:
        await redis.execute_command("WAITAOF", 0, 0, 0)  # type: ignore[no-untyped-call]
        waitaof = True
    except ResponseError:
        waitaof = False
    persistence = await redis.info("persistence")
    appendonly = str(persistence.get("aof_enabled", "0")) == "1"
    try:
        found = await redis.config_get("appendfsync")
        appendfsync: str | None = _text(found.get("appendfsync")) or None
    except ResponseError:
        appendfsync = None
    return Server(waitaof, appendonly, appendfsync, embedded=embedded)


def describe(level: Level, waits: tuple[Wait, ...]) -> str:
    """What `level` does on this server, in a few words (doctor's ✓ line, the start-up log)."""
    if level == "fast":
        return (
            "fast: nothing waits for the disk or a replica; a crash loses up to ~1 s of "
            "acknowledged writes (appendfsync everysec)"
        )
    said = [" ".join(str(part) for part in wait) for wait in waits]
    if not any(wait[0] == "WAITAOF" for wait in waits):
        said.insert(0, "appendfsync always")
    return f"{level}: ingest, acquire, pre-send and commit wait for {' + '.join(said)}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class Durability:
    """The waits of one store, settled at start-up, and the scripts run with them."""

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self.redis = redis
        self.server: Server | None = None

    async def prepare(self, level: Level, *, embedded: bool = False) -> tuple[Wait, ...]:
        """Probe the server once and check that `level` can be honoured (else `Refused`)."""
        self.server = await probe(self.redis, embedded=embedded)
        return waits_for(level, self.server)

    async def run(
        self, level: Level, script: AsyncScript, keys: list[str], args: list[str | int]
    ) -> Any:
        """Run `script`; at `local` and `replicated`, wait on the same connection for the
        fsync (and the replica). A wait that falls short raises `StoreUnavailable`."""
        if level == "fast":
            # AsyncScript reloads the script itself on NOSCRIPT (an empty cache after a restart).
            return await script(keys=keys, args=args)
        if self.server is None:
            await self.prepare(level)
        assert self.server is not None
        waits = waits_for(level, self.server)
        results = await self._pipeline(script, keys, args, waits)
        if isinstance(results[0], NoScriptError):
            # Plain EVALSHA (a Script object in a pipeline adds a SCRIPT EXISTS round trip),
            # so reload by hand after a restart. The script did not run, so neither did a write.
            await self.redis.script_load(script.script)
            results = await self._pipeline(script, keys, args, waits)
        for result in results:
            if isinstance(result, RedisError):
                raise result
        for wait, reply in zip(waits, results[1:], strict=True):
            _check(wait, reply)
        return results[0]

    async def _pipeline(
        self, script: AsyncScript, keys: list[str], args: list[str | int], waits: tuple[Wait, ...]
    ) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            for wait in waits:
                pipe.execute_command(*wait)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results


def _check(wait: Wait, reply: Any) -> None:
    from bot.store import StoreUnavailable

    if wait[0] == "WAITAOF":
        local, replicas = (int(n) for n in reply)
        if local < int(wait[1]) or replicas < int(wait[2]):
            raise StoreUnavailable(
                f"the write was not fsynced within {WAIT_TIMEOUT_MS} ms (WAITAOF: {local} local)"
            )
    elif int(reply) < int(wait[1]):
        raise StoreUnavailable(
            f"no replica acknowledged the write within {WAIT_TIMEOUT_MS} ms "
            "(LASTWORD_DURABILITY=replicated)"
        )

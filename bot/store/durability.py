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
non-transactional pipeline [EVALSHA, the waits]: one round trip, one connection. In cluster
mode the cluster client would split a pipeline by node and send a keyless WAIT anywhere, so
the pipeline goes straight to a connection of the primary that owns the script's slot (all
of a script's keys share one hash tag), following one MOVED or ASK and one NOSCRIPT itself.

What the server can do is probed once (`Durability.prepare`, at start-up); a level it cannot
honour is refused with the fix (`Refused`). In cluster mode every primary is probed and must
honour the level the same way, and at `replicated` each must have a replica connected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bot.store.replies import as_text

Level = Literal["fast", "local", "replicated"]
LEVELS: tuple[Level, ...] = get_args(Level)
# fast: up to a second of acknowledged writes at risk (appendfsync everysec), and no cost per
# message. See docs/operating.md ("Durability") for why this is the default.
DEFAULT_LEVEL: Level = "fast"
# How long a step waits for the fsync or the replica before it counts as a store outage, unless
# the store's settings say otherwise (`LASTWORD_DURABILITY_WAIT_MS`, whose default this is).
DEFAULT_WAIT_MS = 2000
# The fix for a server that cannot fsync on demand and does not fsync every write.
NO_WAITAOF_FIX = "use Redis ≥ 7.2 / Valkey ≥ 8, or set appendfsync always"
NO_AOF_FIX = "set appendonly yes (and CONFIG REWRITE or redis.conf), or LASTWORD_DURABILITY=fast"
NO_REPLICA_FIX = (
    "set LASTWORD_REDIS_URL to a primary with a replica, or use LASTWORD_DURABILITY=local"
)
CLUSTER_REPLICA_FIX = (
    "give every primary a replica (CLUSTER REPLICATE), or use LASTWORD_DURABILITY=local"
)
MIXED_FIX = "set appendfsync always on every primary, or run the same version on all"

Wait = tuple[str | int, ...]
Command = tuple[Any, ...]


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
    embedded: bool = False
    # A cluster: each primary as probed, each with its `node` and `replicas` set.
    primaries: tuple[Server, ...] = ()
    node: str = ""  # host:port of a cluster primary
    replicas: int | None = None  # replicas connected to a cluster primary


def waits_for(level: Level, server: Server, wait_ms: int = DEFAULT_WAIT_MS) -> tuple[Wait, ...]:
    """The commands that follow each durable step's script, each bounded by `wait_ms`, or
    `Refused`."""
    if level == "fast":
        return ()
    if server.primaries:
        # Every primary must honour the level, with the same waits (sent to whichever
        # primary owns a script's slot).
        each = {waits_for(level, primary, wait_ms) for primary in server.primaries}
        if len(each) > 1:
            raise Refused(f"LASTWORD_DURABILITY={level}: the primaries differ", MIXED_FIX)
        return each.pop()
    # A cluster primary is named in any refusal.
    level_at = f"{level} (primary {server.node})" if server.node else level
    if level == "replicated" and server.replicas == 0:
        raise Refused(
            f"LASTWORD_DURABILITY={level_at}: the primary has no replica", CLUSTER_REPLICA_FIX
        )
    if level == "replicated" and server.embedded:
        raise Refused(
            f"LASTWORD_DURABILITY={level}: the embedded store has no replica", NO_REPLICA_FIX
        )
    if not server.appendonly:
        raise Refused(f"LASTWORD_DURABILITY={level_at}: the server runs without AOF", NO_AOF_FIX)
    waits: tuple[Wait, ...] = ()
    if server.waitaof:
        waits = (("WAITAOF", 1, 0, wait_ms),)
    elif server.appendfsync != "always":
        found = server.appendfsync or "unknown (CONFIG GET refused)"
        raise Refused(
            f"LASTWORD_DURABILITY={level_at}: the server has no WAITAOF and appendfsync is {found}",
            NO_WAITAOF_FIX,
        )
    if level == "replicated":
        waits += (("WAIT", 1, wait_ms),)
    return waits


Execute = Callable[..., Awaitable[Any]]


async def probe(redis: Redis | RedisCluster, *, embedded: bool = False) -> Server:
    """Ask the server what it can do: WAITAOF (tried with nothing to wait for), the AOF. In
    cluster mode, ask every primary, and how many replicas each has."""
    if isinstance(redis, RedisCluster):
        await redis.initialize()  # no-op once the slot map is loaded
        primaries = [
            await _probe_node(node.execute_command, node=node.name)
            for node in redis.get_primaries()
        ]
        return Server(False, False, None, primaries=tuple(primaries))
    cluster = await redis.info("cluster")
    if str(cluster.get("cluster_enabled", "0")) == "1":
        # A plain client on one node of a cluster (doctor's): ask each primary in turn.
        return Server(False, False, None, primaries=await _probe_primaries_of(redis))
    return await _probe_node(redis.execute_command, embedded=embedded)


async def _probe_node(execute: Execute, *, node: str = "", embedded: bool = False) -> Server:
    try:
        await execute("WAITAOF", 0, 0, 0)
        waitaof = True
    except ResponseError:
        waitaof = False
    persistence = await execute("INFO", "persistence")
    appendonly = str(persistence.get("aof_enabled", "0")) == "1"
    try:
        found = await execute("CONFIG GET", "appendfsync")
        appendfsync: str | None = as_text(found.get("appendfsync")) or None
    except ResponseError:
        appendfsync = None
    replicas = None
    if node:
        replication = await execute("INFO", "replication")
        replicas = int(replication.get("connected_slaves", 0))
    return Server(waitaof, appendonly, appendfsync, embedded, node=node, replicas=replicas)


async def _probe_primaries_of(redis: Redis) -> tuple[Server, ...]:
    """Each primary of the cluster `redis` is a node of, through a client of its own."""
    options = dict(redis.connection_pool.connection_kwargs)
    slots = await redis.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
    addresses = {(as_text(entry[2][0]) or options.get("host"), int(entry[2][1])) for entry in slots}
    servers = []
    for host, port in sorted(addresses):
        pool = ConnectionPool(
            connection_class=redis.connection_pool.connection_class,
            **(options | {"host": host, "port": port}),
        )
        primary = Redis.from_pool(pool)
        try:
            servers.append(await _probe_node(primary.execute_command, node=f"{host}:{port}"))
        finally:
            await primary.aclose()
    return tuple(servers)


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


class Durability:
    """The waits of one store, settled at start-up, and the scripts run with them. Each wait
    is bounded by `wait_ms` (the store's `durability_wait_ms`)."""

    def __init__(self, redis: Redis | RedisCluster, wait_ms: int = DEFAULT_WAIT_MS) -> None:
        self.redis = redis
        self.wait_ms = wait_ms
        self.server: Server | None = None

    async def prepare(self, level: Level, *, embedded: bool = False) -> tuple[Wait, ...]:
        """Probe the server once and check that `level` can be honoured (else `Refused`)."""
        self.server = await probe(self.redis, embedded=embedded)
        return waits_for(level, self.server, self.wait_ms)

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
        waits = waits_for(level, self.server, self.wait_ms)
        commands: list[Command] = [("EVALSHA", script.sha, len(keys), *keys, *args), *waits]
        if isinstance(self.redis, RedisCluster):
            results = await _on_primary(self.redis, script, keys[0], commands)
        else:
            results = await self._pipeline(commands)
            if isinstance(results[0], NoScriptError):
                # Plain EVALSHA (a Script object in a pipeline adds a SCRIPT EXISTS round
                # trip), so reload by hand after a restart. The script did not run, so
                # neither did a write.
                await self.redis.script_load(script.script)
                results = await self._pipeline(commands)
        for result in results:
            if isinstance(result, RedisError):
                raise result
        for wait, reply in zip(waits, results[1:], strict=True):
            _check(wait, reply)
        return results[0]

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results


async def _on_primary(
    cluster: RedisCluster, script: AsyncScript, key: str, commands: list[Command]
) -> list[Any]:
    """`commands` (the script, then the waits) on one connection of the primary that owns
    `key`'s slot, the replies (errors among them) in order. Follows one redirection (MOVED:
    the slot map is patched; ASK: a slot mid-migration) and one NOSCRIPT; a connection that
    fails is `StoreUnavailable`, and the slot map is reloaded before the next attempt."""
    from bot.store import StoreUnavailable

    await cluster.initialize()  # no-op once the slot map is loaded
    node = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(key))
    asking = redirected = reloaded = False
    try:
        while True:
            results = await _send(node, [("ASKING",), *commands] if asking else commands)
            results = results[1:] if asking else results
            first, asking = results[0], False
            if isinstance(first, (RedisConnectionError, RedisTimeoutError)):
                raise first
            if isinstance(first, NoScriptError) and not reloaded:
                # An empty script cache (a restart, a failover): load it there, send again.
                await _send(node, [("SCRIPT", "LOAD", script.script)])
                reloaded = True
            elif isinstance(first, MovedError) and not redirected:
                await cluster.nodes_manager.move_slot(first)
                node = cluster.nodes_manager.get_node_from_slot(first.slot_id)
                redirected = True
            elif isinstance(first, AskError) and not redirected:
                target = cluster.get_node(host=first.host, port=first.port)
                if target is None:  # a node the slot map does not know yet
                    raise StoreUnavailable(f"Redis answered ASK: {first}", reconnect=True)
                node, asking, redirected = target, True, True
            else:
                return results
    except MaxConnectionsError as exc:
        raise StoreUnavailable(f"no free connection to {node.name}: {exc}") from exc
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        # The node is gone or failing over: reload the slot map before the next attempt.
        raise StoreUnavailable(f"Redis is unreachable: {exc}", reconnect=True) from exc


async def _send(node: ClusterNode, commands: list[Command]) -> list[Any]:
    pipeline = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
    await node.execute_pipeline(pipeline)
    return [command.result for command in pipeline]


def _check(wait: Wait, reply: Any) -> None:
    """`StoreUnavailable` if `reply` falls short of what `wait` asked for; the wait's own
    timeout (its last argument) is the bound it names."""
    from bot.store import StoreUnavailable

    wait_ms = wait[-1]
    if wait[0] == "WAITAOF":
        local, replicas = (int(n) for n in reply)
        if local < int(wait[1]) or replicas < int(wait[2]):
            raise StoreUnavailable(
                f"the write was not fsynced within {wait_ms} ms (WAITAOF: {local} local)"
            )
    elif int(reply) < int(wait[1]):
        raise StoreUnavailable(
            f"no replica acknowledged the write within {wait_ms} ms "
            "(LASTWORD_DURABILITY=replicated)"
        )

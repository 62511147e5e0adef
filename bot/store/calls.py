"""The store's base: one client, the scripts registered on it, and the calls every area makes
through it, bounded in number and with failures told apart (`bot.store.errors`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from bot.store import scripts
from bot.store.config import StoreSettings
from bot.store.connect import MAX_CONNECTIONS, Client, drop_connections
from bot.store.durability import Durability
from bot.store.errors import StoreUnavailable, reaching_redis
from bot.store.keys import LAYOUT, Layout
from bot.store.scripts import Script


class Calls:
    """The client, the settings and the registered scripts, and how a call is made. One
    instance per process, shared by all its tasks (as `bot.store.Store`)."""

    def __init__(self, redis: Client, settings: StoreSettings, layout: Layout = LAYOUT) -> None:
        self.redis = redis
        self.settings = settings
        # Keys of different slots may lie on different nodes: a call's keys share one slot.
        self.clustered = isinstance(redis, RedisCluster)
        # How conversations are spread over shards, hence every key name a call uses: this
        # version's, or another for a store that reads one (the legacy layout, in tests).
        self.layout = layout
        # AsyncScript reloads its script itself on NOSCRIPT (an empty cache after a restart).
        self._scripts: dict[str, AsyncScript] = {
            name: redis.register_script(script.source) for name, script in scripts.ALL.items()
        }
        self.durability = Durability(redis, settings.durability_wait_ms)
        # The cluster client fails a call at once when a node's pool is exhausted, and then
        # closes every connection, failing the calls in flight too; the single-server pool
        # waits instead. Bounding the calls in flight per process to the pool size keeps
        # both within their pools.
        self._in_flight = asyncio.Semaphore(MAX_CONNECTIONS)

    def configure(self, settings: StoreSettings) -> None:
        """Take on reloaded settings: every script call from now on is told the new ones, and
        every durable step waits as long as they say."""
        self.settings = settings
        self.durability.wait_ms = settings.durability_wait_ms

    @asynccontextmanager
    async def _reaching(self) -> AsyncIterator[None]:
        """`reaching_redis`, and after a reply that says we talk to the wrong node, the
        connections dropped so the next attempt resolves the right one."""
        try:
            async with self._in_flight:
                with reaching_redis():
                    yield
        except StoreUnavailable as exc:
            if exc.reconnect:
                # For the cluster client also its slot map; Sentinel's pool asks anew.
                await drop_connections(self.redis)
            raise

    async def _run(
        self,
        script: Script,
        keys: Mapping[str, str],
        args: Mapping[str, str | int],
        rest: Sequence[str | int] = (),
        rest_keys: Sequence[str] = (),
    ) -> Any:
        """Run `script` with its keys and arguments by name (`Script.ordered_keys`), and
        `rest` and `rest_keys` past the named arguments and keys."""
        ordered_keys = script.ordered_keys(keys, rest_keys)
        ordered_args = script.ordered_args(args, rest)
        async with self._reaching():
            return await self._scripts[script.name](keys=ordered_keys, args=ordered_args)

    async def _run_each(
        self, calls: Sequence[tuple[Script, Mapping[str, str], Mapping[str, str | int]]]
    ) -> list[Any]:
        """Run each of `calls` (a script, its keys and its arguments by name), each on the
        keys of its own slot; their replies, in order. On one server, in one pipeline: one
        round trip for them all. On a cluster, their slots may lie on different nodes: each
        is a call of its own, all at once."""
        if self.clustered:
            return list(await asyncio.gather(*(self._run(*call) for call in calls)))
        ordered = [
            (self._scripts[script.name], script.ordered_keys(keys), script.ordered_args(args))
            for script, keys, args in calls
        ]
        async with self._reaching():
            async with self.redis.pipeline(transaction=False) as pipe:
                for registered, keys, args in ordered:
                    # Plain EVALSHA (a Script object in a pipeline adds a SCRIPT EXISTS round
                    # trip); each refused with NOSCRIPT did not run, and runs again below.
                    pipe.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)
                results: list[Any] = await pipe.execute(raise_on_error=False)
            for index, result in enumerate(results):
                if isinstance(result, NoScriptError):
                    # An empty script cache (after a restart): AsyncScript loads it itself.
                    registered, keys, args = ordered[index]
                    results[index] = await registered(keys=keys, args=args)
            # Raised once every call has run, as a failed call among several at once is.
            for result in results:
                if isinstance(result, Exception):
                    raise result
        return results

    async def _run_durable(
        self, script: Script, keys: Mapping[str, str], args: Mapping[str, str | int]
    ) -> Any:
        """`_run` for a step whose outcome is promised outside Redis: at the configured
        durability, it waits for the fsync (and a replica) on the script's connection."""
        ordered_keys, ordered_args = script.ordered_keys(keys), script.ordered_args(args)
        registered = self._scripts[script.name]
        level = self.settings.durability
        async with self._reaching():
            return await self.durability.run(level, registered, ordered_keys, ordered_args)

    async def ping(self) -> None:
        async with self._reaching():
            await self.redis.ping()

    async def check_layout(self) -> None:
        """At start-up: record the shard layout at the first start, and refuse a store laid
        out otherwise, or holding legacy data (`bot.store.migrate.LayoutError`), or written in
        another stored format (`bot.store.format.FormatError`)."""
        from bot.store.migrate import check_layout

        async with self._reaching():
            await check_layout(self.redis)

    async def _in_every_shard(
        self,
        script: Script,
        call: Callable[[int], tuple[list[str], list[str | int]]],
        *,
        shards: Sequence[int] | None = None,
        also: Sequence[tuple[str, ...]] = (),
    ) -> list[Any]:
        """Run `script` once in each of `shards` (all by default), on the keys and with the
        arguments `call(shard)` gives (in the script's order: `Script.ordered_keys`), and the
        commands `also` after them, in one pipeline (on a cluster, one round trip to each
        primary, all at once). Their replies, in order."""
        registered = self._scripts[script.name]
        chosen = range(self.layout.shards) if shards is None else shards
        async with self._reaching():
            try:
                return await self._pipeline_in_every_shard(registered, call, chosen, also)
            except NoScriptError:
                # Plain EVALSHA in the pipeline (a Script object would add a SCRIPT EXISTS
                # round trip to every sweep), so reload by hand after a restart.
                await self.redis.script_load(registered.script)
                return await self._pipeline_in_every_shard(registered, call, chosen, also)

    async def _pipeline_in_every_shard(
        self,
        script: AsyncScript,
        call: Callable[[int], tuple[list[str], list[str | int]]],
        shards: Sequence[int],
        also: Sequence[tuple[str, ...]],
    ) -> list[Any]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                keys, args = call(shard)
                # As a raw command: the cluster pipeline refuses its evalsha() helper.
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            for command in also:
                pipe.execute_command(*command)
            results: list[Any] = await pipe.execute()
        return results

    async def close(self) -> None:
        await self.redis.aclose()

"""Every replica's heartbeat: the hash `lastword status` lists the live replicas from.

A crashed replica stops beating and its key expires, so "alive" means "beat within its TTL".
The key and its fields are described in `bot.store.keys`; the beat itself is `Store.beat`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from redis.exceptions import RedisError

from bot.cancel import cancel_and_wait
from bot.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

# Long enough that a replica busy for a few seconds (or a Redis hiccup) does not vanish from
# the status, short enough that a dead one disappears while the operator still looks.
DEFAULT_HEARTBEAT_TTL_MS = 15_000
# What a beat may fail with; any of them only makes the replica look late, never stops it.
# (RedisError: an error reply the store does not count as transient.)
_FAILURES = (StoreUnavailable, RedisError, TimeoutError)


class Heartbeat:
    """Keeps a replica's heartbeat alive: a beat every TTL/3 from `start()` until `stop()`.

    Redis errors never escape: the first failure of an outage is logged as a warning (not
    every retry, so an outage does not flood the journal), the beat is retried at the next
    tick, and the recovery is logged once. `stop()` deletes the key (best effort), so a
    replica that shuts down cleanly leaves the status at once; a crashed one expires.
    `info` is called at every beat, so it can report live numbers (cycles running, leases).
    """

    def __init__(
        self,
        store: Store,
        replica_id: str,
        ttl_ms: int = DEFAULT_HEARTBEAT_TTL_MS,
        *,
        platform: str = "",
        info: Callable[[], Mapping[str, str | int]] | None = None,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.ttl_ms = ttl_ms
        self.interval_s = ttl_ms / 3000
        self.platform = platform
        self.info = info
        self.beats = 0  # successful beats, for tests and diagnostics
        self.failures = 0  # failed beats, likewise
        self.started_at_ms: int | None = None
        self._down = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"heartbeat {self.replica_id}")

    async def stop(self) -> None:
        """Stop beating and delete the key, waiting at most one beat interval for Redis."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        try:
            async with asyncio.timeout(max(self.interval_s, 0.5)):
                await self.store.remove_beat(self.replica_id)
        except _FAILURES as exc:
            log.warning(
                "could not remove the heartbeat of replica %s (it will expire): %s",
                self.replica_id,
                exc,
            )

    async def run(self) -> None:
        """Beat until cancelled. Never raises anything but the cancellation."""
        while True:
            await self._beat_once()
            await asyncio.sleep(self.interval_s)

    def _fields(self) -> dict[str, str | int]:
        fields: dict[str, str | int] = {"platform": self.platform} if self.platform else {}
        if self.info is not None:
            try:
                fields.update(self.info())
            except Exception:
                # A bug in the caller's numbers must not make a live replica look dead.
                log.exception("heartbeat info failed; beating without it")
        return fields

    async def _beat_once(self) -> None:
        try:
            # Bounded: a beat stuck longer than the interval is late anyway; try afresh.
            async with asyncio.timeout(self.interval_s):
                self.started_at_ms = await self.store.beat(
                    self.replica_id,
                    self._fields(),
                    self.ttl_ms,
                    started_at_ms=self.started_at_ms,
                )
        except _FAILURES as exc:
            self.failures += 1
            if not self._down:
                self._down = True
                log.warning("heartbeat of replica %s failed, retrying: %r", self.replica_id, exc)
            return
        self.beats += 1
        if self._down:
            self._down = False
            log.info("heartbeat of replica %s restored", self.replica_id)

"""Heartbeats: each replica's hash of what it is doing, rewritten on the server's clock and
expiring on its own, that `lastword status` reads."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import heartbeat_key


class Heartbeats(Calls):
    """Beat, and stop beating."""

    async def beat(
        self,
        replica_id: str,
        info: Mapping[str, str | int],
        ttl_ms: int,
        *,
        started_at_ms: int | None = None,
    ) -> int:
        """Write the replica's heartbeat hash and (re)arm its expiry of `ttl_ms`.

        The hash holds pid and host (of this process unless `info` says otherwise),
        `started_at` and `last_beat` (server clock, ms), and every field of `info`. Fields
        left out of `info` since the last beat are dropped, so the hash never shows stale
        numbers. `started_at_ms` keeps the replica's start time across a key that expired
        meanwhile; without it the recorded one is kept, or now for a new key. Returns the
        start time recorded, for the next beat.
        """
        fields: dict[str, str] = {"pid": str(os.getpid()), "host": socket.gethostname()}
        fields.update({k: str(v) for k, v in info.items() if k not in ("started_at", "last_beat")})
        args = {"ttl_ms": ttl_ms, "started_at": "" if started_at_ms is None else started_at_ms}
        pairs = [part for pair in fields.items() for part in pair]
        keys = {"heartbeat": heartbeat_key(replica_id)}
        return int(await self._run(scripts.HEARTBEAT, keys, args, pairs))

    async def remove_beat(self, replica_id: str) -> None:
        """Delete the replica's heartbeat, so it leaves the status at once."""
        async with self._reaching():
            await self.redis.delete(heartbeat_key(replica_id))

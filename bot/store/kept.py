"""Kept values: a value under a name, for any replica to read, for a while."""

from __future__ import annotations

from bot.store.calls import Calls
from bot.store.keys import kept_key
from bot.store.replies import as_text


class Kept(Calls):
    """Remember and recall a value by name."""

    async def remember(self, name: str, value: str | None, ttl_ms: int) -> None:
        """Keep `value` under `name` for `ttl_ms`, for any replica to read (None: forget)."""
        key = kept_key(name)
        async with self._reaching():
            if value is None:
                await self.redis.delete(key)
            else:
                await self.redis.set(key, value, px=max(ttl_ms, 1))

    async def recall(self, name: str) -> str | None:
        async with self._reaching():
            value = await self.redis.get(kept_key(name))
        return None if value is None else as_text(value)

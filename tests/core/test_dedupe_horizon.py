"""The dedupe horizon: a platform redelivers an update for up to a day (Telegram keeps one for
24 h), so an id taken in must stay a duplicate at least that long, and the set of ids must
still stay bounded, by age and by count.

Ages are made on the server's clock (the one ingest.lua stamps ids with): an id is put in the
seen set with a score that many hours before the server's now, as ingest would have done then.
"""

from __future__ import annotations

from redis.asyncio import Redis

from bot.store import SEEN_CAP, Keys, Store
from tests.support.builders import message
from tests.support.waits import server_ms

HOUR_MS = 3_600_000
CONVERSATION = "test:horizon"


async def _seen_aged(redis: Redis, message_id: str, hours: float) -> None:
    """Record `message_id` as taken in `hours` ago, on the server's clock."""
    stamp = await server_ms(redis) - int(hours * HOUR_MS)
    await redis.zadd(Keys(CONVERSATION).seen, {message_id: stamp})


async def _accepted(store: Store, message_id: str) -> bool:
    ingested = await store.ingest(
        message("hello", conversation=CONVERSATION, message_id=message_id)
    )
    return ingested.accepted


async def test_an_id_a_day_old_is_still_a_duplicate(store: Store, redis: Redis) -> None:
    await _seen_aged(redis, "day-old", 24)
    # A fresh id prunes what has aged out: a day-old one must survive it.
    assert await _accepted(store, "fresh")
    assert not await _accepted(store, "day-old")


async def test_an_id_past_the_horizon_is_forgotten(store: Store, redis: Redis) -> None:
    await _seen_aged(redis, "too-old", 26)
    assert await _accepted(store, "fresh")
    assert await redis.zscore(Keys(CONVERSATION).seen, "too-old") is None
    assert await _accepted(store, "too-old")


async def test_the_seen_set_keeps_only_the_newest_ids_past_its_cap(
    store: Store, redis: Redis
) -> None:
    """Filled past its cap, the set keeps the newest ids: the oldest is forgotten (and taken
    as new again), the newest is still a duplicate."""
    seen = Keys(CONVERSATION).seen
    now = await server_ms(redis)
    # Ids a second apart, the oldest first, all well inside the age horizon.
    await redis.zadd(seen, {f"old-{i}": now - (SEEN_CAP - i) * 1000 for i in range(SEEN_CAP)})
    assert await _accepted(store, "newest")
    assert await redis.zcard(seen) == SEEN_CAP
    assert await redis.zscore(seen, "old-0") is None
    assert not await _accepted(store, f"old-{SEEN_CAP - 1}")
    assert not await _accepted(store, "newest")
    assert await _accepted(store, "old-0")

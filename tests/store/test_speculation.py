"""Speculation and the learned window, step by step on a real server: the scripts' side of
answering at the last word.

With speculation on, the lease may be taken once the user has been quiet for `speculate_ms`,
the window still open; the reply then waits (`hold`) until the window closes, and a message
that extends the window restarts the generation without counting a discard. A burst the
starvation guard will force out is not speculated on. With learning on, the quiet window
learns the user: the floor for one who never follows up, `quiet_ms` for one who does.
The processes' side (`lastword run`, a fake provider) is in test_speculation_e2e.py.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.store import Keys, NotAcquired, Store
from tests.support.builders import message, window_ms
from tests.support.hashes import integers
from tests.support.speculation import CONV, QUIET_MS, SPECULATE_MS, StoreFactory, speculative_grant

pytestmark = pytest.mark.timeout(30)


async def window(redis: Redis) -> dict[str, int]:
    return integers(await redis.hgetall(Keys(CONV).window))


async def test_the_lease_is_taken_at_speculate_at_and_the_reply_held_until_the_deadline(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores()
    ingested = await store.ingest(message("hello", n=1))
    # The first look is when speculation may start, not at the deadline.
    assert ingested.look_in_ms is not None and ingested.look_in_ms <= SPECULATE_MS
    early = await store.acquire(CONV, "t0")
    assert isinstance(early, NotAcquired), early
    assert early.status == "early" and early.look_in_ms is not None
    assert early.look_in_ms <= SPECULATE_MS

    grant = await speculative_grant(store)
    assert grant.version == 1
    assert QUIET_MS - SPECULATE_MS - 50 <= window_ms(grant) < QUIET_MS - SPECULATE_MS + 5
    opened = await window(redis)
    assert opened["leased"] == grant.lease.fence, "the window is leased, not consumed"

    held = await store.presend(grant.lease, grant.version, "the answer")
    assert held.status == "hold" and held.look_in_ms is not None
    assert 0 < held.look_in_ms <= window_ms(grant)
    assert not await redis.exists(Keys(CONV).outbox), "a held reply is not recorded"

    await asyncio.sleep(held.look_in_ms / 1000)
    sent = await store.presend(grant.lease, grant.version, "the answer")
    assert sent.status == "ok" and not sent.forced
    assert not await redis.exists(Keys(CONV).window), "a closed window is consumed"
    assert (await store.commit(grant.lease)).ok
    assert await store.counters(CONV) == (1, 1)


async def test_a_message_in_the_open_window_restarts_the_generation_without_a_discard(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores()
    await store.ingest(message("one", n=1))
    first = await speculative_grant(store, "t1")
    await store.ingest(message("two", n=2))
    # The window was extended, still leased to the speculative holder.
    assert (await window(redis))["leased"] == first.lease.fence

    restarted = await store.interrupt(first.lease)
    assert restarted.status == "stale" and restarted.restarted
    assert restarted.look_in_ms is not None and restarted.look_in_ms <= SPECULATE_MS
    state = await redis.hgetall(Keys(CONV).state)
    assert int(state.get(b"discards", 0)) == 0, "a restart counted as a discard"
    assert b"leased" not in await redis.hgetall(Keys(CONV).window)

    second = await speculative_grant(store, "t2")
    assert second.version == 2
    assert [m.text for m in second.unanswered] == ["one", "two"]
    # The pre-send check sees it the same way, for a holder that did not interrupt.
    await store.ingest(message("three", n=3))
    checked = await store.presend(second.lease, second.version, "late")
    assert checked.status == "stale" and checked.restarted
    assert int((await redis.hgetall(Keys(CONV).state)).get(b"discards", 0)) == 0


async def test_a_message_after_the_window_closed_opens_the_next_and_makes_the_reply_stale(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(quiet_ms=200, speculate_ms=50)
    await store.ingest(message("one", n=1))
    grant = await speculative_grant(store)
    before = await window(redis)
    await asyncio.sleep(window_ms(grant) / 1000 + 0.02)
    # Past the deadline: the burst is the holder's; this message opens a fresh window.
    await store.ingest(message("two", n=2))
    after = await window(redis)
    assert after["opened"] > before["opened"] and "leased" not in after
    checked = await store.presend(grant.lease, grant.version, "stale by now")
    assert checked.status == "stale" and not checked.restarted
    assert int((await redis.hgetall(Keys(CONV).state))[b"discards"]) == 1


async def test_a_burst_the_starvation_guard_will_force_out_waits_for_its_deadline(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(starvation_limit=1)
    await store.ingest(message("one", n=1))
    await redis.hset(Keys(CONV).state, "discards", 1)
    await asyncio.sleep(2 * SPECULATE_MS / 1000)
    grant = await store.acquire(CONV, "t1")
    assert grant.status == "early", "a starved burst was speculated on"
    assert grant.look_in_ms is not None and grant.look_in_ms > SPECULATE_MS


async def test_a_released_lease_gives_the_window_back(stores: StoreFactory, redis: Redis) -> None:
    store = stores()
    await store.ingest(message("one", n=1))
    grant = await speculative_grant(store)
    assert (await store.release(grant.lease)).ok
    assert "leased" not in await window(redis)
    again = await speculative_grant(store, "t2")
    assert again.lease.fence > grant.lease.fence


async def test_without_speculation_the_lease_waits_for_the_deadline(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(speculate_ms=0)
    ingested = await store.ingest(message("one", n=1))
    assert ingested.look_in_ms is not None and ingested.look_in_ms > QUIET_MS - 50
    await asyncio.sleep(2 * SPECULATE_MS / 1000)
    assert (await store.acquire(CONV, "t1")).status == "early"


async def learned(store: Store, gaps_ms: list[int], first: int = 1) -> int:
    """Send a message after each gap (numbered from `first`); the quiet window the last one
    opened or extended, as ingest measured it on the server's clock (a length read back
    later would shrink by however long the test's loop was busy)."""
    look_in_ms = None
    for n, gap in enumerate(gaps_ms, start=first):
        await asyncio.sleep(gap / 1000)
        ingested = await store.ingest(message(f"m{n}", n=n))
        assert ingested.accepted
        look_in_ms = ingested.look_in_ms
    assert look_in_ms is not None
    return look_in_ms


async def test_the_window_shortens_for_single_lines_and_stays_long_for_bursts(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(quiet_ms=400, speculate_ms=0, learn_floor_ms=100)
    # Single lines: every gap longer than the longest window.
    single = await learned(store, [0, 450, 450, 450, 450, 450])
    assert single == 100, f"a user who never follows up kept a {single} ms window"

    await redis.flushall()
    # Bursts: three quick lines (gaps of 200 ms), then a pause, three times.
    burst = await learned(store, [0, 200, 200, 450, 200, 200, 450, 200, 200])
    assert burst == 400, f"a user who types in bursts got a {burst} ms window"


async def test_with_too_few_gaps_known_the_window_is_the_setting(stores: StoreFactory) -> None:
    store = stores(quiet_ms=400, speculate_ms=0, learn_floor_ms=100)
    assert await learned(store, [0, 450, 450]) == 400


async def test_forget_erases_the_learned_pace(stores: StoreFactory, redis: Redis) -> None:
    store = stores(quiet_ms=400, speculate_ms=0, learn_floor_ms=100)
    await learned(store, [0, 450, 450, 450, 450])
    assert await redis.hget(Keys(CONV).state, "gaps")
    await store.forget(CONV)
    assert await redis.hmget(Keys(CONV).state, ["gaps", "gaps_at"]) == [None, None]
    # Back to the setting until enough gaps are known again.
    assert await learned(store, [450], first=6) == 400

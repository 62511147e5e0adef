"""The user's typing, step by step on a real server: typing.lua's side of a window that sees
the user type (and ingest.lua's learning with it).

A typing signal holds an open window as a message would, without changing V and never past
the cap; it cuts a speculative generation (noted by fence, read by the version watch and the
pre-send check); it is bounded like messages (one a second, one after each message, nothing
for a stranger). Where the platform reports typing, the window after a message is the floor
from the first message on, unless the user followed up later than it without being seen
typing. The processes' side (`lastword run`, the fake Discord) is in test_typing_e2e.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.store import TYPING_EVERY_MS, Keys, NotAcquired, Store, StoreSettings
from tests.support.builders import message, window_ms
from tests.support.hashes import integers
from tests.support.speculation import speculative_grant

pytestmark = pytest.mark.timeout(30)

CONV = "test:1"
QUIET_MS = 2000
FLOOR_MS = 300
SPECULATE_MS = 100
MAX_WAIT_MS = 5000
HOLD_MS = 1500

# What every store here is told, unless a test says otherwise.
TIMINGS: dict[str, Any] = {
    "quiet_ms": QUIET_MS,
    "max_wait_ms": MAX_WAIT_MS,
    "ttl_ms": 10_000,
    "history_cap": 10,
    "starvation_limit": 3,
    "speculate_ms": SPECULATE_MS,
    "learn_floor_ms": FLOOR_MS,
}


def store_on(redis: Redis, **overrides: int) -> Store:
    """A store on the test's server, with `TIMINGS` and the test's `overrides`."""
    return Store(redis, StoreSettings(**(TIMINGS | overrides)))


async def window(redis: Redis) -> dict[str, int]:
    return integers(await redis.hgetall(Keys(CONV).window))


async def test_a_message_on_a_typing_platform_gets_the_floor_from_the_first_one(
    redis: Redis,
) -> None:
    store = store_on(redis)
    typed = await store.ingest(message("hi", n=1), typing=True)
    assert typed.look_in_ms is not None and typed.look_in_ms <= SPECULATE_MS
    # Elsewhere, the first messages get the whole quiet window (no warm-up done yet).
    other = await store.ingest(message("hi", n=1, conversation="test:2"))
    assert other.look_in_ms is not None and other.look_in_ms <= SPECULATE_MS
    assert await window_of(store, CONV) <= FLOOR_MS
    assert await window_of(store, "test:2") > QUIET_MS - 100


async def window_of(store: Store, conversation: str) -> int:
    """How long the conversation's window has left, on the server's clock."""
    deadline = int(await store.redis.hget(Keys(conversation).window, "deadline") or 0)
    seconds, micros = await store.redis.time()
    return deadline - (int(seconds) * 1000 + int(micros) // 1000)


async def test_a_signal_holds_the_open_window_without_changing_v(redis: Redis) -> None:
    store = store_on(redis)
    await store.ingest(message("one", n=1), typing=True)
    before = await window(redis)
    typed = await store.typing(CONV, HOLD_MS)
    after = await window(redis)
    assert typed.held and typed.cut == 0
    assert typed.look_in_ms is not None and HOLD_MS - 100 < typed.look_in_ms <= HOLD_MS
    assert after["deadline"] > before["deadline"] and after["opened"] == before["opened"]
    assert after["speculate_at"] == 0, "speculation must wait for the next message"
    assert await store.counters(CONV) == (1, 0)
    due = await redis.zscore(Keys(CONV).due, CONV)
    assert due == after["deadline"], "the due-index must follow the held deadline"
    # The next message ends the hold: the window is the floor after it again.
    await asyncio.sleep(0.05)
    await store.ingest(message("two", n=2), typing=True)
    assert await window_of(store, CONV) <= FLOOR_MS


async def test_a_signal_never_holds_the_window_past_its_cap(redis: Redis) -> None:
    store = store_on(redis, max_wait_ms=800)
    await store.ingest(message("one", n=1), typing=True)
    opened = (await window(redis))["opened"]
    typed = await store.typing(CONV, 10_000)
    assert typed.held
    assert (await window(redis))["deadline"] == opened + 800


async def test_a_signal_with_no_window_open_changes_nothing_but_its_time(redis: Redis) -> None:
    store = store_on(redis)
    # A stranger (no conversation yet) writes nothing at all.
    typed = await store.typing(CONV, HOLD_MS)
    assert not typed.held
    assert not await redis.exists(Keys(CONV).state, Keys(CONV).window, Keys(CONV).due)
    # A closed window (its burst taken) is not reopened by a signal.
    await store.ingest(message("one", n=1), typing=True)
    await asyncio.sleep(FLOOR_MS / 1000 + 0.05)
    grant = await store.acquire(CONV, "t1")
    assert grant.status == "acquired" and window_ms(grant) == 0
    typed = await store.typing(CONV, HOLD_MS)
    assert not typed.held
    assert not await redis.exists(Keys(CONV).window)
    assert b"typed_at" in await redis.hgetall(Keys(CONV).state)


async def test_signals_count_once_a_second_and_once_after_each_message(redis: Redis) -> None:
    store = store_on(redis)
    await store.ingest(message("one", n=1), typing=True)
    assert (await store.typing(CONV, HOLD_MS)).held
    first = await window(redis)
    await asyncio.sleep(0.05)
    dropped = await store.typing(CONV, HOLD_MS)
    assert not dropped.held, "a second signal within a second must be dropped"
    assert await window(redis) == first
    # A message between them: the next signal is the typing of a new line, counted at once.
    await store.ingest(message("two", n=2), typing=True)
    assert (await store.typing(CONV, HOLD_MS)).held
    await asyncio.sleep(TYPING_EVERY_MS / 1000 + 0.05)
    assert (await store.typing(CONV, HOLD_MS)).held


async def test_a_signal_cuts_the_speculative_generation(redis: Redis) -> None:
    store = store_on(redis, learn_floor_ms=QUIET_MS)
    await store.ingest(message("one", n=1), typing=True)
    grant = await speculative_grant(store)
    typed = await store.typing(CONV, HOLD_MS)
    assert typed.held and typed.cut == grant.lease.fence
    assert await store.versions([CONV]) == [(1, grant.lease.fence)]
    # Its holder's pre-send check restarts it (no discard), as a message of its burst would.
    checked = await store.presend(grant.lease, grant.version, "too early")
    assert checked.status == "stale" and checked.restarted
    assert not await redis.exists(Keys(CONV).outbox)
    state = await redis.hgetall(Keys(CONV).state)
    assert int(state.get(b"discards", 0)) == 0
    # Held until the signal lapses; the next holder's fence is not the one cut.
    again = await store.acquire(CONV, "t2")
    assert isinstance(again, NotAcquired), again
    assert again.status == "early" and again.look_in_ms is not None
    assert again.look_in_ms > HOLD_MS - 300
    await store.ingest(message("two", n=2), typing=True)
    second = await speculative_grant(store, "t3")
    assert second.lease.fence != grant.lease.fence
    assert [m.text for m in second.unanswered] == ["one", "two"]
    held = await store.presend(second.lease, second.version, "the answer")
    assert held.status == "hold", "a cut for an earlier fence must not touch this one"


async def test_a_holder_that_hands_back_when_cut_is_restarted(redis: Redis) -> None:
    store = store_on(redis, learn_floor_ms=QUIET_MS)
    await store.ingest(message("one", n=1), typing=True)
    grant = await speculative_grant(store)
    await store.typing(CONV, HOLD_MS)
    handed = await store.interrupt(grant.lease)
    assert handed.status == "stale" and handed.restarted
    assert handed.look_in_ms is not None and handed.look_in_ms > HOLD_MS - 300
    assert b"leased" not in await redis.hgetall(Keys(CONV).window)


async def learned(store: Store, lines: list[tuple[int, bool]], conversation: str = CONV) -> int:
    """Send a line after each (gap, typed in it) and return the window the last one set, on
    the server's clock. A typed gap has a typing signal just after the line before."""
    look = 0
    for n, (gap_ms, typed) in enumerate(lines, start=1):
        if typed:
            await asyncio.sleep(0.02)
            await store.typing(conversation, HOLD_MS)
            gap_ms -= 20
        await asyncio.sleep(gap_ms / 1000)
        line = message(f"m{n}", n=n, conversation=conversation)
        assert (await store.ingest(line, typing=True)).accepted
        look = await window_of(store, conversation)
    return look


async def test_a_follow_up_announced_by_typing_keeps_the_floor(redis: Redis) -> None:
    store = store_on(redis, speculate_ms=0)
    # Follow-ups later than the floor, each with the user seen typing first.
    window_ms = await learned(store, [(0, False), (FLOOR_MS + 200, True), (FLOOR_MS + 200, True)])
    assert window_ms <= FLOOR_MS


async def test_a_follow_up_later_than_the_floor_unannounced_gets_the_whole_window(
    redis: Redis,
) -> None:
    store = store_on(redis, speculate_ms=0)
    # A line pasted after the floor, no typing seen: the platform's typing cannot be trusted
    # for this user, who gets the quiet window as elsewhere.
    window_ms = await learned(store, [(0, False), (FLOOR_MS + 200, False)])
    assert window_ms > QUIET_MS - 300
    # Follow-ups within the floor need no typing: the floor covered them.
    quick = [(0, False), (50, False), (50, False)]
    assert await learned(store, quick, conversation="test:3") <= FLOOR_MS

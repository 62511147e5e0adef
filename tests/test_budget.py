"""The outbound budget's scripts on their own, against a real server (bot/store/budget.py).

A scope allows `count` calls in any sliding period, counted from when each call was answered;
replies wait in the order their windows closed; previews are shed before a reply waits; a
429's hold stops every call under its scope until it ends.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.message import Call, Scope
from bot.store import BudgetKeys, Store, Taken

pytestmark = pytest.mark.timeout(30)

KEYS = BudgetKeys("test")
BOT = Scope("bot", 3, 1.0)
CHAT = Scope("chat:7", 1, 1.0)


async def take(
    store: Store, *scopes: Scope, call: Call = "message", order: int = 0, n: int = 0
) -> Taken:
    """Call `n`'s ask (its ticket t<n>, its grant g<n>)."""
    return await store.take(KEYS, scopes, call=call, ticket=f"t{n}", order_ms=order, grant=f"g{n}")


async def test_a_scope_allows_its_count_then_says_when_the_oldest_leaves(store: Store) -> None:
    for n in range(3):
        assert (await take(store, BOT, n=n)).status == "granted"
        await store.done(KEYS, (BOT,), f"g{n}", used=True)
    refused = await take(store, BOT, n=9)
    assert refused.status == "wait"
    assert refused.scope == "bot"
    # The oldest was answered just now: it leaves the window a period later.
    assert 800 <= refused.wait_ms <= 1000


async def test_a_call_in_flight_fills_its_slot_until_answered(store: Store) -> None:
    assert (await take(store, CHAT, n=1)).status == "granted"
    # Not answered yet: however long it takes, nothing else may go (asked again soon).
    waiting = await take(store, CHAT, n=2)
    assert waiting.status == "wait"
    assert waiting.wait_ms <= 50
    await asyncio.sleep(0.2)
    await store.done(KEYS, (CHAT,), "g1", used=True)
    after = await take(store, CHAT, n=2)
    # Counted from its answer, not from when it was allowed: a full period from now.
    assert after.status == "wait"
    assert after.wait_ms > 900


async def test_a_slot_given_back_is_free_again(store: Store) -> None:
    assert (await take(store, CHAT, n=1)).status == "granted"
    await store.done(KEYS, (CHAT,), "g1", used=False)
    assert (await take(store, CHAT, n=2)).status == "granted"


async def test_replies_go_in_the_order_their_windows_closed(store: Store) -> None:
    for n in range(3):
        assert (await take(store, BOT, n=n)).status == "granted"
        await store.done(KEYS, (BOT,), f"g{n}", used=True)
    # Two replies wait: the later window first asks first.
    assert (await take(store, BOT, order=2000, n=20)).status == "wait"
    assert (await take(store, BOT, order=1000, n=10)).status == "wait"
    await asyncio.sleep(1.05)
    # A slot frees (three, in fact): the earlier window gets one, and so does the later one,
    # since the earlier waits for a slot of its own, not all of them.
    assert (await take(store, BOT, order=2000, n=20)).status == "granted"
    assert (await take(store, BOT, order=1000, n=10)).status == "granted"


async def test_an_earlier_reply_keeps_its_place_when_one_slot_frees(store: Store) -> None:
    single = Scope("bot", 1, 0.5)
    assert (await take(store, single, n=0)).status == "granted"
    await store.done(KEYS, (single,), "g0", used=True)
    assert (await take(store, single, order=1000, n=10)).status == "wait"
    await asyncio.sleep(0.55)
    # The later reply asks first, but the earlier one is still waiting: it goes first.
    late = await take(store, single, order=2000, n=20)
    assert late.status == "wait"
    assert (await take(store, single, order=1000, n=10)).status == "granted"


async def test_a_waiter_that_stops_asking_loses_its_place(store: Store) -> None:
    single = Scope("bot", 1, 0.2)
    assert (await take(store, single, order=1000, n=10)).status == "granted"
    await store.done(KEYS, (single,), "g10", used=True)
    assert (await take(store, single, order=1000, n=11)).status == "wait"
    # Ticket 11 never asks again (its replica died): after TICKET_TTL_MS, 20 goes.
    await asyncio.sleep(0.25)
    assert (await take(store, single, order=2000, n=20)).status == "wait"
    await store.redis.zadd(KEYS.tickets, {"t11": 0})  # as if its ticket had expired
    assert (await take(store, single, order=2000, n=20)).status == "granted"


async def test_previews_are_shed_before_a_reply_would_wait(store: Store) -> None:
    wide = Scope("bot", 6, 1.0)
    # Typing may use half the scope, drafts two thirds; replies all of it.
    assert [(await take(store, wide, call="typing", n=n)).status for n in range(4)] == [
        "granted",
        "granted",
        "granted",
        "shed",
    ]
    assert (await take(store, wide, call="draft", n=5)).status == "shed"
    assert (await take(store, wide, call="message", n=6)).status == "granted"
    assert (await take(store, wide, call="message", n=7)).status == "granted"
    assert (await take(store, wide, call="message", n=8)).status == "granted"
    assert (await take(store, wide, call="message", n=9)).status == "wait"


async def test_no_preview_while_a_reply_waits(store: Store) -> None:
    wide = Scope("bot", 4, 1.0)
    chat = Scope("chat:1", 1, 1.0)
    assert (await take(store, wide, chat, n=1)).status == "granted"
    # A second part to the same chat waits for the chat, and so queues there only: the bot
    # scope has room, and previews elsewhere still go.
    assert (await take(store, wide, chat, n=2)).status == "wait"
    assert (await take(store, wide, call="typing", n=3)).status == "granted"
    for n in range(4, 6):
        assert (await take(store, wide, n=n)).status in ("granted", "wait")
    # Now the bot scope is full and a reply waits there: no preview goes.
    assert (await take(store, wide, n=7)).status == "wait"
    assert (await take(store, wide, call="typing", n=8)).status == "shed"


async def test_a_hold_stops_every_call_under_its_scope_until_it_ends(
    store: Store, redis: Redis
) -> None:
    await store.hold(KEYS, "bot", 300)
    held = await take(store, BOT, CHAT, n=1)
    assert (held.status, held.scope, held.held) == ("wait", "bot", True)
    assert 200 < held.wait_ms <= 300
    assert (await take(store, BOT, call="typing", n=2)).status == "shed"
    # A shorter hold heard later does not cut it short.
    await store.hold(KEYS, "bot", 50)
    assert 0 < (await store.held(KEYS))["bot"] <= 300
    await asyncio.sleep(0.35)
    assert await store.held(KEYS) == {}
    assert (await take(store, BOT, CHAT, n=1)).status == "granted"
    # Nothing of the hold is left behind.
    assert not await redis.exists(KEYS.scope("bot")[2], KEYS.holds)


async def test_the_keys_expire_on_their_own(store: Store, redis: Redis) -> None:
    assert (await take(store, BOT, CHAT, n=1)).status == "granted"
    assert (await take(store, CHAT, n=2)).status == "wait"
    for key in (*KEYS.scope("bot")[:1], *KEYS.scope("chat:7")[:2], KEYS.tickets):
        assert 0 < await redis.pttl(key) <= 31_000, key


async def test_a_reply_deep_in_the_queue_is_told_when_its_turn_comes(store: Store) -> None:
    pair = Scope("bot", 2, 1.0)
    for n in range(2):
        assert (await take(store, pair, n=n)).status == "granted"
        await store.done(KEYS, (pair,), f"g{n}", used=True)
    waits = [(await take(store, pair, order=1000 * n, n=10 + n)).wait_ms for n in range(1, 5)]
    # Two slots a second: the first two waiters within the second, the next two a second on
    # (not polling every few ms meanwhile).
    assert all(0 < wait <= 1000 for wait in waits[:2]), waits
    assert all(1500 < wait <= 2000 for wait in waits[2:]), waits

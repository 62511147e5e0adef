"""`Paced` on its own (bot/outbound/pacing.py): replicas' outbounds drawing on one budget in a real
server, in front of a platform stand-in that declares its limits and answers as told.

A wait that ends leaves nothing behind, a store restart is ridden out, waiting costs a few
store calls a message, a 429's retry_after is kept within sane bounds, and previews give way:
a preview's 429 holds previews alone, and a shed draft is not asked again sooner than the
next draft would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest
from redis.asyncio import Redis

from bot.message import PREVIEWS_SCOPE, Throttled
from bot.outbound import pacer
from bot.outbound.pacer import GATHER_S
from bot.outbound.pacing import MAX_HOLD_S, MIN_HOLD_S, Paced
from bot.store import Store
from bot.store.budget import LAPSE_MS
from bot.store.embedded import EmbeddedRedis
from tests.support.paced_platform import Platform
from tests.support.waits import eventually, server_ms

pytestmark = pytest.mark.timeout(60)


def replica(store: Store, platform: Platform, name: str = "a") -> Paced:
    return Paced(platform, store, "telegram", name, mode="shared")


async def fill(paced: Paced, count: int) -> None:
    """`count` messages sent at once, in chats of their own: the bot-wide scope is full."""
    for n in range(count):
        await paced.send(f"telegram:{9000 + n}", "filler", f"f{n}")


@pytest.mark.parametrize("replicas", ["one replica", "two replicas"])
async def test_a_turn_cancelled_gives_its_place_back_at_once(store: Store, replicas: str) -> None:
    platform = Platform(per_second=1)
    first = replica(store, platform, "a")
    second = first if replicas == "one replica" else replica(store, platform, "b")
    await fill(first, 1)
    filled = time.monotonic()
    # A reply whose window closed first waits on replica a, a later one (told to come a
    # round later, behind it) on b.
    cut_short = asyncio.create_task(first.turn("telegram:1", 1000))
    await asyncio.sleep(0.1)
    behind = asyncio.create_task(second.turn("telegram:2", 2000))
    await asyncio.sleep(0.1)
    # A newer message cuts the first short (or its replica stops): its place goes with it,
    # and the one behind learns of it, on the same replica at once, on another at the next
    # keeping of its places: it takes the slot that frees a second after the filler.
    cut_short.cancel()
    slot = await asyncio.wait_for(behind, timeout=5)
    assert slot is not None
    assert time.monotonic() - filled < 1.5
    await second.give_back(slot)


async def test_a_turn_cancelled_while_asked_for_gives_back_the_slot_it_is_granted(
    redis: Redis, store: Store
) -> None:
    paced = replica(store, Platform(per_second=1))
    sent = paced.keys.scope("bot")[0]
    # The server holds every script call a while: the replica's ask is on its way when a
    # newer message cuts the reply short, and is granted once the server goes on.
    await redis.client_pause(1000, all=False)  # writes (and scripts) only
    cut_short = asyncio.create_task(paced.turn("telegram:1", 1000))

    async def asked() -> bool:
        return paced.stats.calls["take"] == 1

    assert await eventually(asked)
    cut_short.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cut_short

    async def given_back() -> bool:
        # The slot granted to no one is given back, not left in flight until it lapses.
        return paced.stats.recorded["given back"] == 1 and await redis.zcard(sent) == 0

    assert await eventually(given_back, within_s=5)


async def test_an_unexpected_store_error_fails_the_turn_and_pacing_goes_on(
    redis: Redis, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    paced = replica(store, Platform(per_second=5))
    # Not an outage but a bug's kind of error (a key of the wrong type): the reply fails at
    # once, told, rather than wait for ever on a pacer that died of it.
    await redis.set(paced.keys.tickets, "not a sorted set")
    with (
        caplog.at_level(logging.ERROR, logger="bot.outbound.pacer"),
        pytest.raises(Exception, match="WRONGTYPE"),
    ):
        await asyncio.wait_for(paced.turn("telegram:1", 1000), timeout=5)
    assert any("a call to the outbound budget failed" in r.getMessage() for r in caplog.records)
    await redis.delete(paced.keys.tickets)
    slot = await asyncio.wait_for(paced.turn("telegram:2", 2000), timeout=5)
    assert slot is not None
    await paced.give_back(slot)


@pytest.mark.fresh_server
async def test_a_turn_rides_out_a_store_restart(server: EmbeddedRedis, store: Store) -> None:
    platform = Platform(per_second=1)
    paced = replica(store, platform)
    await fill(paced, 1)
    waiting = asyncio.create_task(paced.turn("telegram:1", 1000))
    await asyncio.sleep(0.2)
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(1.0)
    assert not waiting.done()  # the outage is waited out, not a failure
    await asyncio.to_thread(server.start)
    back = time.monotonic()
    slot = await asyncio.wait_for(waiting, timeout=10)
    # The store came back empty: the budget starts as if its last second were full.
    assert slot is not None
    assert time.monotonic() - back < 2.5
    await paced.give_back(slot)


async def test_waiting_costs_a_few_store_calls_a_message(store: Store) -> None:
    # Calls take a while to answer, as a real platform's do: a reply whose slot is in flight
    # is told when it can come, rather than ask again every few milliseconds.
    platform = Platform(per_second=10, latency_s=0.05)
    paced = replica(store, platform)
    messages = 30

    async def reply(n: int) -> None:
        # As a cycle does: its turn, placed by when its window closed, then the send in it.
        conversation = f"telegram:{n}"
        slot = await paced.turn(conversation, 1000 + n)
        await paced.send(conversation, "hi", f"k{n}", slot=slot)

    await asyncio.gather(*(reply(n) for n in range(messages)))
    assert len(platform.sent) == messages
    calls = paced.stats.calls

    async def recorded() -> bool:
        return paced.stats.recorded["used"] == messages

    assert await eventually(recorded)
    # The replica asks for all its waiting replies in one call, when the first of them may
    # go: a few asks in all (one a round of the bot-wide limit), not one or more a reply.
    assert calls["take"] <= messages / 3, dict(calls)
    assert sum(calls.values()) / messages <= 2, dict(calls)


async def test_a_long_hold_is_waited_out_asking_once_or_twice(store: Store) -> None:
    platform = Platform(per_second=50)
    paced = replica(store, platform)
    waiting = 40
    await paced.throttled("bot", 2.0)
    began = time.monotonic()

    async def all_told_to_wait() -> bool:
        return paced.waiting == len(turns)

    turns = [asyncio.create_task(paced.turn("telegram:0", 1000))]
    assert await eventually(all_told_to_wait)
    # The others come one by one, as replies do: each behind one told to wait for the bot's
    # scope, so none is worth an ask of its own; they are placed in the queue together.
    for n in range(1, waiting):
        turns.append(asyncio.create_task(paced.turn(f"telegram:{n}", 1000 + n)))
        await asyncio.sleep(0)

    # Once every reply has asked and been told to wait (not after a guessed pause: a loaded
    # machine may take longer than any), their conversations' typing indicators are shed
    # without asking the store: a reply waits here for the bot's scope.
    assert await eventually(all_told_to_wait, within_s=10)
    for n in range(waiting):
        await paced.typing(f"telegram:{n}")
    assert paced.stats.asked["typing"] == 0
    assert platform.typing_calls == [] and paced.stats.shed["typing"] == waiting
    slots = await asyncio.gather(*turns)
    assert all(slot is not None for slot in slots)
    assert time.monotonic() - began >= 1.8  # nothing before the hold ended
    # All asked for together when they came, and again when the hold ended; their places
    # kept alive by a few calls of the replica's meanwhile, not by each of them.
    assert paced.stats.calls["take"] <= 5, dict(paced.stats.calls)
    assert 1 <= paced.stats.calls["keep"] <= 6, dict(paced.stats.calls)
    for slot in slots:
        await paced.give_back(slot)


async def test_a_retry_after_out_of_bounds_is_clamped_and_told_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    paced = replica(store, Platform())
    with caplog.at_level(logging.WARNING, logger="bot.outbound.pacing"):
        await paced.throttled("chat:1", 10**9)
        await paced.throttled("chat:2", 0)
        await paced.throttled("chat:3", -1)
        await paced.throttled("chat:4", 10**9)
    held = await store.held(paced.keys)
    assert MAX_HOLD_S * 1000 - 5000 < held["chat:1"] <= MAX_HOLD_S * 1000
    for chat in ("chat:2", "chat:3"):
        assert MIN_HOLD_S * 1000 - 200 < held[chat] <= MIN_HOLD_S * 1000
    told = [r.getMessage() for r in caplog.records if "holding it" in r.getMessage()]
    assert len(told) == 2, told  # once too long, once too short: not once a 429


async def test_a_previews_429_holds_previews_and_never_replies(store: Store) -> None:
    platform = Platform(refusing_previews_s=5)
    paced = replica(store, platform)
    with pytest.raises(Throttled):
        await paced.typing("telegram:1")
    assert set(await store.held(paced.keys)) == {PREVIEWS_SCOPE}
    platform.refusing_previews_s = None
    # Replies go as ever; typing indicators and drafts are shed until the hold ends.
    slot = await paced.turn("telegram:1", 1000)
    assert slot is not None and not slot.waited
    await paced.give_back(slot)
    await paced.typing("telegram:2")
    assert platform.typing_calls == []
    with pytest.raises(Throttled):
        await paced.draft("telegram:2", 1, "so far")
    assert platform.drafted == []


@pytest.mark.fresh_server
async def test_a_shed_draft_is_not_asked_again_before_the_next_draft_would_be(
    server: EmbeddedRedis, store: Store
) -> None:
    platform = Platform(per_second=3, draft_interval_s=0.7)
    paced = replica(store, platform)
    await fill(paced, 3)
    with pytest.raises(Throttled) as shed:
        await paced.draft("telegram:1", 1, "so far")
    assert shed.value.retry_after_s >= 0.7
    # Asked again meanwhile (another conversation's), it is shed without asking the store,
    # which said when the scope may have room again.
    with pytest.raises(Throttled) as again:
        await paced.draft("telegram:3", 1, "so far")
    assert again.value.scope == "bot" and again.value.retry_after_s >= 0.7
    assert paced.stats.asked["draft"] == 1
    # With the store down it is shed too (on a replica that has not heard it is full), and
    # not asked again sooner either.
    await asyncio.to_thread(server.stop)
    with pytest.raises(Throttled) as refused:
        await replica(store, platform, "b").draft("telegram:1", 1, "so far")
    assert (refused.value.scope, refused.value.retry_after_s) == ("store", 0.7)
    assert platform.drafted == []
    await asyncio.to_thread(server.start)

    async def drafted() -> list[str]:
        # The store came back empty: the budget starts cautiously, and sheds it a while.
        with contextlib.suppress(Throttled):
            await paced.draft("telegram:2", 2, "back")
        return platform.drafted

    await eventually(drafted, within_s=5, what="a draft once the store is back")


@pytest.mark.fresh_server
async def test_an_answer_heard_while_the_store_is_away_is_recorded_once_it_is_back(
    server: EmbeddedRedis, store: Store, redis: Redis
) -> None:
    platform = Platform(per_second=1)
    paced = replica(store, platform)
    slot = await paced.turn("telegram:1", 1000)
    assert slot is not None
    await asyncio.to_thread(server.stop)
    # The platform answers while the store is away: the call cannot be stamped yet.
    await paced.send("telegram:1", "hi", "k1", slot=slot)
    await asyncio.to_thread(server.start)
    sent = paced.keys.scope("bot")[0]

    async def stamped() -> bool:
        # Counted from its answer, not left in flight until it lapses.
        score = await redis.zscore(sent, slot.grant)
        return score is not None and score <= await server_ms(redis)

    await eventually(stamped, within_s=5, what="the answer recorded once the store is back")
    await paced.stop()


async def test_a_typing_indicator_shed_does_not_shed_a_draft_without_asking(
    store: Store,
) -> None:
    # Ten calls a second: a typing indicator must leave five free, a draft four (drafts rank
    # above typing indicators), and five are taken.
    platform = Platform(per_second=10)
    paced = replica(store, platform)
    await fill(paced, 5)
    await paced.typing("telegram:1")
    assert platform.typing_calls == [] and paced.stats.shed["typing"] == 1
    # What the store said of the typing indicator is not taken to hold for the draft.
    await paced.draft("telegram:1", 1, "so far")
    assert platform.drafted == ["so far"]


async def test_a_busy_replica_gathers_its_budget_calls(store: Store) -> None:
    platform = Platform(per_second=1000)
    paced = replica(store, platform)
    conversations, rounds = 10, 10

    async def showing(n: int) -> None:
        # A conversation's typing indicator, again and again: ten of them, each a few
        # milliseconds apart, come faster than the store's round trips are long.
        await asyncio.sleep(n * 0.001)
        for _ in range(rounds):
            await paced.typing(f"telegram:{n}")
            await asyncio.sleep(0.01)

    began = time.monotonic()
    await asyncio.gather(*(showing(n) for n in range(conversations)))
    took = time.monotonic() - began
    assert len(platform.typing_calls) == conversations * rounds
    # Asks and answers gathered into one store call each GATHER_S (plus the last answers'),
    # not one call each (two hundred).
    assert paced.stats.calls["take"] <= took / GATHER_S + 2, (dict(paced.stats.calls), took)
    assert paced.stats.calls["take"] <= conversations * rounds / 4, dict(paced.stats.calls)


async def test_a_call_slower_than_a_lapse_keeps_its_slot_until_answered(
    store: Store, redis: Redis
) -> None:
    # A message takes twice as long to answer as a call not kept alive lasts (LAPSE_MS): its
    # replica keeps it in flight, so no other replica's message to that chat goes before it
    # is answered, however slowly.
    platform = Platform(per_second=5, latency_s=2 * LAPSE_MS / 1000)
    first, second = replica(store, platform, "a"), replica(store, platform, "b")
    sending = asyncio.create_task(first.send("telegram:1", "slow", "k1"))

    async def granted() -> bool:
        return await redis.zcard(first.keys.scope("chat:1")[0]) == 1

    assert await eventually(granted, within_s=5)
    slot = await asyncio.wait_for(second.turn("telegram:1", 1000), timeout=30)
    assert sending.done() and platform.texts() == ["slow"]
    await second.give_back(slot)


async def test_a_slot_never_answered_lapses_after_the_longest_call(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A turn whose slot is neither used nor given back (a bug's leak): kept in flight for the
    # longest a call may take, then let lapse, so it holds its chat for a while, not for ever.
    monkeypatch.setattr(pacer, "IN_FLIGHT_MS", 3_000)
    platform = Platform(per_second=5)
    first, second = replica(store, platform, "a"), replica(store, platform, "b")
    assert await first.turn("telegram:1", 1000) is not None
    began = time.monotonic()
    slot = await asyncio.wait_for(second.turn("telegram:1", 2000), timeout=30)
    assert time.monotonic() - began >= 3.0 - 0.1  # kept for the longest call meanwhile
    await second.give_back(slot)
    await first.stop()

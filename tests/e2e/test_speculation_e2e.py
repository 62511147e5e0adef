"""Answering at the last word, through `lastword run` (Telegram webhook, the OpenAI client on the
fake provider, a real server): a reply generated while the window is open is not sent before
the window closes, and goes out within 100 ms of its closing; a message inside the window
cancels the speculative generation, and the one reply covers it; the learned window shortens
for a user who sends single lines and stays long for one who types in bursts.

Times are compared on the server's clock, the one deadlines are set by: the fakes' records
(this process's `time.monotonic()`) are moved onto it by an offset read next to a `TIME`."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from bot.store import Keys
from tests.support.drafts import ANSWER, FAST_DRAFTS, draft_text
from tests.support.speculation_env import QUIET_MS, SPECULATION
from tests.support.waits import settled
from tests.support.world import CHAT, CONVERSATION, Bot, World

pytestmark = pytest.mark.timeout(60)

# Within how long of the window closing a held reply must reach the platform.
HELD_WITHIN_MS = 100
# What converting this process's clock to the server's may be off by.
CLOCK_MS = 5


async def server_ms(redis: Redis) -> float:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) / 1000


async def offset_ms(redis: Redis) -> float:
    """The server's clock minus this process's monotonic one, in ms."""
    before = time.monotonic()
    now = await server_ms(redis)
    return now - (before + time.monotonic()) / 2 * 1000


async def deadline(redis: Redis, conversation: str = CONVERSATION) -> int:
    raw = await redis.hget(Keys(conversation).window, "deadline")
    assert raw is not None, "no window is open"
    return int(raw)


async def test_a_reply_generated_in_the_window_waits_for_it_then_goes_out_at_once(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.delay_s = 0.2
    async with world.bot("a", **SPECULATION) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "hello"))
        closes = await deadline(world.redis)
        [sent] = await telegram.wait_for_sent(1, timeout=10)
        await settled(world.redis, CONVERSATION, version=1)
        offset = await offset_ms(world.redis)
    [request] = provider.requests
    started, arrived = request.started_at * 1000 + offset, sent.at * 1000 + offset
    # The generation started once the user had been quiet for SPECULATE_MS, not at the close.
    assert started < closes - QUIET_MS / 2, f"generated {closes - started:.0f} ms before the close"
    assert request.finished and not request.cancelled
    assert arrived >= closes - CLOCK_MS, f"sent {closes - arrived:.0f} ms before the window closed"
    assert arrived - closes <= HELD_WITHIN_MS, f"held {arrived - closes:.0f} ms past the close"
    assert sent.params["text"] == "You said: hello"


async def test_a_message_in_the_window_cancels_the_speculation_and_one_reply_covers_both(
    world: World,
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.delay_s = 2.0
    async with world.bot("a", **SPECULATION) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "first"))
        await provider.wait_for_request(timeout=5)
        await bot.post(telegram.private_text_update(CHAT, CHAT, "second"))
        closes = await deadline(world.redis)
        await settled(world.redis, CONVERSATION, version=2, within_s=15)
        offset = await offset_ms(world.redis)
    cancelled, answered = provider.requests
    assert cancelled.cancelled, "the speculative generation ran on"
    asked = " ".join(str(m["content"]) for m in answered.messages if m["role"] == "user")
    assert "first" in asked and "second" in asked, answered.messages
    [reply] = telegram.sent_messages
    assert reply.at * 1000 + offset >= closes - CLOCK_MS, "sent before the window closed"
    assert "first" in reply.params["text"] and "second" in reply.params["text"]


async def window_after(redis: Redis, conversation: str) -> float:
    """How long the window the last message set is, in ms: its deadline less the moment the
    message was stored, both on the server's clock. (Not the deadline less now: the time the
    test takes to ask would be taken off the window, 101 ms of it once on a loaded machine.)"""
    stored = await redis.hget(Keys(conversation).state, "last_at")
    assert stored is not None, "no message is stored"
    return await deadline(redis, conversation) - int(stored)


async def test_the_learned_window_shortens_for_single_lines_and_stays_long_for_bursts(
    world: World,
) -> None:
    telegram = world.telegram
    single, bursts = 7001, 7002
    learning = {
        "LASTWORD_DEBOUNCE__QUIET_MS": "1000",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "5000",
        "LASTWORD_DEBOUNCE__LEARN": "true",
        "LASTWORD_DEBOUNCE__FLOOR_MS": "200",
    }
    windows: dict[int, float] = {}

    async def user(bot: Bot, chat: int, gaps_s: list[float]) -> None:
        for n, gap in enumerate(gaps_s, start=1):
            await asyncio.sleep(gap)  # the user's own pace is the workload
            await bot.post(telegram.private_text_update(chat, chat, f"line {n}"))
            windows[chat] = await window_after(world.redis, f"telegram:{chat}")

    async with world.bot("a", **learning) as bot:
        await asyncio.gather(
            # One line at a time, each well after the longest window.
            user(bot, single, [0, 1.2, 1.2, 1.2, 1.2, 1.2]),
            # Three lines 0.7 s apart, a pause, three times over.
            user(bot, bursts, [0, 0.7, 0.7, 1.2, 0.7, 0.7, 1.2, 0.7, 0.7]),
        )
        await settled(world.redis, f"telegram:{single}", version=6, within_s=10)
        await settled(world.redis, f"telegram:{bursts}", version=9, within_s=10)
    assert windows[single] <= 300, f"single lines kept a {windows[single]:.0f} ms window"
    assert windows[bursts] >= 900, f"bursts got a {windows[bursts]:.0f} ms window"
    replies = {chat: 0 for chat in (single, bursts)}
    for sent in telegram.sent_messages:
        replies[int(sent.params["chat_id"])] += 1
    assert replies == {single: 6, bursts: 3}, "a burst was split or a line went unanswered"


async def test_a_speculative_reply_is_not_drafted_until_its_window_closes(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    provider.reply = lambda request: ANSWER
    provider.delay_s = 3.0  # streaming from the speculation's start until well past the close
    async with world.bot("a", **SPECULATION, **FAST_DRAFTS) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "tell me something long"))
        closes = await deadline(world.redis)
        await telegram.wait_for_sent(1, timeout=15)
        await settled(world.redis, CONVERSATION, version=1)
        offset = await offset_ms(world.redis)
    shown = [c for c in telegram.calls_to("sendMessageDraft") if c.status == 200]
    assert shown, "nothing was drafted once the window had closed"
    first = min(c.at for c in shown) * 1000 + offset
    assert first >= closes - CLOCK_MS, f"drafted {closes - first:.0f} ms before the window closed"
    # The first draft carries what was generated meanwhile, not "Thinking…".
    assert draft_text(shown[0]).startswith("word0 word1")

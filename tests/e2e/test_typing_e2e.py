"""Typing as an input of the window (issue 35), through `lastword run` on Discord: the real
adapter and discord.py against the fake Discord, which sends `TYPING_START` for a DM, the real
store, and the fake OpenAI where the model's time matters (the echo model elsewhere).

Where the platform reports typing, the window after a message is the floor from the first
message on; a typing signal holds the open window `TYPING_MS` from the signal (never past
`MAX_WAIT_MS`), and cuts a speculative generation; the next message sets it back to the floor.
The hold is kept in Redis, so a replica that never saw the signal keeps it; and a flood of
signals costs at most a round trip a second per person, never one more per message.

Times the fakes record (this process's `time.monotonic()`) are moved onto the server's clock,
the one deadlines are set by, by an offset read next to a `TIME`. The sleeps between a user's
lines play a human's pauses; every wait for the bot is a poll with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store import INGEST, TYPING, Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import HOLDS_GATEWAY, discord_bots, texts, the_holder
from tests.support.fakes.discord_server import FakeDiscord, RecordedPost
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.running import Running
from tests.support.waits import eventually
from tests.support.waits import settled as conversation_settled

pytestmark = pytest.mark.timeout(60)

# The floor the window after a message closes at, when the user is not seen typing.
FLOOR_MS = 600
# What converting this process's clock to the server's may be off by.
CLOCK_MS = 5

ALICE, BOB = 7101, 7102


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as discord:
        yield discord


@pytest.fixture
async def model() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as provider:
        yield provider


def debounce(quiet_ms: int, max_wait_ms: int, typing_ms: int, **extra: str) -> dict[str, str]:
    return {
        "LASTWORD_DEBOUNCE__QUIET_MS": str(quiet_ms),
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": str(max_wait_ms),
        "LASTWORD_DEBOUNCE__TYPING_MS": str(typing_ms),
        "LASTWORD_DEBOUNCE__LEARN": "true",
        "LASTWORD_DEBOUNCE__FLOOR_MS": str(FLOOR_MS),
    } | extra


def on(model: FakeOpenAI) -> dict[str, str]:
    """The OpenAI client on the fake provider."""
    return {
        "LASTWORD_LLM__PROVIDER": "openai",
        "LASTWORD_LLM__BASE_URL": model.base_url,
        "LASTWORD_LLM__API_KEY": "sk-typing-test",
        "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
    }


def conversation(channel: int) -> str:
    return f"discord:{channel}"


async def settled(redis: Redis, channel: int, version: int, within_s: float = 10.0) -> None:
    """Wait until the DM channel's V and W are both `version` (fails showing them)."""
    await conversation_settled(redis, conversation(channel), version=version, within_s=within_s)


async def offset_ms(redis: Redis) -> float:
    """The server's clock minus this process's monotonic one, in ms."""
    before = time.monotonic()
    seconds, micros = await redis.time()
    now = int(seconds) * 1000 + int(micros) / 1000
    return now - (before + time.monotonic()) / 2 * 1000


@contextlib.asynccontextmanager
async def live_bots(
    count: int, server: EmbeddedRedis, fake: FakeDiscord, data_dir: Path, **extra: str
) -> AsyncIterator[list[Running]]:
    """`discord_bots`, once the gateway holder has caught up on its new session: these tests
    are of a session in its steady state. Until the catch-up ends the adapter holds live DMs
    back (`_Gateway._held`) and drops typing signals (`_Gateway._typed`), which would
    otherwise reach the store ahead of the DM they follow."""
    async with discord_bots(count, server, fake, data_dir, **extra) as bots:
        holder = await the_holder(bots)
        await holder.until(
            eventually(lambda: _said(holder, CAUGHT_UP), within_s=20, what="the catch-up"),
            "the catch-up of the new session",
        )
        yield bots


# Logged by the gateway holder once a new session's catch-up is done.
CAUGHT_UP = "catch-up: "


async def _said(bot: Running, text: str) -> bool:
    return bot.said(text) > 0


def posts_to(fake: FakeDiscord, channel: int) -> list[RecordedPost]:
    return [post for post in fake.posts if post.channel_id == channel]


async def types(fake: FakeDiscord, user: int) -> None:
    """The user starts typing in their DM: `TYPING_START` reaches the one gateway session."""
    assert await fake.user_types(user) == 1, "no session asked for DM typing"


async def held_window(redis: Redis, channel: int) -> tuple[int, int]:
    """Once the store has taken a typing signal in: (when, the window's deadline), on the
    server's clock."""
    keys = Keys(conversation(channel))

    async def typed() -> int:
        return int(await redis.hget(keys.state, "typed_at") or 0)

    typed_at = await eventually(typed, within_s=10, what="the typing signal in the store")
    deadline = await redis.hget(keys.window, "deadline")
    assert deadline is not None, "no window is open"
    return typed_at, int(deadline)


async def test_one_line_without_typing_is_answered_at_the_floor_not_the_quiet_window(
    server: EmbeddedRedis,
    redis: Redis,
    fake: FakeDiscord,
    model: FakeOpenAI,
    short_dir: Path,
) -> None:
    quiet_ms = 3000
    model.delay_s = 0.3
    channel = fake.dm_channel(ALICE)
    settings = debounce(quiet_ms, 8000, 10_000) | on(model)
    async with live_bots(1, server, fake, short_dir, **settings):
        sent_at = time.monotonic()
        await fake.user_sends(ALICE, "hello there")
        await fake.wait_for_bot_messages(channel, 1, timeout=15)
        await settled(redis, channel, 1)
    [reply] = posts_to(fake, channel)
    took_ms = (reply.at - sent_at) * 1000
    # Held to the floor (a speculative reply waits for the window), and out long before the
    # quiet window would have closed: the floor applies from the first message.
    assert took_ms >= FLOOR_MS - CLOCK_MS, f"answered {took_ms:.0f} ms after the line"
    assert took_ms < quiet_ms - 1000, f"answered {took_ms:.0f} ms after the line"
    assert texts(fake, channel) == ["You said: hello there"]


async def test_a_slow_typist_gets_one_reply_and_the_same_lines_untyped_get_two(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    typist, control = fake.dm_channel(ALICE), fake.dm_channel(BOB)
    settings = debounce(2000, 8000, 3000)

    async def user(who: int, typing: bool) -> None:
        began = time.monotonic()

        async def at(s: float) -> None:  # the user's own pace
            await asyncio.sleep(max(0.0, began + s - time.monotonic()))

        await fake.user_sends(who, "line one")
        if typing:
            await types(fake, who)  # holds the window to ~3 s
            await at(2.0)
            await types(fake, who)  # and on to ~5 s
        await at(3.5)
        await fake.user_sends(who, "line two")

    async with live_bots(1, server, fake, short_dir, **settings):
        await asyncio.gather(user(ALICE, typing=True), user(BOB, typing=False))
        await settled(redis, typist, 2)
        await settled(redis, control, 2)
    # The control shows the floor alone splits them: the typing is what held the window.
    assert texts(fake, typist) == ["You said: line one / line two"]
    assert texts(fake, control) == ["You said: line one", "You said: line two"]


async def test_a_typing_signal_with_no_line_after_it_holds_the_window_until_it_lapses(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    quiet_ms, max_wait_ms, typing_ms = 5000, 10_000, 1500
    channel = fake.dm_channel(ALICE)
    async with live_bots(1, server, fake, short_dir, **debounce(quiet_ms, max_wait_ms, typing_ms)):
        await fake.user_sends(ALICE, "let me think")
        await types(fake, ALICE)
        typed_at, deadline = await held_window(redis, channel)
        opened = int(await redis.hget(Keys(conversation(channel)).window, "opened") or 0)
        await fake.wait_for_bot_messages(channel, 1, timeout=15)
        await settled(redis, channel, 1)
        offset = await offset_ms(redis)
    # Held from the signal, in place of the floor after the line.
    assert deadline == typed_at + typing_ms
    [reply] = posts_to(fake, channel)
    arrived = reply.at * 1000 + offset
    assert arrived >= deadline - CLOCK_MS, f"answered {deadline - arrived:.0f} ms before the lapse"
    # Released by the lapse: soon after it, long before the quiet window or the cap.
    assert arrived - deadline < 1500, f"answered {arrived - deadline:.0f} ms after the lapse"
    assert arrived - opened < quiet_ms - 1500
    assert texts(fake, channel) == ["You said: let me think"]


async def test_typing_during_a_speculative_generation_cancels_it_and_one_reply_covers_both(
    server: EmbeddedRedis,
    redis: Redis,
    fake: FakeDiscord,
    model: FakeOpenAI,
    short_dir: Path,
) -> None:
    model.delay_s = 2.0
    channel = fake.dm_channel(ALICE)
    # The floor well past the speculation's start, so the signal comes while the window is open.
    settings = debounce(
        3000,
        10_000,
        3000,
        LASTWORD_DEBOUNCE__FLOOR_MS="1500",
        LASTWORD_DEBOUNCE__SPECULATE_MS="300",
    )
    async with live_bots(1, server, fake, short_dir, **settings, **on(model)):
        await fake.user_sends(ALICE, "first line")
        speculating = await model.wait_for_request(timeout=10)
        await types(fake, ALICE)
        # The signal alone cuts it, long before the model would have finished.
        await model.wait_for_request(lambda r: r is speculating and r.cancelled, timeout=5)
        assert not speculating.finished
        await fake.user_sends(ALICE, "second line")
        await fake.wait_for_bot_messages(channel, 1, timeout=20)
        await settled(redis, channel, 2, within_s=15)
    cancelled, answered = model.requests
    assert cancelled is speculating and "first line" in cancelled.last_user_text
    assert answered.finished and not answered.cancelled
    assert "first line" in answered.last_user_text and "second line" in answered.last_user_text
    [reply] = texts(fake, channel)
    assert 0 <= reply.find("first line") < reply.find("second line"), reply


async def test_a_typing_flood_costs_a_round_trip_a_second_and_none_per_message(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(ALICE)
    signals, lines = 50, ("first", "second")
    async with live_bots(1, server, fake, short_dir, **debounce(2000, 8000, 1500)):
        # Every command the server runs goes to the slow log, with its arguments: a script's
        # calls are the EVALSHAs naming its SHA (loaded first, so no NOSCRIPT retry counts).
        ingest, typing = await redis.script_load(INGEST), await redis.script_load(TYPING)
        capacity = 200_000
        await redis.config_set("slowlog-max-len", capacity)
        await redis.config_set("slowlog-log-slower-than", 0)
        await redis.slowlog_reset()
        began = time.monotonic()
        for n in range(signals):
            if n % (signals // len(lines)) == 0:
                await fake.user_sends(ALICE, lines[n * len(lines) // signals])
            await types(fake, ALICE)
            await asyncio.sleep(max(0.0, began + (n + 1) * 0.04 - time.monotonic()))
        flood_s = time.monotonic() - began
        await settled(redis, channel, len(lines), within_s=15)
        await redis.config_set("slowlog-log-slower-than", 10_000)
        logged = await redis.slowlog_get(-1)
        # The server's defaults again, for whatever test shares it next.
        await redis.config_set("slowlog-max-len", 128)
        await redis.slowlog_reset()
    assert len(logged) < capacity, "the slow log overflowed: the counts are short"
    calls = {ingest: 0, typing: 0}
    for entry in logged:
        command = entry["command"].split()
        if command[0].upper() == b"EVALSHA" and command[1].decode() in calls:
            calls[command[1].decode()] += 1
    assert len(fake.typing_events) == signals
    # Exactly one round trip per message, whatever the typing around it.
    assert calls[ingest] == len(lines)
    # The first signal after each message, then one a second at most.
    most = len(lines) + math.ceil(flood_s) + 1
    assert len(lines) <= calls[typing] <= most, f"{calls[typing]} typing calls in {flood_s:.1f} s"
    assert texts(fake, channel) == ["You said: first / second"]


async def test_a_hold_taken_in_by_a_replica_that_dies_is_kept_by_the_other(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    typing_ms = 2500
    channel = fake.dm_channel(ALICE)
    settings = debounce(
        5000,
        15_000,
        typing_ms,
        # No speculation: the dying replica never holds the conversation's lease.
        LASTWORD_DEBOUNCE__SPECULATE_MS="0",
        # The gateway's role too: no replica holds the gateway again within the test, so
        # what the survivor knows of the conversation it reads from Redis.
        LASTWORD_LEASE__TTL_MS="10000",
    )
    async with live_bots(2, server, fake, short_dir, **settings) as bots:
        holder = await the_holder(bots)
        [survivor] = [bot for bot in bots if bot is not holder]
        await fake.user_sends(ALICE, "hang on")
        await types(fake, ALICE)
        typed_at, deadline = await held_window(redis, channel)
        await holder.kill()
        assert deadline == typed_at + typing_ms
        await fake.wait_for_bot_messages(channel, 1, timeout=15)
        await settled(redis, channel, 1)
        offset = await offset_ms(redis)
        assert fake.connected_sessions() == 0 and not survivor.said(HOLDS_GATEWAY)
    [reply] = posts_to(fake, channel)
    arrived = reply.at * 1000 + offset
    # Not at the floor after the line, which the survivor would have used without the hold.
    assert arrived >= deadline - CLOCK_MS, f"answered {deadline - arrived:.0f} ms before the hold"
    assert arrived - deadline < 2000, f"answered {arrived - deadline:.0f} ms after the hold"
    assert texts(fake, channel) == ["You said: hang on"]

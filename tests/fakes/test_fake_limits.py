"""The fake Telegram and the fake Discord enforce the platforms' rate limits (issue 33) as the
real client libraries see them: a call past a limit gets the platform's own 429, performs
nothing and is counted as a violation; a limit of N a second holds over any sliding second,
not over buckets that refill at a second's edge."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable
from datetime import timedelta
from typing import Any

import aiohttp
import discord
import discord.http
import pytest
from telegram import Bot
from telegram.constants import ChatAction
from telegram.error import RetryAfter

from tests.support.fakes.discord_server import FakeDiscord, discord_limits
from tests.support.fakes.limits import Limits, Violation
from tests.support.fakes.telegram_server import FakeTelegram, telegram_limits

pytestmark = pytest.mark.timeout(30)

GROUP = -1001234567890


@pytest.fixture(autouse=True)
def timedelta_retry_after(monkeypatch: pytest.MonkeyPatch) -> None:
    # Opt in to PTB 23's timedelta retry_after now (read at access time; avoids a deprecation).
    monkeypatch.setenv("PTB_TIMEDELTA", "1")


def waited_s(refused: RetryAfter) -> float:
    retry_after = refused.retry_after
    assert isinstance(retry_after, timedelta)
    return retry_after.total_seconds()


@contextlib.asynccontextmanager
async def telegram(limits: Limits) -> AsyncIterator[tuple[FakeTelegram, Bot]]:
    async with (
        FakeTelegram(limits=limits) as fake,
        Bot(fake.token, base_url=f"{fake.api_url}/bot") as bot,
    ):
        yield fake, bot


async def refused_after(send: Awaitable[Any]) -> int | None:
    """The retry_after PTB raised for `send`, or None if it went through."""
    try:
        await send
    except RetryAfter as refused:
        return math.ceil(waited_s(refused))
    return None


def named(violations: list[Violation]) -> list[tuple[str, str, str]]:
    return [(v.limit, v.key, v.method) for v in violations]


# -- Telegram --------------------------------------------------------------------------------


async def test_telegram_bot_wide_limit_refuses_the_31st_at_once() -> None:
    limits = telegram_limits()
    async with telegram(limits) as (fake, bot):
        refused = await asyncio.gather(
            *(refused_after(bot.send_message(chat, "hi")) for chat in range(1, 32))
        )
        calls = fake.calls_to("sendMessage")

    assert calls[-1].at - calls[0].at < 1.0, "the burst must fit in one second to mean anything"
    assert sorted(refused, key=lambda r: r is not None) == [None] * 30 + [1]
    assert named(limits.violations) == [("bot", "bot", "sendMessage")]
    assert sorted(c.status or 0 for c in calls) == [200] * 30 + [429]


async def test_telegram_second_message_to_one_chat_within_a_second_is_refused() -> None:
    limits = telegram_limits()
    async with telegram(limits) as (fake, bot):
        await bot.send_message(7, "one")
        await asyncio.sleep(0.2)
        with pytest.raises(RetryAfter) as refused:
            await bot.send_message(7, "two")
        # Another chat is not held by this one's limit.
        await bot.send_message(8, "elsewhere")

    assert waited_s(refused.value) == 1
    assert named(limits.violations) == [("chat", "7", "sendMessage")]
    calls = fake.calls_to("sendMessage")
    assert [(c.chat_id, c.status) for c in calls] == [(7, 200), (7, 429), (8, 200)]
    refusal = calls[1]
    assert refusal.description == "Too Many Requests: retry after 1"
    assert refusal.result is None


def test_telegram_limit_is_a_sliding_second_not_a_bucket() -> None:
    """30 calls in the last 0.3 s of one second of the clock, then one 0.2 s into the next:
    a bucket refilled at the edge would let it through; a sliding second must not. The calls'
    times are given (`Limits.check`'s `now`), not waited for: paced on the real clock through
    HTTP, a loaded machine spread the 30 calls over more than a second. The refusal over HTTP
    is `test_telegram_bot_wide_limit_refuses_the_31st_at_once`'s."""
    limits = telegram_limits()
    sent_at = [100.7 + n * 0.01 for n in range(30)]
    for chat, at in enumerate(sent_at, start=1):
        assert limits.check("sendMessage", {"chat_id": chat}, at) is None
    late = 101.2  # past the second's edge, within a second of the first call
    violation = limits.check("sendMessage", {"chat_id": 31}, late)
    assert violation is not None, "a bucket refilled at the edge let it through"
    assert named(limits.violations) == [("bot", "bot", "sendMessage")]
    # It is refused until the first call is a second old, and not longer.
    assert violation.retry_after_s == pytest.approx(sent_at[0] + 1.0 - late, abs=1e-9)
    assert limits.check("sendMessage", {"chat_id": 32}, sent_at[0] + 0.999) is not None
    assert limits.check("sendMessage", {"chat_id": 33}, sent_at[0] + 1.0) is None


async def test_telegram_group_limit_counts_a_minute() -> None:
    limits = telegram_limits(chat_per_second=10, group_per_minute=3)
    async with telegram(limits) as (fake, bot):
        for n in range(3):
            await bot.send_message(GROUP, f"group {n}")
        with pytest.raises(RetryAfter) as refused:
            await bot.send_message(GROUP, "one too many")
        # A private chat (positive id) is no group: as many as the chat limit allows.
        for n in range(4):
            await bot.send_message(7, f"private {n}")

    assert 59 <= waited_s(refused.value) <= 60
    assert named(limits.violations) == [("group", str(GROUP), "sendMessage")]
    assert [c.status for c in fake.calls_to("sendMessage")] == [200] * 3 + [429] + [200] * 4


async def test_telegram_drafts_and_typing_count_only_bot_wide() -> None:
    limits = telegram_limits(per_second=5)
    async with telegram(limits) as (fake, bot):
        await bot.send_message_draft(7, 1, "draft")
        await bot.send_chat_action(7, ChatAction.TYPING)
        await bot.send_message_draft(7, 1, "draft, longer")
        await bot.send_chat_action(7, ChatAction.TYPING)
        # Neither is a message: the chat's one message a second is still there.
        await bot.send_message(7, "the reply")
        # But all five count against the bot: a sixth call in the same second is refused.
        sixth = await refused_after(bot.send_chat_action(7, ChatAction.TYPING))
        calls = fake.calls[-6:]

    assert calls[-1].at - calls[0].at < 1.0
    assert [c.status for c in calls] == [200] * 5 + [429]
    assert sixth == 1
    assert named(limits.violations) == [("bot", "bot", "sendChatAction")]


async def test_telegram_without_limits_limits_nothing() -> None:
    async with FakeTelegram() as fake, Bot(fake.token, base_url=f"{fake.api_url}/bot") as bot:
        for n in range(3):
            await bot.send_message(7, f"quick {n}")

    assert fake.limits is None
    assert [c.status for c in fake.calls_to("sendMessage")] == [200] * 3


# -- Discord ---------------------------------------------------------------------------------

USER = 310000000000000001
_MESSAGES = "/channels/{channel_id}/messages"


@contextlib.asynccontextmanager
async def discord_client(
    fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[discord.Client]:
    monkeypatch.setattr(discord.http.Route, "BASE", fake.api_url)
    client = discord.Client(intents=discord.Intents(dm_messages=True))
    try:
        await client.login(fake.token)
        yield client
    finally:
        await client.close()


async def test_discord_sixth_message_to_a_channel_waits_out_its_429(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A one-second window (Discord's is 5 s) keeps the test short; the rule is the same.
    limits = discord_limits(channel_messages=5, channel_per_s=1.0)
    async with FakeDiscord(limits=limits) as fake, discord_client(fake, monkeypatch) as client:
        channel = client.get_partial_messageable(fake.dm_channel(USER))
        sent = [await channel.send(f"message {n}") for n in range(6)]

    # discord.py does not raise: it sleeps out the retry_after and sends the sixth again.
    assert [p.status for p in fake.posts] == [200] * 5 + [429, 200]
    assert named(limits.violations) == [("channel", str(channel.id), "POST " + _MESSAGES)]
    [violation] = limits.violations
    assert fake.posts[6].at - fake.posts[5].at >= violation.retry_after_s
    assert fake.posts[6].at - fake.posts[0].at >= 1.0
    messages = fake.bot_messages(channel.id)
    assert [m["id"] for m in messages] == [str(m.id) for m in sent]
    assert [m["content"] for m in messages] == [f"message {n}" for n in range(6)]


async def test_discord_global_limit_is_global_and_waited_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeDiscord() as fake, discord_client(fake, monkeypatch) as client:
        # From here on: login's own requests are not part of the count.
        limits = fake.limits = discord_limits(per_second=5)
        channels = [client.get_partial_messageable(fake.dm_channel(USER + n)) for n in range(6)]
        with caplog.at_level(logging.WARNING, logger="discord.http"):
            sent = await asyncio.gather(*(c.send("hi") for c in channels))

    assert sorted(p.status or 0 for p in fake.posts) == [200] * 6 + [429]
    assert named(limits.violations) == [("bot", "bot", "POST " + _MESSAGES)]
    # discord.py read it as the global limit (it holds every route, not one bucket) ...
    assert "Global rate limit has been hit" in caplog.text
    # ... and still delivered every message, one to each channel.
    assert all(len(fake.bot_messages(c.id)) == 1 for c in channels)
    assert len(sent) == 6


async def test_discord_429_wire_format() -> None:
    """What a client that is not discord.py sees: Discord's body and headers."""
    # The refused POST does not count against the global limit: the first GET still passes.
    limits = discord_limits(per_second=2, channel_messages=1, channel_per_s=5.0)
    async with FakeDiscord(limits=limits) as fake, aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bot {fake.token}"}
        url = f"{fake.api_url}/channels/{fake.dm_channel(USER)}/messages"
        async with session.post(url, json={"content": "a"}, headers=headers) as response:
            assert response.status == 200
        async with session.post(url, json={"content": "b"}, headers=headers) as response:
            channel_body = await response.json()
            channel_headers = response.headers
            assert response.status == 429
        async with session.get(f"{fake.api_url}/users/@me", headers=headers) as response:
            assert response.status == 200
        async with session.get(f"{fake.api_url}/users/@me", headers=headers) as response:
            global_body = await response.json()
            global_headers = response.headers
            assert response.status == 429

    assert channel_body["message"] == "You are being rate limited."
    assert channel_body["global"] is False
    assert 4.0 < channel_body["retry_after"] <= 5.0
    assert channel_headers["Retry-After"] == "5"
    assert channel_headers["X-RateLimit-Scope"] == "user"
    assert "Via" in channel_headers
    assert "X-RateLimit-Global" not in channel_headers

    assert global_body["global"] is True
    assert 0.0 < global_body["retry_after"] <= 1.0
    assert global_headers["X-RateLimit-Global"] == "true"
    assert global_headers["Retry-After"] == "1"
    assert "Via" in global_headers
    assert named(limits.violations) == [
        ("channel", str(fake.dm_channel(USER)), "POST " + _MESSAGES),
        ("bot", "bot", "GET /users/@me"),
    ]
    # The refused requests are recorded, with their status; the refused POST created nothing.
    assert [r.status for r in fake.requests] == [200, 429, 200, 429]
    assert [p.status for p in fake.posts] == [200, 429]
    assert len(fake.bot_messages(fake.dm_channel(USER))) == 1

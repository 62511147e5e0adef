"""A 429 holds only what it is about (issue 47): the adapters name the scope, in process,
through the real client libraries against the fake platforms.

Telegram does not say which limit a 429 was, so a call's 429 names the chat it was about: a
private chat's own scope, a group's minute; never the whole bot for one chat (the store widens
it once several chats are refused close together). A wait Telegram should never name (0,
negative, 10⁹ s) reaches the core as the number it was, for the core to bound.

Discord says: the global flag or scope holds the bot, a channel's messages route that channel,
a typing indicator the previews, and any other route (the command menu's) nothing. A 429
longer than discord.py waits out is `Throttled`, for the core to hold while the reply waits,
not a failed attempt."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest
from multidict import CIMultiDict
from redis.asyncio import Redis

from adapters.discord import DiscordAdapter, DiscordSettings, _scope_of_429
from adapters.telegram import TelegramAdapter, TelegramSettings
from bot.cancel import cancel_and_wait
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.message import BOT_SCOPE, PREVIEWS_SCOPE, Place, Throttled
from bot.service.app import make_store
from bot.store import BudgetKeys
from tests.support.factories import SettingsFactory
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.discord_server import ScriptedError as DiscordError
from tests.support.fakes.telegram_server import FakeTelegram, ScriptedError
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(60)

DM, OTHER_DM, GROUP, ANN = 4242, 4343, -100777, 101
USER = 310000000000000077
WAIT_S = 10.0


# Telegram


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[TelegramAdapter, FakeTelegram]]:
    """The real Telegram adapter, its bot open (getMe) against the fake Bot API."""
    async with FakeTelegram() as fake:
        settings = TelegramSettings.model_validate({"token": fake.token, "api_url": fake.api_url})
        adapter = TelegramAdapter(settings)
        async with adapter.bot:
            yield adapter, fake


def in_group(chat: int) -> str:
    return Place("telegram", str(chat), str(ANN), group=True).conversation


async def test_a_telegram_429_holds_the_chat_it_was_about_not_the_bot(
    telegram: tuple[TelegramAdapter, FakeTelegram],
) -> None:
    adapter, fake = telegram
    fake.fail_chat(DM, fake.too_many_requests(3600), "sendMessage")
    fake.fail_chat(GROUP, fake.too_many_requests(30), "sendMessage")
    with pytest.raises(Throttled) as dm:
        await adapter.send(f"telegram:{DM}", "hi", "k1")
    with pytest.raises(Throttled) as group:
        await adapter.send(in_group(GROUP), "hi all", "k2")
    # The private chat's own scope, by the name the budget knows it by.
    assert dm.value.scope == f"chat:{DM}"
    assert f"chat:{DM}" in [s.name for s in adapter.scopes(f"telegram:{DM}", "message")]
    assert group.value.scope == f"group:{GROUP}"
    assert (dm.value.retry_after_s, group.value.retry_after_s) == (3600.0, 30.0)
    # A guess: the core may widen it when several chats are refused close together.
    assert dm.value.inferred and group.value.inferred
    # Another chat is not refused, and the refused one was asked once each (no retries).
    await adapter.send(f"telegram:{OTHER_DM}", "hello", "k3")
    assert [(c.chat_id, c.status) for c in fake.calls_to("sendMessage")] == [
        (DM, 429),
        (GROUP, 429),
        (OTHER_DM, 200),
    ]


@pytest.mark.parametrize("method", ["sendChatAction", "sendMessageDraft"])
async def test_a_telegram_preview_429_is_throttled_naming_its_chat(
    telegram: tuple[TelegramAdapter, FakeTelegram], method: str
) -> None:
    adapter, fake = telegram
    fake.fail_chat(DM, fake.too_many_requests(7), method)
    with pytest.raises(Throttled) as refused:
        if method == "sendChatAction":
            await adapter.typing(f"telegram:{DM}")
        else:
            await adapter.draft(f"telegram:{DM}", 1, "so far")
    assert (refused.value.scope, refused.value.retry_after_s) == (f"chat:{DM}", 7.0)
    # Only that method is refused in that chat: the reply itself goes.
    await adapter.send(f"telegram:{DM}", "the reply", "k1")
    assert [c.status for c in fake.calls_to("sendMessage")] == [200]


@pytest.mark.parametrize(
    ("refusal", "retry_after"),
    [
        (FakeTelegram.too_many_requests(0), 0.0),
        (FakeTelegram.too_many_requests(-1), -1.0),
        (FakeTelegram.too_many_requests(10**9), 1e9),
        # Past what python-telegram-bot's RetryAfter (a timedelta) can hold.
        (FakeTelegram.too_many_requests(10**15), 1e12),
        (ScriptedError(429, "Too Many Requests"), 0.0),
    ],
    ids=["zero", "negative", "huge", "overflowing", "none"],
)
async def test_an_odd_telegram_retry_after_reaches_the_core_as_the_number_it_was(
    telegram: tuple[TelegramAdapter, FakeTelegram], refusal: ScriptedError, retry_after: float
) -> None:
    adapter, fake = telegram
    conversation = f"telegram:{DM}"
    calls: dict[str, Any] = {
        "sendMessage": adapter.send(conversation, "hi", "k1"),
        "sendChatAction": adapter.typing(conversation),
        "sendMessageDraft": adapter.draft(conversation, 1, "so far"),
    }
    for method, call in calls.items():
        fake.fail_next(method, refusal)
        with pytest.raises(Throttled) as refused:
            await call
        # Flood control, even at 0 or none (python-telegram-bot makes those a network error):
        # the core bounds it and holds the chat, rather than the call being retried at once.
        assert refused.value.retry_after_s == retry_after, method
        assert refused.value.scope == f"chat:{DM}", method
        assert [c.status for c in fake.calls_to(method)] == [429], method
    # And the adapter goes on as before.
    await adapter.send(conversation, "hi", "k2")
    assert fake.bot_replies_in(DM)[-1].text == "hi"


# Discord: what the headers and the route say


def headers(**named: str) -> CIMultiDict[str]:
    """Response headers as aiohttp hands them over (names in any case: a proxy may lower
    them)."""
    return CIMultiDict({name.replace("_", "-").lower(): value for name, value in named.items()})


MESSAGES = "/api/v10/channels/555/messages"
TYPING = "/api/v10/channels/555/typing"
COMMANDS = "/api/v10/applications/99/commands"


@pytest.mark.parametrize(
    ("path", "said", "scope"),
    [
        (MESSAGES, headers(X_RateLimit_Global="true", Retry_After="5"), BOT_SCOPE),
        (MESSAGES, headers(X_RateLimit_Scope="global", Retry_After="5"), BOT_SCOPE),
        (COMMANDS, headers(X_RateLimit_Global="True", Retry_After="5"), BOT_SCOPE),
        (MESSAGES, headers(X_RateLimit_Scope="user", Retry_After="5"), "channel:555"),
        (MESSAGES, headers(X_RateLimit_Scope="shared", Retry_After="5"), "channel:555"),
        (TYPING, headers(X_RateLimit_Scope="user", Retry_After="5"), PREVIEWS_SCOPE),
        (COMMANDS, headers(X_RateLimit_Scope="user", Retry_After="5"), None),
        ("/api/v10/users/@me/channels", headers(Retry_After="5"), None),
    ],
    ids=[
        "global-flag",
        "global-scope",
        "global-any-route",
        "messages",
        "messages-shared",
        "typing",
        "commands",
        "other",
    ],
)
def test_a_discord_429_holds_what_discord_says_it_is_about(
    path: str, said: CIMultiDict[str], scope: str | None
) -> None:
    heard = _scope_of_429(path, said)
    assert (heard and heard[0]) == scope
    if heard is not None:
        assert heard[1] == 5.0


@pytest.mark.parametrize(
    ("said", "wait"),
    [
        (headers(Retry_After="2", X_RateLimit_Reset_After="1.250"), 2.0),
        (headers(Retry_After="1", X_RateLimit_Reset_After="61.5"), 61.5),
        (headers(Retry_After="0"), 0.0),
        (headers(Retry_After="-1"), -1.0),
        (headers(Retry_After="1000000000"), 1e9),
        (headers(Retry_After="soon", X_RateLimit_Reset_After="nan"), 1.0),
        (headers(), 1.0),
    ],
    ids=["longest", "bucket-longer", "zero", "negative", "huge", "unreadable", "none"],
)
def test_a_discord_429s_wait_is_the_longest_its_headers_name_as_given(
    said: CIMultiDict[str], wait: float
) -> None:
    assert _scope_of_429(MESSAGES, said) == ("channel:555", wait)


# Discord: the adapter against the fake


@pytest.fixture
def discord_aimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """discord.py's class attributes, which the adapter aims at the fake, put back after."""
    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    gateway = discord.gateway.DiscordWebSocket
    monkeypatch.setattr(gateway, "DEFAULT_GATEWAY", gateway.DEFAULT_GATEWAY)
    monkeypatch.setattr(discord.client, "DiscordWebSocket", discord.client.DiscordWebSocket)


def discord_settings(fake: FakeDiscord) -> dict[str, Any]:
    return {"token": fake.token, "api_url": fake.api_url, "gateway_url": fake.gateway_url}


@pytest.fixture
async def logged_in(discord_aimed: None) -> AsyncIterator[tuple[DiscordAdapter, FakeDiscord]]:
    """The real Discord adapter, logged in over REST to the fake (no gateway, no core)."""
    async with FakeDiscord() as fake:
        adapter = DiscordAdapter(DiscordSettings.model_validate(discord_settings(fake)))
        await adapter.login()
        try:
            yield adapter, fake
        finally:
            await adapter.rest.close()


@pytest.mark.parametrize(
    ("refusal", "scope"),
    [
        (FakeDiscord.rate_limited(120), "channel"),
        (FakeDiscord.rate_limited(120, global_=True), BOT_SCOPE),
        (FakeDiscord.rate_limited(120, scope="global"), BOT_SCOPE),
        (FakeDiscord.rate_limited(10**9), "channel"),
    ],
    ids=["channel", "global-flag", "global-scope", "huge"],
)
async def test_a_discord_429_longer_than_discord_py_waits_is_throttled_not_a_failure(
    logged_in: tuple[DiscordAdapter, FakeDiscord], refusal: DiscordError, scope: str
) -> None:
    adapter, fake = logged_in
    channel = fake.dm_channel(USER)
    fake.fail_next_post(channel, refusal)
    with pytest.raises(Throttled) as refused:
        await adapter.send(f"discord:{channel}", "hi", "k1")
    expected = f"channel:{channel}" if scope == "channel" else scope
    assert refused.value.scope == expected
    assert refused.value.retry_after_s == float(refusal.body["retry_after"])
    # Discord said which limit it was: nothing for the core to widen.
    assert not refused.value.inferred
    assert [p.status for p in fake.posts] == [429]


async def test_a_discord_typing_429_longer_than_discord_py_waits_holds_the_previews(
    logged_in: tuple[DiscordAdapter, FakeDiscord],
) -> None:
    adapter, fake = logged_in
    channel = fake.dm_channel(USER)
    fake.fail_next_request("POST /channels/{channel_id}/typing", FakeDiscord.rate_limited(120))
    with pytest.raises(Throttled) as refused:
        await adapter.typing(f"discord:{channel}")
    assert (refused.value.scope, refused.value.retry_after_s) == (PREVIEWS_SCOPE, 120.0)


async def test_discord_429s_waited_out_hold_for_every_replica_only_what_they_are_about(
    discord_aimed: None, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Running with the core behind it: a 429 discord.py waits out is told to the core, which
    holds its scope in the store; one on the command menu's route holds nothing, and one
    past what discord.py waits is left to the call's `Throttled` (not told twice)."""
    async with FakeDiscord() as fake:
        channel = fake.dm_channel(USER)
        settings = make_settings(platform="discord", discord=discord_settings(fake))
        adapter = DiscordAdapter(settings.section(DiscordSettings))
        store = make_store(settings, redis)
        runtime = Runtime(settings, store, EchoLLM(), adapter)
        runtime.start()
        # The menu, registered at start: discord.py waits this one out in the background.
        menu = "PUT /applications/{application_id}/commands"
        fake.fail_next_request(menu, FakeDiscord.rate_limited(20))
        running = asyncio.create_task(adapter.run(runtime))
        try:
            await fake.wait_for_sessions(1, timeout=WAIT_S)
            await fake.wait_for(
                lambda: any(r.status == 429 and r.method == "PUT" for r in fake.requests),
                timeout=WAIT_S,
            )
            fake.fail_next_post(channel, FakeDiscord.rate_limited(120))
            with pytest.raises(Throttled):
                await adapter.send(f"discord:{channel}", "hi", "k1")
            # Waited out by discord.py (3 s), and held meanwhile for every replica.
            typing = "POST /channels/{channel_id}/typing"
            fake.fail_next_request(typing, FakeDiscord.rate_limited(3))
            showing = asyncio.create_task(adapter.typing(f"discord:{channel}"))

            async def held() -> dict[str, int]:
                return await store.held(BudgetKeys("discord"))

            holds = await eventually(held, within_s=WAIT_S, what="the typing 429's hold")
            assert set(holds) == {PREVIEWS_SCOPE}
            await showing
            assert [c for c, _ in fake.typing_calls] == [channel]
        finally:
            await cancel_and_wait(running)
            await runtime.stop()

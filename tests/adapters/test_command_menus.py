"""The platforms' command menus, through `lastword run` against the loopback fakes: at start
the Telegram adapter sets its menu (`setMyCommands`: everyone's commands, and the admin ones
too in each admin's chat) and the Discord adapter registers the same as application commands
usable in DMs, each entry as `/help` shows it, so the menu and `/help` never differ. A menu
Telegram refuses or hangs on never stops the bot; a slash command used in a Discord DM is
answered through the same registry as a typed one, which still works."""

from __future__ import annotations

import contextlib
import html
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running, run_env
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(60)

USER = 4242
ADMIN = 777


def help_entries(answer: str) -> dict[str, str]:
    """A /help answer's commands: each name, with what it says after "/name "."""
    entries = {}
    for line in answer.splitlines():
        if line.startswith("/"):
            name, _, rest = line[1:].partition(" ")
            name = name.removesuffix(":")
            entries[name] = rest if rest.startswith("<") else rest.removeprefix(": ")
    return entries


def menu_entries(menu: list[dict[str, str]] | None) -> dict[str, str]:
    assert menu is not None, "no menu was set"
    return {entry["command"]: entry["description"] for entry in menu}


@contextlib.asynccontextmanager
async def telegram_bot(
    server: EmbeddedRedis, data_dir: Path, telegram: FakeTelegram
) -> AsyncIterator[Running]:
    """A polling `lastword run` on the fake Bot API, with one admin."""
    env = run_env("telegram", server.url, data_dir) | {
        "LASTWORD_TELEGRAM__TOKEN": telegram.token,
        "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
        "LASTWORD_ACCESS__ADMINS": str(ADMIN),
    }
    running = await Running.start(env)
    try:
        yield running
    finally:
        await running.stop()


async def test_the_telegram_menu_is_what_help_lists_for_users_and_for_admins(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with FakeTelegram() as telegram, telegram_bot(server, short_dir, telegram):
        await telegram.wait_for_calls("setMyCommands", 2, timeout=20)
        telegram.push_update(telegram.private_text_update(USER, USER, "/help"))
        telegram.push_update(telegram.private_text_update(ADMIN, ADMIN, "/help"))
        await telegram.wait_for_sent(2, timeout=15)
        await settled(redis, f"telegram:{USER}", version=1)
        await settled(redis, f"telegram:{ADMIN}", version=1)
    # As sent: Telegram HTML.
    answers = {call.chat_id: html.unescape(call.text or "") for call in telegram.sent_messages}
    users, admins = help_entries(answers[USER]), help_entries(answers[ADMIN])
    assert "help" in users and "allow" not in users and "allow" in admins
    assert menu_entries(telegram.menu()) == users
    assert menu_entries(telegram.menu(ADMIN)) == admins
    # Only the admin's chat has a menu of its own.
    assert len(telegram.menus) == 2


async def test_a_menu_telegram_refuses_or_hangs_on_never_holds_up_replies(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with FakeTelegram() as telegram:
        telegram.hang("setMyCommands")
        async with telegram_bot(server, short_dir, telegram) as running:
            await telegram.wait_for_calls("setMyCommands", 1, timeout=20)
            telegram.push_update(telegram.private_text_update(USER, USER, "hello"))
            [reply] = await telegram.wait_for_sent(1, timeout=15)
            assert "hello" in (reply.text or "")
            # Then Telegram answers, refusing twice: flood control, then a 502.
            telegram.fail_next("setMyCommands", telegram.too_many_requests(1))
            telegram.fail_next("setMyCommands", telegram.server_error(502))
            telegram.hang("setMyCommands", False)

            async def registered() -> int:
                return running.said("telegram command menu registered")

            assert await eventually(registered, within_s=40, what="the menu registered") == 1
            assert running.process.returncode is None
            assert running.said("telegram command menu not registered") >= 2
            assert telegram.menu() is not None and telegram.menu(ADMIN) is not None
        # (A call still hung when the client gave up has no status.)
        statuses = [c.status for c in telegram.calls_to("setMyCommands")]
        assert [s for s in statuses if s in (429, 502)] == [429, 502]


async def test_discord_slash_commands_in_a_dm_are_the_registry_s_and_answered_like_typed_ones(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with FakeDiscord() as discord:
        channel = discord.dm_channel(USER)
        conversation = f"discord:{channel}"
        env = run_env("discord", server.url, short_dir) | {
            "LASTWORD_DISCORD__TOKEN": discord.token,
            "LASTWORD_DISCORD__API_URL": discord.api_url,
            "LASTWORD_DISCORD__GATEWAY_URL": discord.gateway_url,
        }
        running = await Running.start(env)
        try:
            await discord.wait_for_sessions(1, timeout=20)
            await discord.wait_for(lambda: bool(discord.application_commands), timeout=20)
            # Typed, as before.
            await discord.user_sends(USER, "/help")
            await discord.wait_for_bot_messages(channel, 1, timeout=15)
            await settled(redis, conversation, version=1)
            # From the / menu: the same answer, and arguments reach the command.
            used = await discord.user_uses_command(USER, "help")
            await discord.wait_for_bot_messages(channel, 2, timeout=15)
            await settled(redis, conversation, version=2)
            persona = await discord.user_uses_command(USER, "persona", "be brief")
            await discord.wait_for_bot_messages(channel, 3, timeout=15)
            await settled(redis, conversation, version=3)
            await discord.user_uses_command(USER, "persona")
            answers = await discord.wait_for_bot_messages(channel, 4, timeout=15)
            await settled(redis, conversation, version=4)
            assert running.process.returncode is None
        finally:
            await running.stop()
    typed_help, menu_help, picked, shown = (m["content"] for m in answers)
    assert menu_help == typed_help
    assert picked == "Done: I follow your persona from now on."
    assert shown == "Your persona:\nbe brief"
    # Each interaction was answered once, at once, with a note only its user sees.
    for interaction in (used, persona):
        [(status, body)] = discord.interactions[interaction].answers
        assert status == 200 and body["data"]["flags"] & 64
    # The menu is /help's, each entry cut to Discord's 100 characters, usable in the bot's DM.
    listed = help_entries(typed_help)
    registered = {c["name"]: c for c in discord.application_commands}
    assert list(registered) == list(listed)
    for name, command in registered.items():
        description = command["description"]
        assert description == listed[name] or (
            description.endswith("…") and listed[name].startswith(description[:-1])
        )
        assert command["contexts"] == [1]
    assert [o["name"] for o in registered["persona"]["options"]] == ["arguments"]
    assert registered["help"]["options"] == []

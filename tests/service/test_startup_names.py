"""The start-up log names the bot and where people reach it, among its first lines (before the
store is even started): `lastword run` processes against the loopback fake Telegram and
Discord, with a real Redis server. Telegram's @username and t.me link come from the getMe the
token check makes; Discord's name, id and invite link (its application id) from its login; a
platform that was not reached at start is said to be unknown, not guessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import bot_env as discord_env
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running, run_env
from tests.support.telegram_runs import bot_env as telegram_env
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(60)

# The line that names the bot, and one the start logs after it (the store's durability).
INTRODUCTION = "lastword is "
STORE_STARTED = "durability "


async def introduced(env: dict[str, str]) -> str:
    """The line naming the bot that a `lastword run` with `env` logs, once its store has started
    too; fails if the store's line came first."""
    bot = await Running.start(env | {"LASTWORD_LOG_LEVEL": "INFO"})
    try:

        async def started() -> bool:
            return bot.said(STORE_STARTED) > 0

        await bot.until(eventually(started, within_s=30), "the store's line")
    finally:
        await bot.stop()
    first = next(i for i, line in enumerate(bot.log) if STORE_STARTED in line)
    named = [line for line in bot.log[:first] if INTRODUCTION in line]
    assert len(named) == 1, "".join(bot.log)
    return named[0]


async def test_telegram_names_the_bot_and_its_link(server: EmbeddedRedis, short_dir: Path) -> None:
    async with FakeTelegram(bot_username="lastword_test_bot") as fake:
        line = await introduced(telegram_env(server, fake, short_dir))
    assert "lastword is @lastword_test_bot on Telegram" in line
    assert "https://t.me/lastword_test_bot" in line


async def test_discord_names_the_bot_and_its_invite_link(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    async with FakeDiscord(bot_username="lastword-test") as fake:
        line = await introduced(discord_env(server, fake, short_dir))
        assert f"lastword is lastword-test (id {fake.bot_id}) on Discord" in line
        invite = f"https://discord.com/oauth2/authorize?client_id={fake.application_id}&"
        assert invite in line
        assert "scope=bot+applications.commands" in line


async def test_a_platform_not_reached_at_start_leaves_the_bot_unknown(
    server: EmbeddedRedis, short_dir: Path
) -> None:
    async with FakeTelegram() as fake:
        env = telegram_env(server, fake, short_dir)
    # Nothing answers there: the token check cannot say which bot this is.
    env["LASTWORD_TELEGRAM__API_URL"] = f"http://127.0.0.1:{free_port()}"
    line = await introduced(env)
    assert "lastword is on telegram; which bot is not known yet" in line
    assert "t.me" not in line


async def test_the_console_says_it_is_the_console(server: EmbeddedRedis, short_dir: Path) -> None:
    line = await introduced(run_env("console", server.url, short_dir))
    assert "lastword is the console: type in this terminal" in line

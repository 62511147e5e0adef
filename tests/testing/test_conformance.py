"""The adapter conformance suite (`bot.testing.conformance`) run against the built-in platforms,
each on its loopback fake (Telegram's Bot API, Discord's REST API and gateway) or a fake
terminal (the console), with the real runtime and store in this process."""

from __future__ import annotations

import pytest

from bot.testing.conformance import USER_TYPING, AdapterConformance, FakePlatform
from tests.support.fakes.platforms import ConsolePlatform, DiscordPlatform, TelegramPlatform

pytestmark = pytest.mark.timeout(60)


class TestTelegram(AdapterConformance):
    @pytest.fixture
    def platform(self) -> FakePlatform:
        return TelegramPlatform()


class TestDiscord(AdapterConformance):
    @pytest.fixture
    def platform(self) -> FakePlatform:
        return DiscordPlatform()


class TestConsole(AdapterConformance):
    @pytest.fixture
    def platform(self) -> FakePlatform:
        return ConsolePlatform()


def test_telegram_and_discord_run_every_check_their_platform_can() -> None:
    assert set(TelegramPlatform.not_applicable) == {USER_TYPING}
    assert not DiscordPlatform.not_applicable

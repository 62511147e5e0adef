"""Chat platforms. `create` picks one by the `LASTWORD_PLATFORM` setting."""

from __future__ import annotations

from adapters.base import Adapter
from bot.settings import ConfigError, Settings


def create(settings: Settings) -> Adapter:
    if settings.platform == "console":
        from adapters.console import ConsoleAdapter

        return ConsoleAdapter()
    if settings.platform == "telegram":
        from adapters.telegram import TelegramAdapter

        return TelegramAdapter(settings.telegram)
    if settings.platform == "discord":
        from adapters.discord import DiscordAdapter

        return DiscordAdapter(settings.discord)
    raise ConfigError(f"LASTWORD_PLATFORM: {settings.platform} is not available in this version")

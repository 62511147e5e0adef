"""Fixtures of the fakes' own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import discord
import discord.gateway
import discord.http
import pytest
import yarl

from tests.support.fakes.discord_server import (
    FakeDiscord,
)


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    """A running fake, with discord.py pointed at it exactly as the adapter does."""
    async with FakeDiscord() as server:
        monkeypatch.setattr(discord.http.Route, "BASE", server.api_url)
        monkeypatch.setattr(
            discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(server.gateway_url)
        )
        yield server

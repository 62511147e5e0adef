"""The core in one process: a burst in, one reply out."""

from __future__ import annotations

from redis.asyncio import Redis

from bot.app import make_store
from bot.llm import EchoLLM
from bot.message import InboundMessage
from bot.runtime import Runtime
from tests.conftest import SettingsFactory
from tests.fakes.outbound import RecordingOutbound


def message(n: int, chat: str = "1") -> InboundMessage:
    return InboundMessage("test", chat, "u1", f"m{n}", f"text {n}")


async def test_burst_gives_one_reply(redis: Redis, make_settings: SettingsFactory) -> None:
    settings = make_settings()
    outbound = RecordingOutbound()
    runtime = Runtime(settings, make_store(settings, redis), EchoLLM(), outbound)
    runtime.start()
    try:
        for n in (1, 2, 3):
            assert await runtime.ingest(message(n))
        await runtime.settled("test:1")
        assert outbound.texts() == ["You said: text 1 / text 2 / text 3"]
    finally:
        await runtime.stop()

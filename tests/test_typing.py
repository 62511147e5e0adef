"""The typing indicator: shown from the first message while a reply is owed, gone once sent."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from bot.app import make_store
from bot.llm import EchoLLM
from bot.message import InboundMessage
from bot.runtime import Runtime
from tests.conftest import SettingsFactory
from tests.fakes.outbound import RecordingOutbound


async def test_typing_runs_while_owed_and_stops_after_the_reply(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    settings = make_settings(debounce={"quiet_ms": 300, "max_wait_ms": 1000})
    outbound = RecordingOutbound(typing_interval_s=0.05)
    runtime = Runtime(settings, make_store(settings, redis), EchoLLM(delay_ms=200), outbound)
    runtime.start()
    try:
        assert await runtime.ingest(InboundMessage("test", "1", "u1", "m1", "hello"))
        await outbound.wait_for(1, timeout=5)
        typed_before_reply = len(outbound.typing_calls)
        # Debounce (300 ms) plus generation (200 ms) at one call per 50 ms.
        assert typed_before_reply >= 5
        assert set(outbound.typing_calls) == {"test:1"}
        await runtime.settled("test:1")
        after_reply = len(outbound.typing_calls)
        await asyncio.sleep(10 * outbound.typing_interval_s)  # time for any stray repeat
        assert len(outbound.typing_calls) == after_reply
    finally:
        await runtime.stop()

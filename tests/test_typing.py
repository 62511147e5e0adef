"""The typing indicator: shown from the first message while a reply is owed, gone once sent."""

from __future__ import annotations

import asyncio

from bot.llm import EchoLLM
from tests.builders import message
from tests.conftest import RuntimeFactory, settled
from tests.fakes.outbound import RecordingOutbound


async def test_typing_runs_while_owed_and_stops_after_the_reply(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime, outbound = await runtime_factory(
        debounce={"quiet_ms": 300, "max_wait_ms": 1000},
        model=EchoLLM(delay_ms=200),
        outbound=RecordingOutbound(typing_interval_s=0.05),
    )
    assert await runtime.ingest(message("hello"))
    await outbound.wait_for(1, timeout=5)
    typed_before_reply = len(outbound.typing_calls)
    # Debounce (300 ms) plus generation (200 ms) at one call per 50 ms.
    assert typed_before_reply >= 5
    assert set(outbound.typing_calls) == {"test:1"}
    await settled(runtime, "test:1")
    after_reply = len(outbound.typing_calls)
    await asyncio.sleep(10 * outbound.typing_interval_s)  # time for any stray repeat
    assert len(outbound.typing_calls) == after_reply

"""The typing indicator: shown from the first message while a reply is owed, gone once sent."""

from __future__ import annotations

import asyncio

from bot.llm.echo import EchoLLM
from bot.loop_lag import SHED_LAG_S, SHED_MIN_PREVIEWS, watch
from bot.outbound.typing_indicator import Typing
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.stalls import through_a_stall
from tests.support.waits import settled


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


class LagRecordingOutbound(RecordingOutbound):
    """Notes, with each typing call, how late the loop counted as running when it was made."""

    def __init__(self) -> None:
        super().__init__(typing_interval_s=0.05)
        self.lags_at_calls: list[float] = []

    async def typing(self, conversation: str) -> None:
        self.lags_at_calls.append(watch().recent_s)
        await super().typing(conversation)


async def typing_through_a_stall(conversations: int) -> LagRecordingOutbound:
    """Typing in `conversations` at once, the loop stalled for 0.3 s, until typing has gone
    on for a while after the stall has decayed from the lag."""
    outbound = LagRecordingOutbound()
    typing = Typing(outbound)

    for n in range(conversations):
        typing.show(f"test:{n}")
    try:
        await through_a_stall(lambda: len(outbound.typing_calls), conversations, "typing")
    finally:
        typing.stop()
    return outbound


async def test_typing_is_shed_while_the_loop_lags_with_many_conversations_typing() -> None:
    outbound = await typing_through_a_stall(SHED_MIN_PREVIEWS)
    # Checked and sent in one step: no call went out while the loop counted as lagging.
    assert max(outbound.lags_at_calls) <= SHED_LAG_S


async def test_a_few_conversations_keep_typing_through_a_stall() -> None:
    # A few indicators cannot be what lags the loop, and on a loaded machine the lag is the
    # machine's: they go on.
    outbound = await typing_through_a_stall(2)
    assert max(outbound.lags_at_calls) > SHED_LAG_S

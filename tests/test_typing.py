"""The typing indicator: shown from the first message while a reply is owed, gone once sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bot.llm.echo import EchoLLM
from bot.loop_lag import SHED_LAG_S, SHED_MIN_PREVIEWS, watch
from bot.outbound.typing_indicator import Typing
from tests.builders import message
from tests.conftest import RuntimeFactory, eventually, settled
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


class LagRecordingOutbound(RecordingOutbound):
    """Notes, with each typing call, how late the loop counted as running when it was made."""

    def __init__(self) -> None:
        super().__init__(typing_interval_s=0.05)
        self.lags_at_calls: list[float] = []

    async def typing(self, conversation: str) -> None:
        self.lags_at_calls.append(watch().recent_s)
        await super().typing(conversation)


def stall_the_loop(seconds: float) -> None:
    """Block the running loop, as a burst of CPU work on it would."""
    time.sleep(seconds)


async def through_a_stall(calls: Callable[[], int], conversations: int, what: str) -> None:
    """Wait for `what` (counted by `calls`) in every conversation, stall the loop for 0.3 s,
    wait for the stall to count as lag and then to decay, and for two more rounds of `what`."""

    async def made(count: int) -> bool:
        return calls() >= count

    async def lagging() -> bool:
        return watch().recent_s > SHED_LAG_S

    async def not_lagging() -> bool:
        return not await lagging()

    await eventually(lambda: made(conversations), 5, what=f"{what} in every conversation")
    stall_the_loop(0.3)
    await eventually(lagging, 5, what="the stall counted as lag")
    seen = calls()
    await eventually(not_lagging, 10, what="the lag decayed")
    await eventually(lambda: made(seen + 2 * conversations), 10, what=f"{what} again")


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

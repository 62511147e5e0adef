"""Stalling the event loop on purpose and waiting for the lag to show and decay."""

from __future__ import annotations

import time
from collections.abc import Callable

from bot.loop_lag import SHED_LAG_S, watch
from tests.support.waits import eventually


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

"""A replica answers at the window's deadline by its own timer, not by the sweep: the sweep
is the safety net for a replica that died, and runs seconds apart in production. With the
sweep a minute away, the reply must still come within the quiet time and a little more
(and whatever this process and the server waited for a core meanwhile: the machine's part,
`tests.support.core_waits`).
"""

from __future__ import annotations

import os
import time

from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.core_waits import waited_s
from tests.support.factories import RuntimeFactory

QUIET_MS = 150
# The time a cycle takes past the deadline here (acquire, the echo model, pre-send, send),
# with room for a busy test machine; a timer that never fires would take the sweep's minute.
SLACK_MS = 100


async def test_the_reply_comes_at_the_deadline_without_the_sweep(
    runtime_factory: RuntimeFactory, server: EmbeddedRedis
) -> None:
    runtime, outbound = await runtime_factory(
        sweep_interval_ms=60_000, debounce={"quiet_ms": QUIET_MS, "max_wait_ms": 5000}
    )
    assert server.process is not None
    pids = (os.getpid(), server.process.pid)

    def core_waits_ms() -> float:
        return sum(waited_s(pid) or 0.0 for pid in pids) * 1000

    assert await runtime.ingest(message(n=1))
    taken_in, machine_ms = time.monotonic(), core_waits_ms()
    await outbound.wait_for(1, timeout=5)
    waited_ms = (time.monotonic() - taken_in) * 1000
    machine_ms = core_waits_ms() - machine_ms
    assert waited_ms <= QUIET_MS + SLACK_MS + machine_ms, (
        f"the reply came {waited_ms:.0f} ms after, {machine_ms:.0f} ms of it waiting for a core"
    )

"""The core in one process: a burst in, one reply out."""

from __future__ import annotations

from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.waits import settled


async def test_burst_gives_one_reply(runtime_factory: RuntimeFactory) -> None:
    runtime, outbound = await runtime_factory()
    for n in (1, 2, 3):
        assert await runtime.ingest(message(n=n))
    await settled(runtime, "test:1")
    assert outbound.texts() == ["You said: text 1 / text 2 / text 3"]

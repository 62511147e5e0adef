"""A draining replica starts no cycle. While it hands its roles over, its gateway holder still
stores what it has queued (adapters/discord.py); if its timers then woke it, it would begin
a reply the stop would cut short. What it stored is another replica's to answer. Two
runtimes in process share a real server; the fake provider answers."""

from __future__ import annotations

import pytest

from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)


async def test_a_burst_taken_in_before_a_drain_is_answered_by_another_replica(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    leaving, left = await replica(runtime_factory, fake)
    _, stayed = await replica(runtime_factory, fake)  # the replica that stays
    assert await leaving.ingest(message("hello", n=1))
    await leaving.drain(0)
    # What its burst timer or a sweep would do, had they not stopped with the drain.
    leaving.wake(CONV)
    assert leaving.cycles_running == 0
    await stayed.wait_for(1)
    # The fake provider says back what it was given: the burst, answered once, by the other.
    assert stayed.texts(CONV) == ["You said: hello"]
    assert left.sent == []

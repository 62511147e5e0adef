"""A hand-back that meets an outage is made once the store answers again: a cycle cut short
by a Redis restart (its pre-send check finds no server) cannot give its lease back then, and
without a retry the conversation would wait out the lease's whole TTL (30 s here) after Redis
is back. A real server, stopped and started; a runtime in process; the fake provider."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.timeout(60), pytest.mark.fresh_server]

TTL_MS = 30_000


async def test_a_lease_not_given_back_in_an_outage_is_given_back_after_it(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, server: EmbeddedRedis, redis: Redis
) -> None:
    runtime, outbound = await replica(runtime_factory, fake, lease_ttl_ms=TTL_MS)
    fake.hold()
    assert await runtime.ingest(message("hello", n=1))
    await fake.wait_for_request(lambda r: True, timeout=10)
    await asyncio.to_thread(server.stop)
    fake.release()
    # The pre-send check finds no server; the cycle gives up and cannot hand the lease back.

    async def failed() -> bool:
        return runtime.stats.failed >= 1

    await eventually(failed, within_s=20)
    # From this thread: the server dies with the thread that started it.
    server.start()

    async def given_back() -> bool:
        return not await redis.exists(Keys(CONV).lease) and runtime.cycle.hand_backs.done >= 1

    # Far sooner than the lease's TTL: within the retries' longest delay, and some slack.
    await eventually(given_back, within_s=8)
    [reply] = await outbound.wait_for(1, timeout=15)
    await settled(runtime, CONV, version=1)
    assert reply.text is not None and "hello" in reply.text

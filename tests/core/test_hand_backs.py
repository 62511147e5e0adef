"""A hand-back that meets an outage is made once the store answers again: a cycle cut short
by a Redis restart (its pre-send check finds no server) cannot give its lease back then, and
without a retry the conversation would wait out the lease's whole TTL (30 s here) after Redis
is back. A real server, stopped and started; a runtime in process; the fake provider."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.core.hand_backs import HandBacks
from bot.store import Acquired, Failed, Keys, Store, StoreSettings, StoreUnavailable, lease_token
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

    async def given_back() -> tuple[float | None] | None:
        if await redis.exists(Keys(CONV).lease) or runtime.cycle.hand_backs.done < 1:
            return None
        retry_at = await redis.hget(Keys(CONV).state, "retry_at")
        return (float(retry_at) if retry_at is not None else None,)

    # Far sooner than the lease's TTL: within the retries' longest delay, and some slack.
    found = await eventually(given_back, within_s=8)
    assert found is not None
    (retry_at,) = found
    # The outage ended when the store answered: the next attempt is not backed off from then
    # (the acquire refuses until `retry_at`, so it cannot have cleared one yet).
    seconds, micros = await redis.time()
    assert retry_at is None or retry_at <= seconds * 1000 + micros / 1000, retry_at
    [reply] = await outbound.wait_for(1, timeout=15)
    await settled(runtime, CONV, version=1)
    assert reply.text is not None and "hello" in reply.text


async def test_a_failure_given_back_late_still_counts_and_an_outage_does_not(
    server: EmbeddedRedis, redis: Redis
) -> None:
    # Two leases whose hand-backs met the outage: one after a failed attempt (it counts
    # towards `llm.attempts`, and the next attempt is backed off), one after an outage (over
    # once the store answers: neither counted nor backed off).
    store = Store(redis, StoreSettings(0, 0, TTL_MS, 200, 3))
    hand_backs = HandBacks(store)
    failures: dict[str, Failed] = {"test:1": "failure", "test:2": "outage"}
    leases = {}
    for n, conversation in enumerate(failures, start=1):
        assert (await store.ingest(message("hi", n=n, conversation=conversation))).accepted
        grant = await store.acquire(conversation, lease_token("r"))
        assert isinstance(grant, Acquired), grant
        leases[conversation] = grant.lease
    await asyncio.to_thread(server.stop)
    for conversation, failed in failures.items():
        with pytest.raises(StoreUnavailable):
            await store.release(leases[conversation], failed=failed)
        hand_backs.later(leases[conversation], failed)
    server.start()

    async def given_back() -> bool:
        return hand_backs.done == 2

    await eventually(given_back, within_s=8)
    assert not await redis.exists(Keys("test:1").lease, Keys("test:2").lease)
    counted = [await redis.hmget(Keys(c).state, ["failures", "outages"]) for c in failures]
    assert counted == [[b"1", None], [None, None]]
    assert await redis.hget(Keys("test:1").state, "retry_at") is not None
    assert await redis.hget(Keys("test:2").state, "retry_at") is None
    await hand_backs.stop()

"""The watch for newer messages: a message this replica takes in cuts its stale generation at
once, without waiting for the next poll; one another replica takes in is still seen by the
poll; a watcher's callback is called the moment the move is known, once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.watch import VersionWatch
from bot.store import Store
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.replica_fleet import Cluster, covering_reply, tokens
from tests.support.replica_fleet import message as replica_message
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(60)

CONV = "test:1"
# Far longer than any test here: a generation cut before it passed was cut by something else.
SLOW_S = 30.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=covering_reply) as server:
        # The first request is slow, so that it is still streaming when the next message
        # comes; the one after it answers at once.
        server.delay_for = lambda request: SLOW_S if request is server.requests[0] else 0.1
        yield server


async def test_a_message_taken_in_here_cuts_the_generation_without_waiting_for_a_poll(
    fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "model": "m"}
    runtime, outbound = await runtime_factory(llm=llm)
    # A poll that never comes within the test: only the signal from ingest can cut it.
    runtime.cycle.watch = VersionWatch(runtime.store, poll_s=3600.0)
    assert await runtime.ingest(message("about c1m1", n=1))
    first = await fake.wait_for_request()

    said_at = time.monotonic()
    assert await runtime.ingest(message("about c1m2", n=2))
    await fake.wait_for_request(lambda r: r is first and r.cancelled, timeout=5)
    assert time.monotonic() - said_at < SLOW_S / 10
    await settled(runtime, CONV, version=2)

    assert outbound.texts() == ["covers c1m1 c1m2"]
    assert runtime.stats.interrupted == 1 and not first.finished


async def test_a_message_another_replica_took_in_is_seen_by_the_poll(
    server: EmbeddedRedis, fake: FakeOpenAI, short_dir: Path
) -> None:
    async with Cluster(server, fake, short_dir, size=2) as cluster:
        assert await cluster.deliver("r0", replica_message(0, 1))
        first = await fake.wait_for_request(timeout=10)
        # The replica generating is named by its API key; the newer message goes to the other.
        other = next(name for name in cluster.names if name != first.api_key)
        assert await cluster.deliver(other, replica_message(0, 2))
        await fake.wait_for_request(lambda r: r is first and r.cancelled, timeout=SLOW_S / 3)
        await cluster.wait_for(
            lambda: bool(cluster.sent("pipe:0")), timeout=10, what="the reply to both"
        )
        assert [tokens(e["text"]) for e in cluster.sent("pipe:0")] == [["c0m1", "c0m2"]]
        assert int(cluster.stats(first.api_key).get("interrupted", 0)) == 1


async def test_the_callback_is_called_once_when_this_replica_takes_a_message_in(
    store: Store,
) -> None:
    watch = VersionWatch(store, poll_s=3600.0)
    seen: list[bool] = []
    moved = watch.watch(CONV, 1, 1, on_moved=lambda: seen.append(moved.is_set()))
    watch.moved(CONV, 1)
    assert seen == [] and not moved.is_set()
    watch.moved(CONV, 2)
    watch.moved(CONV, 3)
    # Synchronously, with the event already set, and once.
    assert seen == [True]
    await watch.stop()


async def test_the_poll_calls_back_too(store: Store) -> None:
    watch = VersionWatch(store, poll_s=0.01)
    seen: list[bool] = []
    moved = watch.watch(CONV, 0, 1, on_moved=lambda: seen.append(moved.is_set()))
    # Taken in without telling the watch, as another replica would.
    assert (await store.ingest(message(n=1), "allowed")).accepted
    async with asyncio.timeout(5):
        await moved.wait()
    assert seen == [True]
    await watch.stop()


async def test_a_failing_callback_still_sets_the_event(store: Store) -> None:
    watch = VersionWatch(store, poll_s=3600.0)

    def fails() -> None:
        raise RuntimeError("broken")

    moved = watch.watch(CONV, 1, 1, on_moved=fails)
    watch.moved(CONV, 2)
    assert moved.is_set()
    await watch.stop()

"""The incident reports' scenarios (SPEC, `seeds/`), each replayed against the in-process core.

A `Runtime` runs with the real store on a real server, the platform is a `RecordingOutbound`,
and the model is either the offline echo or the real `openai` client talking to the loopback
`FakeOpenAI`, which can hold a generation in flight so a test can act in the middle of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.config.settings import Settings
from bot.core.runtime import Runtime
from bot.service.app import make_store
from bot.store import Keys, NotAcquired, Store
from tests.support.builders import message
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.waits import eventually, server_ms, settled

pytestmark = pytest.mark.timeout(30)

CONV = "test:1"
# Generous bound for a runtime to answer everything it owes; a pass takes well under a second.
SETTLE_S = 5.0


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def hash_of(redis: Redis, key: str) -> dict[str, str]:
    raw = await redis.hgetall(key)
    return {text(k): text(v) for k, v in raw.items()}


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def openai_settings(make_settings: SettingsFactory, fake: FakeOpenAI, **overrides: Any) -> Settings:
    llm = {
        "provider": "openai",
        "base_url": fake.base_url,
        "api_key": "test-key",
        "model": FAKE_MODEL_ID,
        "timeout_s": 10,
        "retries": 0,
        # The seeds' own guard is the pre-send check, so these tests pin it down on its own;
        # interrupting a generation early is tested in test_generation.py.
        "interrupt": False,
    }
    return make_settings(llm=llm, **overrides)


async def settle(runtime: Runtime) -> None:
    await settled(runtime, CONV, within_s=SETTLE_S)


async def test_two_quick_messages_give_one_reply(
    redis: Redis, make_settings: SettingsFactory, fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    runtime, outbound = await runtime_factory(openai_settings(make_settings, fake))
    assert await runtime.ingest(message(n=1))
    assert await runtime.ingest(message(n=2))
    await settle(runtime)

    [request] = fake.requests  # one generation for the burst
    prompt = request.last_user_text
    assert 0 <= prompt.index("text 1") < prompt.index("text 2")
    assert outbound.texts() == ["You said: " + prompt]
    assert runtime.stats.replies == 1
    assert runtime.stats.discarded == 0
    history = await runtime.store.history(CONV)
    assert [(h.role, h.version) for h in history] == [
        ("user", 1),
        ("user", 2),
        ("assistant", 2),
    ]
    assert await redis.zscore(Keys(CONV).due, CONV) is None


async def test_third_message_during_generation_discards_the_draft(
    redis: Redis, make_settings: SettingsFactory, fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    runtime, outbound = await runtime_factory(openai_settings(make_settings, fake))
    fake.hold()
    assert await runtime.ingest(message(n=1))
    assert await runtime.ingest(message(n=2))
    first = await fake.wait_for_request()
    assert "text 1" in first.last_user_text and "text 2" in first.last_user_text
    assert "text 3" not in first.last_user_text

    # The user types again while the model is still working on the first two.
    assert await runtime.ingest(message(n=3))
    fake.release()
    await settle(runtime)

    final = fake.requests[-1]
    prompt = final.last_user_text
    assert 0 <= prompt.index("text 1") < prompt.index("text 2") < prompt.index("text 3")
    assert outbound.texts() == ["You said: " + prompt]  # one reply covers all three
    assert "You said: " + first.last_user_text not in outbound.texts()
    assert len(fake.requests) == 2
    assert runtime.stats.discarded == 1
    assert runtime.stats.replies == 1
    assert await runtime.store.counters(CONV) == (3, 3)


async def test_commit_never_clobbers_the_window_of_a_newer_message(
    redis: Redis, make_settings: SettingsFactory, fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    # starvation_limit=0 lets the first reply go out although a message arrived during its
    # generation, so its commit runs while the newer message's window is open. The window
    # is long enough to look at it between that commit and the next cycle.
    quiet = 600
    settings = openai_settings(
        make_settings, fake, debounce={"quiet_ms": quiet, "max_wait_ms": 3000}, starvation_limit=0
    )
    k = Keys(CONV)
    runtime, outbound = await runtime_factory(settings)
    fake.hold()
    assert await runtime.ingest(message(n=1))
    first = await fake.wait_for_request()
    assert first.last_user_text == "text 1"

    assert await runtime.ingest(message(n=2))  # opens a new window: the first was consumed
    window = await hash_of(redis, k.window)
    deadline = int(window["deadline"])
    assert deadline == int(window["opened"]) + quiet

    fake.release()
    await outbound.wait_for(1)

    async def committed() -> bool:
        return await runtime.store.counters(CONV) == (2, 1)

    await eventually(committed)
    assert await server_ms(redis) < deadline, "too slow to look before the next cycle"
    # The commit wrote state and history, and left the window and its wake-up alone.
    assert await hash_of(redis, k.window) == window
    assert await redis.zscore(k.due, CONV) == deadline
    assert sorted(text(v) for v in await redis.hkeys(k.pending)) == ["2"]
    assert outbound.texts() == ["You said: text 1"]

    await settle(runtime)
    assert outbound.texts() == ["You said: text 1", "You said: text 2"]
    assert [r.last_user_text for r in fake.requests] == ["text 1", "text 2"]
    assert runtime.stats.forced == 1
    assert runtime.stats.replies == 2
    # The second cycle waited for the new window's deadline, on the server's clock.
    assert all(late >= 0 for late in runtime.stats.lateness_ms)


async def test_stale_wakeup_after_everything_was_answered_is_a_noop(
    redis: Redis, make_settings: SettingsFactory, runtime_factory: RuntimeFactory
) -> None:
    k = Keys(CONV)
    runtime, outbound = await runtime_factory(make_settings())
    assert await runtime.ingest(message(n=1))
    assert await runtime.ingest(message(n=2))
    await settle(runtime)
    assert outbound.texts() == ["You said: text 1 / text 2"]
    state = await hash_of(redis, k.state)
    history = await redis.lrange(k.history, 0, -1)

    # A late local timer, then a leftover entry in the durable due-index for the sweep.
    runtime.wake(CONV)
    await settle(runtime)
    await redis.zadd(k.due, {CONV: await server_ms(redis)})

    async def swept() -> bool:
        return await redis.zscore(k.due, CONV) is None

    await eventually(swept)
    await settle(runtime)

    assert outbound.texts() == ["You said: text 1 / text 2"]
    assert runtime.stats.cycles == 1
    assert await hash_of(redis, k.state) == state
    assert await redis.lrange(k.history, 0, -1) == history
    assert not await redis.exists(k.lease)
    assert await runtime.store.acquire(CONV, "stale") == NotAcquired("idle")


async def test_late_release_from_a_timed_out_holder_keeps_the_new_lease(
    redis: Redis, make_settings: SettingsFactory, fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    k = Keys(CONV)
    settings = openai_settings(make_settings, fake, debounce={"quiet_ms": 0, "max_wait_ms": 0})
    # Holder A: another replica that takes the lease and then stalls past its short TTL.
    stalled_settings = make_settings(
        debounce={"quiet_ms": 0, "max_wait_ms": 0}, lease={"ttl_ms": 300}
    )
    stalled: Store = make_store(stalled_settings, redis)
    await stalled.ingest(message(n=1))
    a = await stalled.acquire(CONV, "holder-a")
    assert a.status == "acquired"

    fake.hold()
    runtime, outbound = await runtime_factory(settings)
    # This replica's sweep finds the conversation once A's lease has run out.
    await fake.wait_for_request()
    held = await hash_of(redis, k.lease)
    assert held["token"] != "holder-a"
    assert int(held["fence"]) == a.lease.fence + 1

    # A comes back and cleans up: its release must not free the new holder's lease.
    assert not (await stalled.release(a.lease)).ok
    assert not (await stalled.commit(a.lease)).ok
    assert await hash_of(redis, k.lease) == held
    assert await redis.pttl(k.lease) > 0
    assert (await stalled.acquire(CONV, "holder-c")).status == "busy"

    fake.release()
    await settle(runtime)
    assert outbound.texts() == ["You said: text 1"]
    assert runtime.stats.replies == 1
    assert runtime.stats.lost == 0
    assert len(fake.requests) == 1


async def test_a_user_who_never_stops_typing_is_answered_by_the_hard_cap(
    redis: Redis, make_settings: SettingsFactory, fake: FakeOpenAI, runtime_factory: RuntimeFactory
) -> None:
    # I7: messages every 50 ms keep pushing the quiet deadline out, but generation must
    # start within max_wait of the first message (plus scheduling slack), not after the
    # typing stops.
    max_wait_s, slack_s = 0.6, 0.25
    settings = openai_settings(
        make_settings, fake, debounce={"quiet_ms": 200, "max_wait_ms": int(max_wait_s * 1000)}
    )
    runtime, _ = await runtime_factory(settings)
    loop = asyncio.get_running_loop()
    first_at = loop.time()
    typing_until = first_at + 3 * max_wait_s
    n = 0
    while loop.time() < typing_until:
        n += 1
        assert await runtime.ingest(message(n=n))
        await asyncio.sleep(0.05)
    await settle(runtime)
    first_request = fake.requests[0]
    # FakeOpenAI stamps requests with time.monotonic(), the clock the event loop uses.
    assert first_request.started_at - first_at <= max_wait_s + slack_s
    assert first_request.started_at < typing_until - max_wait_s
    assert "text 1" in first_request.last_user_text

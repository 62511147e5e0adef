"""/forget across replicas: two runtimes on one real server. The first /forget only asks; the
same command again within a minute, on whichever replica, erases the history, the cached
transcripts and documents, the model and the persona picked, while the usage totals and the
dedupe ids stay."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.commands.forget import CONFIRM, FORGOTTEN
from bot.prompt import PERSONA_INTRO
from bot.runtime import Runtime
from bot.store import Keys
from bot.store.personal import FORGET_CONFIRM_MS
from tests.builders import message
from tests.conftest import RuntimeFactory, settled
from tests.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.fakes.outbound import RecordingOutbound

CONV = "test:1"
MODELS = [{"name": "smart", "model": "smart-model-2"}]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def replica(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> tuple[Runtime, RecordingOutbound]:
    llm: dict[str, Any] = {"provider": "openai", "base_url": fake.base_url, "api_key": "k"}
    llm |= {"model": FAKE_MODEL_ID, "retries": 0, "models": MODELS}
    return await runtime_factory(llm=llm)


async def say(runtime: Runtime, n: int, *texts: str) -> None:
    """Send a burst, numbered from `n`, and wait for its reply."""
    for i, text in enumerate(texts):
        assert await runtime.ingest(message(text, n=n + i))
    await settled(runtime, CONV)


async def test_forget_asks_then_erases_on_another_replica_and_keeps_counters(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    a, a_out = await replica(runtime_factory, fake)
    b, b_out = await replica(runtime_factory, fake)
    keys = Keys(CONV)
    await say(a, 1, "remember the word apple")
    await say(a, 2, "/model smart", "/persona Answer like a pirate.")
    await a.store.keep_transcript(CONV, "voice-1", "a voice note's words")
    await a.store.keep_transcript(CONV, "doc:file-2", "a document's words")
    history = await a.store.history(CONV)
    usage = await redis.hgetall(keys.usage)
    assert len(history) == 5 and usage

    await say(b, 4, "/forget")
    assert b_out.texts() == [CONFIRM]
    # Only asked: nothing is erased yet.
    assert len(await b.store.history(CONV)) == 7
    assert await redis.hget(keys.state, "persona") == b"Answer like a pirate."

    await say(a, 5, "/forget")
    assert a_out.texts()[-1] == FORGOTTEN
    assert [(h.role, h.text) for h in await a.store.history(CONV)] == [("assistant", FORGOTTEN)]
    assert await redis.hmget(keys.state, ["model", "persona", "forget_asked"]) == [None] * 3
    assert await a.store.transcripts(CONV, ["voice-1", "doc:file-2"]) == [None, None]
    # Counters without content stay: usage totals, and the ids that make a redelivery a
    # duplicate.
    assert await redis.hgetall(keys.usage) == usage
    assert not await b.ingest(message("remember the word apple", n=1))
    assert await a.store.counters(CONV) == (5, 5)

    await say(b, 6, "what was the word?")
    last = fake.requests[-1]
    assert last.model == FAKE_MODEL_ID  # the default again
    assert PERSONA_INTRO not in last.messages[0]["content"]
    assert "apple" not in str(last.messages)


async def test_forget_confirmed_in_the_same_burst_and_not_after_a_minute(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    a, out = await replica(runtime_factory, fake)
    keys = Keys(CONV)
    await say(a, 1, "/persona Be brief.", "hello")
    await say(a, 3, "/forget")
    assert out.texts()[-1] == CONFIRM
    # Asked longer ago than a confirmation is awaited (the server's clock): it asks again.
    seconds, micros = await redis.time()
    asked = seconds * 1000 + micros // 1000 - FORGET_CONFIRM_MS - 1000
    await redis.hset(keys.state, "forget_asked", asked)
    await say(a, 4, "/forget")
    assert out.texts()[-1] == CONFIRM
    assert await redis.hget(keys.state, "persona") == b"Be brief."

    await redis.hdel(keys.state, "forget_asked")
    await say(a, 5, "/forget", "/forget", "start over")
    assert out.texts()[-1] == f"{CONFIRM}\n\n{FORGOTTEN}\n\nYou said: start over"
    assert await redis.hget(keys.state, "persona") is None
    # What came after the confirmation is kept, and nothing from before it.
    history = await a.store.history(CONV)
    assert [(h.role, h.version) for h in history] == [("user", 7), ("assistant", 7)]

"""/forget across replicas: two runtimes on one real server. The first /forget only asks; the
same command again within a minute, on whichever replica, erases the history, the cached
transcripts and documents (those the conversation's index names), the model and the persona
picked, while the usage totals and the dedupe ids stay. On a real cluster, the erasure and
the persona work on conversations of every primary, and one /forget reaches a person's places
on all of them. (A person's places across DMs, groups and topics: tests/core/test_person.py.)"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from bot.commands.forget import CONFIRM, FORGOTTEN
from bot.llm.prompt import PERSONA_INTRO
from bot.service.app import make_store
from bot.store import FORGET_CONFIRM_MS, Keys
from bot.store.connect import open_client
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica, say
from tests.support.clusters import Cluster, cluster, conversations_on_each_primary
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.scripts import acquire_when_ready

__all__ = ["cluster", "fake"]  # the fixtures, imported for pytest

MODELS = [{"name": "smart", "model": "smart-model-2"}]

pytestmark = pytest.mark.timeout(60)


async def test_forget_asks_then_erases_on_another_replica_and_keeps_counters(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    a, chat = await replica(runtime_factory, fake, models=MODELS)
    b, _ = await replica(runtime_factory, fake, chat, models=MODELS)
    keys = Keys(CONV)
    await say(a, 1, "remember the word apple")
    await say(a, 2, "/model smart", "/persona Answer like a pirate.")
    await a.store.keep_transcript(CONV, "voice-1", "a voice note's words")
    await a.store.keep_transcript(CONV, "doc:file-2", "a document's words")
    history = await a.store.history(CONV)
    usage = await redis.hgetall(keys.usage)
    assert len(history) == 5 and usage
    assert sorted(await redis.zrange(keys.heard, 0, -1)) == [b"doc:file-2", b"voice-1"]

    await say(b, 4, "/forget")
    assert chat.texts()[-1] == CONFIRM
    # Only asked: nothing is erased yet.
    assert len(await b.store.history(CONV)) == 7
    assert await redis.hget(keys.state, "persona") == b"Answer like a pirate."

    await say(a, 5, "/forget")
    assert chat.texts()[-1] == FORGOTTEN
    assert [(h.role, h.text) for h in await a.store.history(CONV)] == [("assistant", FORGOTTEN)]
    assert await redis.hmget(keys.state, ["model", "persona", "forget_asked"]) == [None] * 3
    assert await a.store.transcripts(CONV, ["voice-1", "doc:file-2"]) == [None, None]
    assert not await redis.exists(keys.heard)
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
    a, out = await replica(runtime_factory, fake, models=MODELS)
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


async def test_forget_and_persona_on_conversations_of_every_primary_of_a_cluster(
    cluster: Cluster, make_settings: SettingsFactory
) -> None:
    files = ["voice-1", "doc:file-2"]
    settings = make_settings(redis_url=cluster.url, debounce={"quiet_ms": 0, "max_wait_ms": 0})
    store = make_store(settings, await open_client(cluster.url))
    # One person (the builder's user) with a DM channel on each primary: a /forget in one of
    # them reaches every one, each in its own slot, through the person's index in theirs.
    conversations = conversations_on_each_primary(1, prefix="test:forget-")
    try:
        for conversation in conversations:
            assert (await store.ingest(message(n=1, conversation=conversation))).accepted
            await store.keep_persona(conversation, "Be brief.")
            for file_key in files:
                await store.keep_transcript(conversation, file_key, "words")
            grant = await acquire_when_ready(store, conversation, "before")
            assert grant.persona == "Be brief."
            assert (await store.release(grant.lease)).ok
            await store.ask_forget(conversation)
            assert await store.forget_asked(conversation)

        # The cached entries are found through each place's index, in its slot.
        assert await store.forget(conversations[0], "u1") == len(conversations)
        for conversation in conversations:
            assert await store.transcripts(conversation, files) == [None, None]
            assert not await store.forget_asked(conversation)
            assert (await acquire_when_ready(store, conversation, "after")).persona == ""
    finally:
        await store.close()

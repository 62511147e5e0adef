"""A group that moved to a new chat (a Telegram group upgraded to a supergroup): each person's
conversation in the old chat is adopted by theirs in the new one (history, persona, model), so
they go on where they were; never over what they already have there, and never twice. Over a
real server, with the Runtime and the fake model (as tests/core/test_person.py); the SCAN that
finds the old chat's conversations also on a real Redis Cluster, where it walks one node."""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.commands.forget import CONFIRM, forgotten
from bot.core.runtime import Runtime
from bot.message import InboundMessage, Place
from bot.service.app import make_store
from bot.store import Keys
from bot.store.connect import open_client
from bot.store.keys import PersonKeys
from bot.store.replies import as_text
from tests.support.chatting import fake
from tests.support.clusters import Cluster, cluster, primary_of
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.waits import eventually, settled

__all__ = ["cluster", "fake"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.timeout(60)

ANN, BOB, CAROL, DAVE = "1", "2", "3", "4"
# The old group and the supergroup it became: in different shards, as two chats mostly are.
OLD, NEW = "-100", "-1001"
TOPIC = "7"

_ids = iter(range(1, 1_000_000))


def place(who: str, chat: str, topic: str = "") -> Place:
    return Place("test", chat, who, topic, group=True)


def at(where: Place, text: str) -> InboundMessage:
    """A new message said to the bot at `where` (a mention)."""
    return InboundMessage.at(
        where,
        f"m{next(_ids)}",
        text,
        display_name=where.sender,
        timestamp=time.time(),
        mentioned=True,
    )


async def replica(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, allowed: list[str]
) -> tuple[Runtime, RecordingOutbound]:
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k"}
    return await runtime_factory(
        llm=llm | {"model": FAKE_MODEL_ID, "retries": 0},
        groups={"allowed": allowed},
        access={"rate_per_minute": 0},
    )


async def answered(bot: Runtime, where: Place, text: str) -> None:
    """Say `text` to the bot at `where` and wait for the reply."""
    assert await bot.ingest(at(where, text))
    await settled(bot, where.conversation)


async def kept(redis: Redis, where: Place) -> dict[str, Any]:
    """What the store keeps of the conversation at `where`: V, W, persona, model, history
    and the record of tool calls."""
    keys = Keys(where.conversation)
    v, w, persona, model = await redis.hmget(keys.state, "v", "w", "persona", "model")
    history = [as_text(entry) for entry in await redis.lrange(keys.history, 0, -1)]
    tools = await redis.hgetall(keys.tools)
    return {"v": v, "w": w, "persona": persona, "model": model, "history": history, "tools": tools}


async def moved(bot: Runtime, redis: Redis, *people: Place) -> None:
    """Report the move, and wait until each of `people` (in the new chat) has a state: the
    adoption runs in the background past a short wait, which a loaded machine may outlast."""
    await bot.group_moved("test", OLD, NEW)

    async def adopted() -> bool:
        return all([await redis.exists(Keys(p.conversation).state) for p in people])

    await eventually(adopted, 10, what="the moved conversations adopted")


async def test_a_moved_groups_people_find_their_conversations_in_the_new_chat(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    assert Keys(place(ANN, OLD).conversation).shard != Keys(place(ANN, NEW).conversation).shard
    bot, chat = await replica(runtime_factory, fake, [OLD])
    ann, bob = place(ANN, OLD), place(BOB, OLD, TOPIC)
    await answered(bot, ann, "my name is Ann")
    await answered(bot, ann, "/persona@bot Talk like a pirate.")
    await answered(bot, bob, "my name is Bob")
    await bot.store.pick_model(bob.conversation, "smart")
    # A turn's record of tool calls (its id names the calls' idempotency keys): a /retry of
    # that reply in the new chat reuses its calls, never runs them again.
    record = {b"id:1": b"c0ffee", b"steps:1": b"1", b"s:1:1": '[{"name":"é"}]'.encode()}
    await redis.hset(Keys(bob.conversation).tools, mapping=record)  # type: ignore[arg-type]
    ann_before, bob_before = await kept(redis, ann), await kept(redis, bob)
    assert len(ann_before["history"]) == 4 and ann_before["persona"] == b"Talk like a pirate."

    ann_new, bob_new = place(ANN, NEW), place(BOB, NEW, TOPIC)
    await moved(bot, redis, ann_new, bob_new)
    for before, now in ((ann_before, ann_new), (bob_before, bob_new)):
        after = await kept(redis, now)
        # V and W where the old conversation's answers end: the new chat's versions follow.
        assert after == before | {"v": before["w"]}
        assert await redis.pttl(Keys(now.conversation).history) > 0
        assert await redis.pttl(Keys(now.conversation).state) > 0
    assert (await kept(redis, bob_new))["tools"] == record
    assert await redis.pttl(Keys(bob_new.conversation).tools) > 0
    # The old conversations stay as they were.
    assert await kept(redis, ann) == ann_before

    # Ann goes on in the supergroup: the model sees what she said in the old group, and her
    # persona; her new exchange follows the old ones.
    await answered(bot, ann_new, "what is my name?")
    request = fake.requests[-1]
    assert "Talk like a pirate." in request.messages[0]["content"]
    assert any("my name is Ann" in str(m["content"]) for m in request.messages[1:])
    history = await bot.store.history(ann_new.conversation)
    assert [entry.version for entry in history] == [1, 1, 2, 2, 3, 3]
    assert chat.texts(ann_new.conversation)


async def test_a_person_who_already_spoke_in_the_new_chat_keeps_their_conversation(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await replica(runtime_factory, fake, [OLD, NEW])
    for who in (ANN, BOB, CAROL, DAVE):
        await answered(bot, place(who, OLD), f"I am {who} in the old group")
        await answered(bot, place(who, OLD), "/persona@bot Be brief.")
    # Ann spoke in the new chat already; Bob's message there is taken in, not yet answered.
    await answered(bot, place(ANN, NEW), "fresh start")
    ann_there = await kept(redis, place(ANN, NEW))
    bob_there = Keys(place(BOB, NEW).conversation)
    await redis.hset(bob_there.state, "v", 1)
    # Carol's history there outlived its state (an expiry between the two): left as it is too.
    carol_there = Keys(place(CAROL, NEW).conversation)
    await redis.rpush(carol_there.history, "kept")

    await moved(bot, redis, place(DAVE, NEW))
    assert await kept(redis, place(ANN, NEW)) == ann_there
    assert await redis.hgetall(bob_there.state) == {b"v": b"1"}
    assert not await redis.exists(bob_there.history)
    assert not await redis.exists(carol_there.state)
    assert await redis.lrange(carol_there.history, 0, -1) == [b"kept"]
    # Dave, who had nothing there, is carried over.
    assert (await kept(redis, place(DAVE, NEW)))["persona"] == b"Be brief."


async def test_a_move_carried_twice_changes_nothing(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await replica(runtime_factory, fake, [OLD])
    ann, ann_new = place(ANN, OLD), place(ANN, NEW)
    await answered(bot, ann, "hello")
    await moved(bot, redis, ann_new)
    once = await kept(redis, ann_new)
    # Again at once (a second replica, or the service message in the other chat), and after
    # Ann spoke in the new chat: the store's step itself, past this replica's memory of moves.
    again = await bot.store.adopt_group("test", OLD, NEW)
    assert (again.found, again.adopted) == (1, 0)
    assert await kept(redis, ann_new) == once
    await answered(bot, ann_new, "and here")
    after_reply = await kept(redis, ann_new)
    assert len(after_reply["history"]) == 4
    await bot.group_moved("test", OLD, NEW)
    assert (await bot.store.adopt_group("test", OLD, NEW)).adopted == 0
    assert await kept(redis, ann_new) == after_reply


async def test_forget_in_the_new_chat_erases_the_adopted_and_the_old_conversation(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await replica(runtime_factory, fake, [OLD])
    ann, ann_new = place(ANN, OLD), place(ANN, NEW)
    await answered(bot, ann, "my secret is 42")
    await answered(bot, ann, "/persona@bot Talk like a pirate.")
    await answered(bot, place(BOB, OLD), "my secret is 7")
    await moved(bot, redis, ann_new, place(BOB, NEW))
    # The adopted place is in Ann's index, beside the old one: a /forget said anywhere
    # (her DM, another group) finds it.
    index = await redis.zrange(PersonKeys("test", ANN).places, 0, -1)
    assert sorted(index) == sorted([ann.conversation.encode(), ann_new.conversation.encode()])

    await answered(bot, ann_new, "/forget@bot")
    assert chat.texts(ann_new.conversation) == [CONFIRM]
    await answered(bot, ann_new, "/forget@bot")
    assert chat.texts(ann_new.conversation)[-1] == forgotten(2)
    for where in (ann, ann_new):
        after = await kept(redis, where)
        assert after["persona"] is None
        assert not any("42" in entry for entry in after["history"]), after["history"]
    assert await redis.zrange(PersonKeys("test", ANN).places, 0, -1) == []
    # Bob's, old and adopted, are untouched.
    for where in (place(BOB, OLD), place(BOB, NEW)):
        assert len((await kept(redis, where))["history"]) == 2


async def test_the_moves_bounds_what_it_takes_for_a_conversation_and_an_anonymous_admin(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await replica(runtime_factory, fake, [OLD])
    for who in (ANN, BOB):
        await answered(bot, place(who, OLD), "hello")
    # A cached document's text whose file key ends as a state key does: not a conversation.
    await redis.set(Keys(place(ANN, OLD).conversation).transcript("doc:x:state"), "words")
    capped = await bot.store.adopt_group("test", OLD, NEW, cap=1)
    assert (capped.found, capped.adopted, capped.capped) == (1, 1, True)
    whole = await bot.store.adopt_group("test", OLD, NEW)
    assert (whole.found, whole.adopted, whole.capped) == (2, 1, False)
    # An anonymous admin speaks as the group itself: in the supergroup, as the supergroup.
    await answered(bot, place(OLD, OLD), "hello from the admins")
    await bot.store.adopt_group("test", OLD, NEW)
    assert len((await kept(redis, place(NEW, NEW)))["history"]) == 2
    assert not await redis.exists(Keys(place(OLD, NEW).conversation).state)


async def test_a_move_finds_the_old_chats_conversations_on_a_cluster(
    cluster: Cluster, make_settings: SettingsFactory
) -> None:
    old, new = (
        "-100",
        next(
            chat
            for chat in (f"-100{n}" for n in range(100))
            if primary_of(f"test:{chat}") != primary_of("test:-100")
        ),
    )
    settings = make_settings(redis_url=cluster.url)
    client = await open_client(cluster.url)
    store = make_store(settings, client)
    try:
        for who in (ANN, BOB):
            keys = Keys(place(who, old, TOPIC).conversation)
            await client.hset(keys.state, mapping={"v": 2, "w": 2, "persona": f"I am {who}"})
            await client.rpush(keys.history, '{"role":"user"}', '{"role":"assistant"}')
        adopted = await store.adopt_group("test", old, new)
        assert (adopted.found, adopted.adopted) == (2, 2)
        for who in (ANN, BOB):
            keys = Keys(place(who, new, TOPIC).conversation)
            assert await client.hget(keys.state, "persona") == f"I am {who}".encode()
            assert await client.llen(keys.history) == 2
    finally:
        await store.close()


async def test_a_failed_adoption_costs_the_move_nothing_and_is_tried_again(
    runtime_factory: RuntimeFactory,
    fake: FakeOpenAI,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bot, _ = await replica(runtime_factory, fake, [OLD])
    await answered(bot, place(ANN, OLD), "hello")
    # Bob's old conversation cannot be read (a key of the wrong type): the adoption fails.
    broken = Keys(place(BOB, OLD).conversation)
    await redis.hset(broken.state, "v", 1)
    await redis.set(broken.history, "not a list")
    await bot.group_moved("test", OLD, NEW)
    assert await redis.hget(Keys(place(ANN, NEW).conversation).group, "allowed") == b"1"

    async def failed() -> bool:
        return "carrying the conversations of group test:-100 to -1001 failed" in caplog.text

    await eventually(failed, 10, what="the adoption's failure logged")
    assert not await redis.exists(Keys(place(ANN, NEW).conversation).state)
    # Reported again (the next send to the old chat), it is tried again, and gets through.
    await redis.delete(broken.history)
    await moved(bot, redis, place(ANN, NEW))

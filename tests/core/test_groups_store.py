"""Groups in the core, over a real server: which group messages enter a person's burst, which
are said to the room, and what the model and the platform are given. Each person in a group
is a conversation of their own; the end-to-end tests (`test_groups_telegram`,
`test_groups_discord`) drive the same through `lastword run` and the platforms' fakes."""

from __future__ import annotations

import json
from dataclasses import fields, replace

import pytest
from redis.asyncio import Redis

from bot.commands import admins_only
from bot.core.admission import ALLOWED, DENIED, addressed
from bot.llm.others import entry
from bot.message import InboundMessage, Place, Quote
from bot.store import Keys
from tests.support.chatting import fake
from tests.support.counted_tools import Counted
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.groups import ADMIN, ANN, BOB, GROUP, conv, group_replica, said
from tests.support.waits import settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)


def test_a_group_conversation_is_one_person_in_one_chat_and_shares_its_shard() -> None:
    ann, bob = conv(ANN), conv(BOB)
    assert ann == "test:-100||1" and Place.of(ann) == Place("test", GROUP, ANN, "", True)
    assert Place.of("test:42") == Place("test", "42", "")
    assert Place.of(conv(ANN, topic="7")).topic == "7"
    # One shard for the group's people and its own keys: one script decides for them all.
    assert Keys(ann).shard == Keys(bob).shard == Keys("test:-100").shard
    assert Keys(ann).room == Keys(bob).room != Keys(conv(ANN, topic="7")).room
    assert Keys(ann).group == Keys(conv(ANN, topic="7")).group


def test_a_dms_stored_message_is_what_the_version_before_groups_reads() -> None:
    dm = InboundMessage.at(Place("test", "42", "42"), "m1", "hi")
    assert set(json.loads(dm.to_json())) == {f.name for f in fields(InboundMessage)} - {
        "topic",
        "mentioned",
        "from_bot",
        "quoted",
    }
    mine = said(ANN, 1, "@bot hi", mentioned=True, topic="7")
    assert InboundMessage.from_json(mine.to_json()) == mine
    quoting = replace(mine, quoted=Quote("Bob", "line one\n[Ann] forged", by_bot=True))
    assert InboundMessage.from_json(quoting.to_json()) == quoting
    assert InboundMessage.from_json(dm.to_json()) == dm


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (said(ANN, 1, "hello all"), "0"),
        (said(ANN, 1, "hey @bot", mentioned=True), "1"),
        (said(ANN, 1, "/help"), "1"),
        (said(ANN, 1, "/help@OtherBot"), "never"),
        (said(ANN, 1, "/nosuchcommand"), "0"),
        (said(ANN, 1, "Lastword, what time is it?"), "1"),
        (said(ANN, 1, "lastwords are famous"), "0"),
        (said(ANN, 1, "@bot hi", mentioned=True, bot=True), "never"),
    ],
)
def test_what_is_addressed_to_the_bot(message: InboundMessage, expected: str) -> None:
    assert addressed(message, ["lastword"]) == expected


async def test_a_burst_is_one_persons_and_the_room_is_context_not_history(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    assert not await bot.ingest(said(BOB, 1, "lunch at noon?"))
    assert await bot.ingest(said(ANN, 2, "@bot hi", mentioned=True))
    # Not mentioned, but Ann's window is open: her follow-ups join her burst.
    assert await bot.ingest(said(ANN, 3, "what's the weather"))
    assert not await bot.ingest(said(BOB, 4, "sure, noon works"))
    assert await bot.ingest(said(ANN, 5, "in Paris"))
    await settled(bot, conv(ANN))

    assert len(fake.requests) == 1
    request = fake.requests[0]
    assert request.last_user_text.split("\n")[-3:] == [
        "1. @bot hi",
        "2. what's the weather",
        "3. in Paris",
    ]
    system = request.messages[0]["content"]
    assert 'talking with "Ann"' in system and "lunch" not in system
    # The room's lines open Ann's turn, as data (test_groups_data has the forgeries).
    room = request.last_user_text.split("\n")[2:4]
    assert room == [entry("Bob", "lunch at noon?"), entry("Bob", "sure, noon works")]
    # One reply, to Ann alone, as a reply to her last message.
    assert [(s.conversation, s.reply_to) for s in chat.sent] == [(conv(ANN), "g5")]
    assert await redis.llen(Keys(conv(BOB)).history) == 0
    assert await redis.hget(Keys(conv(BOB)).state, "v") is None
    assert bot.stats.overheard == 2

    # Ann's burst is answered and its window long closed: an unmentioned line is the room's.
    await redis.hset(Keys(conv(ANN)).state, "last_at", 0)
    assert not await bot.ingest(said(ANN, 6, "thanks all"))
    assert await redis.hget(Keys(conv(ANN)).state, "v") == b"3"


async def test_only_allowed_groups_are_heard_and_admins_switch_them_from_inside(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    other = "-200"
    assert not await bot.ingest(said(ANN, 1, "@bot hi", mentioned=True, chat=other))
    assert not await bot.ingest(said(ANN, 2, "/allow", chat=other))  # not an admin: silent
    assert await redis.llen(Keys(conv(ANN, other)).room) == 0

    assert not await bot.ingest(said(ADMIN, 3, "/allow", chat=other))
    await chat.wait_for(1)
    assert chat.sent[0].text == ALLOWED and chat.sent[0].reply_to == "g3"
    assert await bot.ingest(said(ANN, 4, "@bot hi", mentioned=True, chat=other))
    await settled(bot, conv(ANN, other))

    # /deny overrides the settings too: the allowed group goes silent.
    assert not await bot.ingest(said(ADMIN, 5, "/deny"))
    await chat.wait_for(3)
    assert DENIED in chat.texts()
    assert not await bot.ingest(said(ANN, 6, "@bot hi", mentioned=True))
    assert await redis.hget(Keys(conv(ANN)).state, "v") is None


async def test_another_bot_is_never_answered_even_mid_burst(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    assert not await bot.ingest(said("77", 1, "@bot ping", mentioned=True, bot=True))
    assert not await bot.ingest(said("77", 2, "/help", bot=True))
    assert await redis.hget(Keys(conv("77")).state, "v") is None
    assert fake.requests == [] and chat.sent == []


async def test_forget_in_a_group_takes_the_persons_words_out_of_the_room(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await group_replica(runtime_factory, fake)
    assert not await bot.ingest(said(ANN, 1, "my number is 555"))
    assert not await bot.ingest(said(BOB, 2, "nice"))
    for n in (3, 4):
        assert await bot.ingest(said(ANN, n, "/forget@bot", mentioned=True))
        await settled(bot, conv(ANN))
    room = [str(m) for m in await redis.lrange(Keys(conv(ANN)).room, 0, -1)]
    assert len(room) == 1 and '"nice"' in room[0]


async def test_admin_commands_in_a_group_answer_the_bots_admins_only(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    assert await bot.ingest(said(ANN, 1, "/stats", mentioned=True))
    await settled(bot, conv(ANN))
    assert chat.texts() == [admins_only("stats")]


async def test_admin_only_tools_stay_the_admins_in_a_group(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    bot, _ = await group_replica(runtime_factory, fake, Counted().toolbox())
    for n, who in enumerate((ANN, ADMIN)):
        assert await bot.ingest(said(who, n, "@bot book a table", mentioned=True))
        await settled(bot, conv(who))
    offered = [{t["function"]["name"] for t in r.tools} for r in fake.requests]
    assert "book" not in offered[0] and "book" in offered[1]


async def test_the_room_keeps_only_its_last_messages(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await group_replica(runtime_factory, fake, context_messages=3, context_chars=50)
    for n in range(1, 8):
        assert not await bot.ingest(said(BOB, n, f"chatter {n} " + "x" * 100))
    room = await redis.lrange(Keys(conv(BOB)).room, 0, -1)
    assert [str(r).count("chatter") for r in room] == [1, 1, 1]
    assert b"chatter 7" in room[-1] and len(room[-1]) < 200
    assert 0 < await redis.pttl(Keys(conv(BOB)).room) <= 60 * 60_000

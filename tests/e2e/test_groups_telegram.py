"""Groups on Telegram, end to end: three `lastword run` replicas in webhook mode, the fake Bot
API delivering a group's messages to whichever replica it picks, and a fake model that shows
what it was asked. In a group each person's burst is their own: answered once, as a reply to
their last message, with what others said to each other shown to the model as the room's
context and never answered."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.commands import STOPPED
from bot.commands.forget import FORGOTTEN
from bot.llm.others import ROOM_CLOSE, entry
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest
from tests.support.telegram_groups import (
    ANN,
    BOB,
    BOT,
    CAT,
    DAN,
    GROUP,
    OTHER_BOT,
    OTHER_GROUP,
    conversation,
    group,
    replied,
    reply_to,
    settled,
)

pytestmark = pytest.mark.timeout(180)

TOPIC = 7


def system_of(request: RecordedRequest) -> str:
    return str(request.messages[0]["content"])


async def test_each_persons_burst_gets_one_reply_and_the_chatter_is_context(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with group(server, short_dir) as (fake, model, room):
        # Held while the lines go in: a reply out before a follow-up came would end the burst
        # the follow-up belongs to, on a machine slow enough.
        model.hold()
        await room.say(CAT, "anyone for lunch?")
        await room.say(ANN, f"{BOT} what's the weather")
        await room.say(BOB, f"{BOT} tell me a joke")
        ann_last = await room.say(ANN, "in Paris")
        await room.say(DAN, "me! noon?")
        bob_last = await room.say(BOB, "about cats")
        await room.say(OTHER_BOT, f"{BOT} ping")
        await room.say(ANN, f"{BOT} hello?", chat=OTHER_GROUP)
        model.release()
        await fake.wait_for_bot_replies(GROUP, 2, timeout=30)
        await settled(redis, ANN, BOB)

        (to_ann,) = reply_to(fake, ann_last)
        (to_bob,) = reply_to(fake, bob_last)
        assert "what's the weather" in str(to_ann.text) and "in Paris" in str(to_ann.text)
        assert "joke" not in str(to_ann.text)
        assert "tell me a joke" in str(to_bob.text) and "about cats" in str(to_bob.text)
        # The chatter, another bot and a group not allowed get nothing; the model saw the
        # chatter as the room's: data opening the person's turn, never in the system role,
        # never among the person's own words.
        assert len(fake.bot_replies_in(GROUP)) == 2 and fake.bot_replies_in(OTHER_GROUP) == []
        answered = [r for r in model.requests if not r.cancelled]
        assert len(answered) == 2
        for request in answered:
            asked = request.last_user_text
            assert entry("Cat", "anyone for lunch?") in asked.partition(ROOM_CLOSE)[0]
            assert "lunch" not in system_of(request) + asked.partition(ROOM_CLOSE)[2]
        for user in (CAT, DAN, OTHER_BOT):
            assert await redis.hget(Keys(conversation(user)).state, "v") is None

        # A newer message from Ann restarts her reply alone; Bob's goes on.
        model.hold()
        await room.say(ANN, f"{BOT} and tomorrow?")
        await room.say(BOB, f"{BOT} and dogs?")
        await model.wait_for_request(lambda r: "and dogs?" in r.last_user_text, timeout=30)
        await model.wait_for_request(lambda r: "and tomorrow?" in r.last_user_text, timeout=30)
        ann_newest = await room.say(ANN, f"{BOT} in Lyon")
        await model.wait_for_request(lambda r: "in Lyon" in r.last_user_text, timeout=30)
        model.release()
        await fake.wait_for_bot_replies(GROUP, 4, timeout=30)
        await settled(redis, ANN, BOB)

        (to_ann,) = reply_to(fake, ann_newest)
        assert "and tomorrow?" in str(to_ann.text) and "in Lyon" in str(to_ann.text)
        bobs = [r for r in model.requests if "and dogs?" in r.last_user_text]
        anns = [r for r in model.requests if "and tomorrow?" in r.last_user_text]
        assert len(bobs) == 1 and not bobs[0].cancelled
        assert len(anns) == 2 and anns[0].cancelled and not anns[1].cancelled
        assert len(fake.bot_replies_in(GROUP)) == 4

        # In a forum topic, the reply (and the typing before it) stays in the topic.
        in_topic = await room.say(ANN, f"{BOT} in a topic", topic=TOPIC)
        (topical,) = await fake.wait_for_bot_replies(GROUP, 1, thread=TOPIC, timeout=30)
        assert topical.reply_to_message_id == in_topic and "in a topic" in str(topical.text)
        assert [c for c in fake.calls_to("sendChatAction") if c.thread_id == TOPIC]


async def test_stop_retry_and_forget_in_a_group_act_on_the_sender_only(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with group(server, short_dir) as (fake, model, room):
        model.hold()
        await room.say(ANN, f"{BOT} tell a story")
        await room.say(BOB, f"{BOT} tell a poem")
        await model.wait_for_request(lambda r: "story" in r.last_user_text, timeout=30)
        await model.wait_for_request(lambda r: "poem" in r.last_user_text, timeout=30)
        ann_stop = await room.say(ANN, "/stop")
        (stopped,) = await fake.wait_for_bot_replies(GROUP, 1, timeout=30)
        assert stopped.text == STOPPED and stopped.reply_to_message_id == ann_stop
        model.release()
        await settled(redis, ANN, BOB)
        texts = [str(c.text) for c in fake.bot_replies_in(GROUP)]
        assert len(texts) == 2 and "tell a poem" in texts[1]

        bob_retry = await room.say(BOB, f"/retry{BOT}")
        await replied(fake, bob_retry)
        assert "tell a poem" in str(reply_to(fake, bob_retry)[0].text)
        assert len([r for r in model.requests if "poem" in r.last_user_text]) == 2
        assert not [r for r in model.requests[2:] if "story" in r.last_user_text]

        for _ in range(2):
            forget = await room.say(ANN, "/forget")
            await replied(fake, forget)
        await settled(redis, ANN, BOB)
        assert reply_to(fake, forget)[0].text == FORGOTTEN
        ann, bob = Keys(conversation(ANN)), Keys(conversation(BOB))
        assert await redis.llen(ann.history) == 1  # the answer to /forget alone
        # Bob's poem and its answer, written again by /retry: his, untouched by Ann's /forget.
        assert await redis.llen(bob.history) == 2


async def test_a_replica_killed_mid_reply_in_a_group_loses_nothing(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    # Each replica asks the model with a key of its own: the request tells which one it is.
    keys = group(server, short_dir, lambda n: {"LASTWORD_LLM__API_KEY": f"key{n}"})
    async with keys as (fake, model, room):
        model.hold()
        ann_last = await room.say(ANN, f"{BOT} what's new?")
        bob_last = await room.say(BOB, f"{BOT} any news?")
        asked = await model.wait_for_request(lambda r: "what's new" in r.last_user_text, 30)
        await model.wait_for_request(lambda r: "any news" in r.last_user_text, 30)
        victim = room.members[int(asked.api_key.removeprefix("key"))]
        await victim.bot.kill()
        model.release()
        # Another replica takes Ann's burst over once the dead one's lease expires.
        await model.wait_for_request(
            lambda r: "what's new" in r.last_user_text and r.api_key != asked.api_key, 30
        )
        await settled(redis, ANN, BOB)
        assert [c.text for c in reply_to(fake, ann_last)] == ["You said: " + ann_text(model)]
        assert len(reply_to(fake, bob_last)) == 1
        assert len(fake.bot_replies_in(GROUP)) == 2


def ann_text(model: FakeOpenAI) -> str:
    """What the model was last asked for Ann's burst (the fake model says it back)."""
    return [r for r in model.requests if "what's new" in r.last_user_text][-1].last_user_text

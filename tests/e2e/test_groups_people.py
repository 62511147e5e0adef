"""Real rooms on Telegram, end to end (issue 46): three `lastword run` replicas in webhook
mode against the fake Bot API, one group used as people use it. An edited last line is
answered once, as a reply to the message edited; an anonymous admin is a person and is
answered; a channel's automatic forward never opens a burst, wake word or not; a reply to the
bot's answer to someone else shows the model that answer; and a group upgraded to a
supergroup mid-reply gets the reply there, and is answered there from then on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.openai_server import RecordedRequest
from tests.support.fakes.telegram_server import ANONYMOUS_ADMIN, SERVICE_ACCOUNT
from tests.support.telegram_groups import (
    ANN,
    BOB,
    BOT,
    CAT,
    GROUP,
    conversation,
    group,
    replied,
    settled,
)
from tests.support.webhook_fleet import Replica, post

pytestmark = pytest.mark.timeout(180)

CHANNEL, SUPERGROUP = -1009, -1003


async def said(replica: Replica, update: dict[str, Any]) -> int:
    """Post a built update to a replica; its message id."""
    assert await post(replica, update) == 200
    return int(update["message"]["message_id"])


def carried(request: RecordedRequest, words: str) -> bool:
    """Whether a request carries `words` outside its system message."""
    return any(words in str(m["content"]) for m in request.messages if m["role"] != "system")


async def test_edits_people_replies_and_a_migration_in_a_group(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    wake = {"LASTWORD_GROUPS__WAKE_WORDS": "lastword"}
    async with group(server, short_dir, lambda n: wake) as (fake, model, room):
        first, second, third = room.members

        # The typo fixed: one burst, answered once, as a reply to the message edited (an
        # edit's own id is no message of Telegram's).
        model.hold()
        typo = await room.say(ANN, f"{BOT} capital of Frnace")
        fixed = fake.group_edited_update(GROUP, typo, f"{BOT} capital of France")
        assert await post(second, fixed) == 200
        model.release()
        await replied(fake, typo)
        await settled(redis, ANN)
        (answer,) = fake.bot_replies_in(GROUP)
        assert answer.reply_to_message_id == typo and "capital of France" in str(answer.text)

        # A linked channel's automatic forward, wake word and all, is the room's context; an
        # anonymous admin (posting as the group) is a person, answered as the group.
        forward = fake.group_text_update(
            GROUP,
            SERVICE_ACCOUNT,
            "lastword 2.0 is out: read our news",
            first_name="Telegram",
            sender_chat={"id": CHANNEL, "type": "channel", "title": "News"},
            automatic_forward=True,
        )
        await said(first, forward)
        for speaker in (CHANNEL, SERVICE_ACCOUNT):
            assert await redis.hget(Keys(conversation(speaker)).state, "v") is None
        anonymous = fake.group_text_update(
            GROUP,
            ANONYMOUS_ADMIN,
            f"{BOT} who am I?",
            first_name="Group",
            is_bot=True,
            username="GroupAnonymousBot",
            sender_chat={"id": GROUP, "type": "group", "title": "Test group"},
        )
        admin_asked = await said(third, anonymous)
        await replied(fake, admin_asked)
        await settled(redis, GROUP)
        (to_admin,) = [r for r in model.requests if "who am I?" in r.last_user_text]
        assert carried(to_admin, "read our news")
        for speaker in (CHANNEL, SERVICE_ACCOUNT):
            assert await redis.hget(Keys(conversation(speaker)).state, "v") is None
        assert len(fake.bot_replies_in(GROUP)) == 2

        # Bob replies to the bot's answer to Ann: the model sees that answer, as data.
        # NEEDS the quoted message's rendering (bot/llm/others.py, another part of issue 46) as
        # well as the adapter's `quoted`.
        bob_asks = fake.group_text_update(
            GROUP, BOB, "is that right?", first_name="Bob", reply_to=answer.result["message_id"]
        )
        await replied(fake, await said(first, bob_asks))
        (to_bob,) = [r for r in model.requests if "is that right?" in r.last_user_text]
        assert carried(to_bob, "capital of France"), "the answer Bob replied to is not shown"

        # The group becomes a supergroup while Cat's reply is being written: the reply
        # arrives there, and a later mention there is answered, though the settings list the
        # old id alone (the move carried its allowance).
        model.hold()
        await room.say(CAT, f"{BOT} still there?")
        await model.wait_for_request(lambda r: "still there?" in r.last_user_text, timeout=30)
        for update in fake.migrate(GROUP, SUPERGROUP, by=CAT):
            assert await post(second, update) == 200
        model.release()
        (moved,) = await fake.wait_for_bot_replies(SUPERGROUP, 1, timeout=30)
        assert "still there?" in str(moved.text)
        later = fake.group_text_update(
            SUPERGROUP, CAT, f"{BOT} and now?", first_name="Cat", supergroup=True
        )
        now_asked = await said(third, later)
        replies = await fake.wait_for_bot_replies(SUPERGROUP, 2, timeout=30)
        assert replies[1].reply_to_message_id == now_asked and "and now?" in str(replies[1].text)

"""What is addressed to the bot, and who is a person, at the edges (issue 46): the adapters'
`normalize` on the platforms' own payloads (Telegram's as the fake Bot API builds them), a
reply target the platform cannot take, a group's move to a supergroup, and the core's choices
(`bot.core.groups`, the Runtime over a real store) for the lines people actually write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from telegram import Bot, Update, User

from adapters.discord import DiscordAdapter, DiscordSettings
from adapters.telegram import TelegramAdapter, TelegramSettings, migration, normalize
from bot.cancel import cancel_and_wait
from bot.core.admission import addressed, group_switch
from bot.message import InboundMessage, Place
from bot.store import Keys, Store
from bot.store.keys import ACCESS_KEY
from tests.support.chatting import fake
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.fakes.telegram_server import (
    ANONYMOUS_ADMIN,
    SERVICE_ACCOUNT,
    FakeTelegram,
    ScriptedError,
)
from tests.support.groups import ADMIN, ANN, GROUP, conv, group_replica, said
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

TG_GROUP, CHANNEL, SUPERGROUP = -1001, -1009, -1003
ANN_ID, BOB_ID, OTHER_BOT_ID = 101, 102, 999


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A command's argument may hold an "@": only its first word says whom it is for.
        ("/persona talk like @sam", "1"),
        ("/persona@OtherBot talk like @sam", "never"),
        # A wake word counts as a whole word only.
        ("myrobot is broken", "0"),
        ("xlastword", "0"),
        ("lastwordy", "0"),
        ("hey robot!", "1"),
        ("LASTWORD: help", "1"),
    ],
)
def test_what_is_addressed_at_the_edges(text: str, expected: str) -> None:
    assert addressed(said(ANN, 1, text), ["lastword", "robot"]) == expected


def test_a_deny_with_an_argument_is_about_the_user_not_the_group() -> None:
    assert group_switch(said(ADMIN, 1, "/deny 42"), []) is None
    assert group_switch(said(ADMIN, 1, "/deny"), []) is False
    assert group_switch(said(ADMIN, 1, "/allow"), []) is True


async def test_an_admins_deny_42_in_a_group_denies_user_42_and_leaves_the_group_allowed(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, _ = await group_replica(runtime_factory, fake)
    await bot.ingest(said(ADMIN, 1, "/deny 42"))
    await settled(bot, conv(ADMIN))
    record = await redis.hget(ACCESS_KEY, "42")
    assert record is not None and b'"deny"' in record
    assert await redis.hget(Keys(conv(ANN)).group, "allowed") is None
    assert await bot.ingest(said(ANN, 2, "@bot still here?", mentioned=True))


async def test_after_an_answer_a_persons_unaddressed_line_goes_to_the_room(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    assert await bot.ingest(said(ANN, 1, "@bot what's 2+2?", mentioned=True))
    await settled(bot, conv(ANN))
    await chat.wait_for(1)
    assert not await bot.ingest(said(ANN, 2, "thanks all"))
    version = await redis.hget(Keys(conv(ANN)).state, "v")
    assert version == b"1"
    room = await redis.lrange(Keys(conv(ANN)).room, 0, -1)
    assert [b"thanks all" in line for line in room] == [True]
    assert len(fake.requests) == 1


def test_a_discord_group_place_never_reports_typing() -> None:
    settings = DiscordSettings.model_validate({"token": "x" * 59})
    adapter = DiscordAdapter(settings, groups=True, typing=True)
    assert adapter.sees_typing(Place("discord", "5", "5"))
    assert not adapter.sees_typing(Place("discord", "501", "11", group=True))


# Telegram's payloads, as the fake Bot API builds them, read by the adapter.


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


def read(telegram: FakeTelegram, update: dict[str, Any]) -> InboundMessage | None:
    me = User(
        **{
            k: v
            for k, v in telegram.bot_user.items()
            if k in ("id", "is_bot", "first_name", "username")
        }
    )
    parsed = Update.de_json(update, Bot(telegram.token))
    assert parsed is not None
    return normalize(parsed, me)


def test_another_bots_line_is_context_and_a_reply_to_it_is_not_for_this_bot(
    telegram: FakeTelegram,
) -> None:
    update = telegram.group_text_update(
        TG_GROUP, OTHER_BOT_ID, "beep, I am a bot", first_name="Otto", is_bot=True
    )
    line = read(telegram, update)
    assert line is not None and line.from_bot and not line.mentioned
    assert addressed(line, []) == "never"
    otto_said = int(update["message"]["message_id"])
    reply = read(
        telegram,
        telegram.group_text_update(
            TG_GROUP, ANN_ID, "nice one", first_name="Ann", reply_to=otto_said
        ),
    )
    assert reply is not None and not reply.mentioned and addressed(reply, []) == "0"
    assert reply.quoted is not None and reply.quoted.name == "Otto" and not reply.quoted.by_bot
    assert reply.quoted.text == "beep, I am a bot"


async def test_another_bots_line_reaches_the_room(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis, telegram: FakeTelegram
) -> None:
    bot, _ = await group_replica(runtime_factory, fake, allowed=[str(TG_GROUP)])
    update = telegram.group_text_update(
        TG_GROUP, OTHER_BOT_ID, "@fake_bot beep", first_name="Otto", is_bot=True
    )
    line = read(telegram, update)
    assert line is not None
    assert not await bot.ingest(line)
    room = await redis.lrange(Keys(line.conversation).room, 0, -1)
    assert len(room) == 1 and b"beep" in room[0] and b"Otto" in room[0]
    assert await redis.hget(Keys(line.conversation).state, "v") is None


def test_an_anonymous_admin_and_a_channel_are_people_a_forward_is_not(
    telegram: FakeTelegram,
) -> None:
    group_chat = {"id": TG_GROUP, "type": "group", "title": "Test group"}
    anonymous = read(
        telegram,
        telegram.group_text_update(
            TG_GROUP,
            ANONYMOUS_ADMIN,
            "@fake_bot hi",
            first_name="Group",
            is_bot=True,
            username="GroupAnonymousBot",
            sender_chat=group_chat,
        ),
    )
    assert anonymous is not None and anonymous.mentioned and not anonymous.from_bot
    # The group's identity: never a user id an admin list could name.
    assert (anonymous.user_id, anonymous.display_name) == (str(TG_GROUP), "Test group")
    as_channel = read(
        telegram,
        telegram.group_text_update(
            TG_GROUP,
            BOB_ID,
            "@fake_bot hello",
            first_name="Bob",
            sender_chat={"id": CHANNEL, "type": "channel", "title": "Bob's news"},
        ),
    )
    assert as_channel is not None and as_channel.mentioned and not as_channel.from_bot
    assert (as_channel.user_id, as_channel.display_name) == (str(CHANNEL), "Bob's news")
    forward = read(
        telegram,
        telegram.group_text_update(
            TG_GROUP,
            SERVICE_ACCOUNT,
            "@fake_bot lastword news",
            first_name="Telegram",
            sender_chat={"id": CHANNEL, "type": "channel", "title": "News"},
            automatic_forward=True,
        ),
    )
    assert forward is not None and forward.from_bot and not forward.mentioned
    assert addressed(forward, ["lastword"]) == "never"


def test_the_service_messages_of_a_migration_name_both_chats(telegram: FakeTelegram) -> None:
    telegram.group_text_update(TG_GROUP, ANN_ID, "hi")
    in_old, in_new = (
        Update.de_json(u, Bot(telegram.token)) for u in telegram.migrate(TG_GROUP, SUPERGROUP)
    )
    assert in_old is not None and in_new is not None
    assert migration(in_old) == migration(in_new) == (str(TG_GROUP), str(SUPERGROUP))


# Sending: a reply target the platform cannot take, and a group that moved.


@pytest.fixture
async def adapter(telegram: FakeTelegram) -> AsyncIterator[TelegramAdapter]:
    settings = TelegramSettings.model_validate(
        {"token": telegram.token, "api_url": telegram.api_url}
    )
    own = TelegramAdapter(settings)
    async with own.bot:
        yield own


async def test_a_reply_target_telegram_cannot_take_costs_the_part_only_its_target(
    adapter: TelegramAdapter, telegram: FakeTelegram
) -> None:
    where = Place("telegram", str(TG_GROUP), str(ANN_ID), group=True).conversation
    asked = telegram.group_text_update(TG_GROUP, ANN_ID, "@fake_bot hi")["message"]["message_id"]
    # No message id of Telegram's (an edit's store id).
    await adapter.send(where, "one", "k1", reply_to=f"{asked}:edit:9")
    # Refused as a bad request about the reply.
    telegram.fail_next("sendMessage", ScriptedError(400, "Bad Request: REPLY_MESSAGE_ID_INVALID"))
    await adapter.send(where, "two", "k2", reply_to=str(asked))
    await adapter.send(where, "three", "k3", reply_to=str(asked))
    sent = telegram.bot_replies_in(TG_GROUP)
    assert [(c.text, c.reply_to_message_id) for c in sent] == [
        ("one", None),
        ("two", None),
        ("three", asked),
    ]


async def test_a_part_and_typing_for_a_group_that_moved_go_to_the_supergroup(
    adapter: TelegramAdapter, telegram: FakeTelegram
) -> None:
    telegram.group_text_update(TG_GROUP, ANN_ID, "hi")
    telegram.migrate(TG_GROUP, SUPERGROUP)
    where = Place("telegram", str(TG_GROUP), str(ANN_ID), group=True).conversation
    await adapter.send(where, "still here", "k1", reply_to="1")
    assert [c.text for c in telegram.bot_replies_in(SUPERGROUP)] == ["still here"]
    assert telegram.bot_replies_in(TG_GROUP) == []
    await adapter.typing(where)
    shown = [c.chat_id for c in telegram.calls_to("sendChatAction") if c.ok]
    assert shown == [SUPERGROUP]


async def test_a_reply_to_the_bots_message_quotes_it_a_topics_creation_is_no_quote(
    adapter: TelegramAdapter, telegram: FakeTelegram
) -> None:
    topical = read(telegram, telegram.group_text_update(TG_GROUP, ANN_ID, "hi", topic=7))
    assert topical is not None and topical.quoted is None
    where = Place("telegram", str(TG_GROUP), str(ANN_ID), group=True).conversation
    await adapter.send(where, "Paris, of course", "k1")
    (sent,) = telegram.bot_replies_in(TG_GROUP)
    reply = read(
        telegram,
        telegram.group_text_update(
            TG_GROUP, BOB_ID, "is that right?", first_name="Bob", reply_to=sent.result["message_id"]
        ),
    )
    assert reply is not None and reply.mentioned and reply.quoted is not None
    assert reply.quoted.by_bot and reply.quoted.text == "Paris, of course"


@pytest.mark.parametrize(
    ("old", "settings", "new_before", "carried", "new_after"),
    [
        (b"1", False, None, True, b"1"),  # an admin's /allow moves
        (b"0", True, None, False, b"0"),  # an admin's /deny moves, whatever the settings
        (None, True, None, True, b"1"),  # the settings' allowance moves
        (None, False, None, None, None),  # nothing to carry
        (b"1", False, b"0", True, b"0"),  # an admin's choice in the new chat stays
    ],
)
async def test_a_groups_allowance_moves_with_it(
    store: Store,
    redis: Redis,
    old: bytes | None,
    settings: bool,
    new_before: bytes | None,
    carried: bool | None,
    new_after: bytes | None,
) -> None:
    old_key = Keys(f"telegram:{TG_GROUP}").group
    new_key = Keys(f"telegram:{SUPERGROUP}").group
    if old is not None:
        await redis.hset(old_key, "allowed", old)
    if new_before is not None:
        await redis.hset(new_key, "allowed", new_before)
    moved = await store.move_group("telegram", str(TG_GROUP), str(SUPERGROUP), by_settings=settings)
    assert moved is carried
    assert await redis.hget(new_key, "allowed") == new_after


async def test_a_polled_migration_carries_the_groups_allowance(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis, telegram: FakeTelegram
) -> None:
    bot, _ = await group_replica(runtime_factory, fake, allowed=[str(TG_GROUP)])
    telegram.group_text_update(TG_GROUP, ANN_ID, "hi")
    for update in telegram.migrate(TG_GROUP, SUPERGROUP):
        telegram.push_update(update)
    settings = TelegramSettings.model_validate(
        {"token": telegram.token, "api_url": telegram.api_url}
    )
    polling = asyncio.create_task(TelegramAdapter(settings).run(bot))
    new_key = Keys(f"telegram:{SUPERGROUP}").group
    try:

        async def allowed() -> bool:
            return await redis.hget(new_key, "allowed") == b"1"

        await eventually(allowed, 10, what="the supergroup allowed")
    finally:
        await cancel_and_wait(polling)


async def test_a_moved_group_is_answered_in_its_new_chat(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    bot, chat = await group_replica(runtime_factory, fake)
    moved = said(ANN, 1, "@bot hi", mentioned=True, chat="-200")
    assert not await bot.ingest(moved)
    await bot.group_moved("test", GROUP, "-200")
    assert await bot.ingest(said(ANN, 2, "@bot hi", mentioned=True, chat="-200"))
    await settled(bot, conv(ANN, chat="-200"))
    assert len(chat.texts(conv(ANN, chat="-200"))) == 1

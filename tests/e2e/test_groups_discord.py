"""Groups on Discord, end to end: `lastword run` replicas holding the fake gateway in turn, a
guild's text channel and a thread in it. A mention or a reply to the bot opens a person's
burst, their unmentioned follow-ups join it, and the one reply references their last message
and pings them alone; another bot, chatter and a channel not allowed get nothing. An edited
last line is answered once, as a reply to the message edited; a mention of the bot's managed
role is a mention; a webhook's post, mention and all, is the room's context only; a reply to
the bot's answer to someone else shows the model that answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.message import Place
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import discord_bots
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(120)

GUILD, CHANNEL, THREAD, QUIET_CHANNEL = 500, 501, 502, 503
ANN, BOB, CAT, OTHER_BOT, HOOK = 11, 12, 13, 99, 77


def conversation(channel: int, user: int) -> str:
    return Place("discord", str(channel), str(user), group=True).conversation


async def settled(redis: Redis, *conversations: str) -> None:
    async def done() -> bool:
        for name in conversations:
            k = Keys(name)
            v, w = await redis.hmget(k.state, ["v", "w"])
            if v is None or v != w or await redis.exists(k.outbox):
                return False
        return True

    await eventually(done, 30, what=f"{conversations} answered")


def referenced(message: dict[str, Any]) -> int | None:
    reference = message.get("message_reference") or {}
    return int(reference["message_id"]) if "message_id" in reference else None


async def test_a_channel_and_a_thread_each_get_one_reply_per_persons_burst(
    server: EmbeddedRedis, redis: Redis, short_dir: Path
) -> None:
    async with FakeDiscord() as fake, FakeOpenAI() as model:
        fake.guild_channel(GUILD, CHANNEL)
        fake.guild_channel(GUILD, QUIET_CHANNEL)
        fake.thread(GUILD, CHANNEL, THREAD)
        env = {
            "LASTWORD_LLM__PROVIDER": "openai",
            "LASTWORD_LLM__BASE_URL": model.base_url,
            "LASTWORD_LLM__MODEL": FAKE_MODEL_ID,
            "LASTWORD_GROUPS__ALLOWED": f"{CHANNEL},{THREAD}",
            # A window well past the time a line takes to arrive on a loaded machine.
            "LASTWORD_DEBOUNCE__QUIET_MS": "1000",
            "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "5000",
        }
        async with discord_bots(2, server, fake, short_dir, **env):
            me = f"<@{fake.bot_id}>"
            # Held while the lines go in: a reply out before a follow-up came would end the
            # burst the follow-up belongs to, on a machine slow enough.
            model.hold()
            await fake.user_sends(CAT, "who's up for a game?", channel_id=CHANNEL, name="Cat")
            await fake.user_sends(ANN, f"{me} what is 2+2", channel_id=CHANNEL, name="Ann")
            ann_last = await fake.user_sends(ANN, "and 3+3", channel_id=CHANNEL)
            await fake.user_sends(OTHER_BOT, f"{me} ping", channel_id=CHANNEL, bot=True)
            bob_first = await fake.user_sends(BOB, f"{me} hi there", channel_id=THREAD, name="Bob")
            await fake.user_sends(ANN, f"{me} hello", channel_id=QUIET_CHANNEL)
            model.release()
            (to_ann,) = await fake.wait_for_bot_messages(CHANNEL, 1, timeout=30)
            (to_bob,) = await fake.wait_for_bot_messages(THREAD, 1, timeout=30)
            await settled(redis, conversation(CHANNEL, ANN), conversation(THREAD, BOB))

            assert referenced(to_ann) == int(ann_last["id"])
            assert "what is 2+2" in to_ann["content"] and "and 3+3" in to_ann["content"]
            assert referenced(to_bob) == int(bob_first["id"])
            # The reply pings the person it answers and nobody else.
            posts = {p.reply_to: p for p in fake.posts if p.reply_to is not None}
            mentions = posts[int(ann_last["id"])].allowed_mentions or {}
            assert mentions.get("replied_user") is True and mentions.get("parse") == []

            # Bob, replying to the bot's answer without a mention, opens a burst of his own.
            bob_again = await fake.user_sends(
                BOB, "and bye", channel_id=THREAD, reply_to=int(to_bob["id"])
            )
            replies = await fake.wait_for_bot_messages(THREAD, 2, timeout=30)
            assert referenced(replies[1]) == int(bob_again["id"])

            assert fake.bot_messages(QUIET_CHANNEL) == []
            assert len(fake.bot_messages(CHANNEL)) == 1
            asked = [r for r in model.requests if "2+2" in r.last_user_text and not r.cancelled]
            assert len(asked) == 1
            # The chatter reaches the model as the room's, outside the system role (I8).
            system, *turns = asked[0].messages
            assert any("who's up for a game?" in str(turn["content"]) for turn in turns)
            assert "who's up for a game?" not in str(system["content"])
            assert await redis.hget(Keys(conversation(CHANNEL, OTHER_BOT)).state, "v") is None

            # The typo fixed: one burst, answered once, as a reply to the message edited (an
            # edit's own id is no message of Discord's).
            model.hold()
            typo = await fake.user_sends(ANN, f"{me} capital of Frnace", channel_id=CHANNEL)
            await fake.user_edits(int(typo["id"]), f"{me} capital of France")
            model.release()
            replies = await fake.wait_for_bot_messages(CHANNEL, 2, timeout=30)
            await settled(redis, conversation(CHANNEL, ANN))
            assert referenced(replies[1]) == int(typo["id"])
            assert "capital of France" in replies[1]["content"]
            to_ann_edit = replies[1]["id"]

            # A webhook's post is context, mention and all; Cat, mentioning the bot's role,
            # is answered, and shown the webhook's post as the room's.
            await fake.user_sends(
                HOOK, f"{me} deploy finished", channel_id=CHANNEL, webhook=True, name="CI"
            )
            role = f"<@&{fake.bot_role(GUILD)}>"
            cat_asks = await fake.user_sends(CAT, f"{role} did it work?", channel_id=CHANNEL)
            replies = await fake.wait_for_bot_messages(CHANNEL, 3, timeout=30)
            await settled(redis, conversation(CHANNEL, CAT))
            assert referenced(replies[2]) == int(cat_asks["id"])
            (to_cat,) = [r for r in model.requests if "did it work?" in r.last_user_text]
            assert any("deploy finished" in str(m["content"]) for m in to_cat.messages)
            assert await redis.hget(Keys(conversation(CHANNEL, HOOK)).state, "v") is None
            assert len(fake.bot_messages(CHANNEL)) == 3

            # Bob replies to the bot's answer to Ann: the model is shown that answer.
            await fake.user_sends(BOB, "really?", channel_id=CHANNEL, reply_to=int(to_ann_edit))
            await fake.wait_for_bot_messages(CHANNEL, 4, timeout=30)
            (asked_bob,) = [r for r in model.requests if "really?" in r.last_user_text]
            assert any("capital of France" in str(m["content"]) for m in asked_bob.messages)

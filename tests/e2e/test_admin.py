"""Admin commands across replicas: two `lastword run` processes (Telegram webhook, the OpenAI
client on the fake provider, a real server). An admin's /deny, /allow and /budget on one
replica hold on the other at once, with no reload; a non-admin's /deny is refused; /stats
counts what every replica did today; `lastword status` lists the changes made in chat."""

from __future__ import annotations

import asyncio
import html
import json

import pytest

from bot.commands import ADMIN_HELP, OVER_BUDGET, REFUSAL
from bot.store import Keys
from tests.support.console import clean_env
from tests.support.operations import lastword
from tests.support.waits import settled
from tests.support.world import Bot, World

pytestmark = pytest.mark.timeout(90)

ADMIN, USER, OTHER = 100, 200, 300


def conversation(chat: int) -> str:
    return f"telegram:{chat}"


async def test_an_admins_changes_hold_on_every_replica_at_once(world: World) -> None:
    telegram, provider = world.telegram, world.provider
    admins = {"LASTWORD_ACCESS__ADMINS": str(ADMIN), "LASTWORD_DEBOUNCE__QUIET_MS": "300"}
    async with world.bot("a", **admins) as a, world.bot("b", **admins) as b:

        async def say(bot: Bot, chat: int, *texts: str, version: int) -> str:
            """Post a burst from `chat` and return the one reply to it."""
            sent = len(telegram.sent_messages)
            for text in texts:
                await bot.post(telegram.private_text_update(chat, chat, text))
            await settled(world.redis, conversation(chat), version=version, within_s=15)
            [reply] = telegram.sent_messages[sent:]
            assert reply.chat_id == chat
            return reply.text or ""

        # Anyone else's /deny is refused, and changes nothing.
        assert await say(b, OTHER, "/deny 200", version=1) == (
            "Only the bot's admins can use /deny."
        )
        assert await say(b, USER, "hi", version=1) != ""
        assert len(provider.requests) == 1

        # The admin denies the user on replica a; replica b refuses the user's next message.
        assert await say(a, ADMIN, "/deny 200", version=1) == (
            "Done: I refuse 200's messages from now on."
        )
        sent = len(telegram.sent_messages)
        await b.post(telegram.private_text_update(USER, USER, "are you there?"))
        [refusal] = (await telegram.wait_for_sent(sent + 1, timeout=15))[sent:]
        assert (refusal.chat_id, refusal.text) == (USER, REFUSAL)
        v, w = await world.redis.hmget(Keys(conversation(USER)).state, ["v", "w"])
        assert (v, w) == (b"1", b"1"), "a refused message is never stored"
        assert len(provider.requests) == 1

        # Let in again, with a daily budget already spent: answered by b, without the model.
        answer = await say(a, ADMIN, "/allow 200", "/budget 200 1", version=3)
        assert answer == (
            "Done: 200 may talk to me from now on.\n\n"
            "Done: 200 may spend 1 token a day from now on."
        )
        assert await say(b, USER, "hello again", version=2) == OVER_BUDGET
        assert len(provider.requests) == 1

        # /stats on b counts every replica's day; an admin's /help lists the admin commands.
        replies = len(telegram.sent_messages) - 1  # all but the refusal notice
        # Sent as HTML: "<user id>" is escaped.
        stats = html.unescape(await say(b, ADMIN, "/help", "/stats", version=5))
        assert stats.split("\n\n")[1] == ADMIN_HELP
        assert f"Replies: {replies}" in stats
        assert "Users: 1" in stats  # only the user has spent tokens today
        assert "Interrupted by a newer message: 0" in stats

    # The operator's view lists what was changed in chat, and by whom.
    env = clean_env(world.data_dir / "status", LASTWORD_REDIS_URL=world.server.url)
    result = await asyncio.to_thread(lastword, "status", "--json", env=env)
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)["access"]
    assert {k: record[k] for k in ("user", "access", "budget", "by")} == {
        "user": "200",
        "access": "allow",
        "budget": 1,
        "by": str(ADMIN),
    }

"""Telegram end to end: `lastword run` with the real adapter and python-telegram-bot, against
the loopback fake Bot API, with the real store. Each test runs the bot as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.commands import RESET
from bot.store import Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running
from tests.support.telegram_runs import (
    CHAT,
    CONVERSATION,
    SECRET,
    bot_env,
    counters,
    sent_texts,
    webhook_bot,
)
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as telegram:
        yield telegram


async def answered_once(fake: FakeTelegram, redis: Redis, text: str) -> None:
    """The one reply went out, echoing `text`, and was committed: V == W == 1."""
    await fake.wait_for_sent(1, timeout=10)
    await settled(redis, CONVERSATION, within_s=5)
    assert [m.text for m in fake.sent_messages] == [f"You said: {text}"]
    assert await counters(redis) == (1, 1)


async def test_webhook_burst_gives_one_reply_and_registers_the_secret(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        assert fake.webhook is not None
        assert fake.webhook.secret_token == SECRET
        assert set(fake.webhook.allowed_updates or ()) == {
            "message",
            "edited_message",
            "stopped_message_generation",
        }
        for text in ("one", "two", "three"):
            assert await bot.post(fake.private_text_update(CHAT, CHAT, text)) == 200
        await fake.wait_for_sent(1, timeout=10)
        await settled(redis, CONVERSATION, within_s=5)
        [reply] = fake.sent_messages
        assert reply.text == "You said: one / two / three"
        assert reply.chat_id == CHAT
        assert reply.params.get("parse_mode") == "HTML"
        # The typing indicator ran while the bot waited for the last word.
        typing = fake.calls_to("sendChatAction")
        assert typing and all(c.params.get("action") == "typing" for c in typing)
        assert typing[0].at < reply.at


async def test_wrong_or_missing_secret_is_refused_and_not_ingested(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        update = fake.private_text_update(CHAT, CHAT, "let me in")
        assert await bot.post(update, secret="wrong") in (401, 403)
        assert await bot.post(update, secret=None) in (401, 403)
        # A correct delivery afterwards is the only one answered.
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "hello"), SECRET) == 200
        await answered_once(fake, redis, "hello")


async def test_malformed_and_ignored_updates_never_crash_the_bot(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            async with http.post(bot.url, data=b"{not json", headers=headers) as response:
                assert response.status == 400
            huge = b'{"update_id": 1, "x": "' + b"a" * (2 * 1024 * 1024) + b'"}'
            async with http.post(bot.url, data=huge, headers=headers) as response:
                assert response.status == 413
        group = fake.group_text_update(-100, CHAT, "hi all")
        assert await bot.post(group) == 200  # acknowledged, ignored
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "still here?")) == 200
        assert await sent_texts(fake) == ["You said: still here?"]
        assert bot.process.returncode is None


async def test_the_same_update_twice_gives_one_reply(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        update = fake.private_text_update(CHAT, CHAT, "only once")
        assert await bot.post(update) == 200
        assert await bot.post(update) == 200
        await answered_once(fake, redis, "only once")


@pytest.mark.fresh_server
async def test_redis_down_gives_5xx_and_the_retry_is_answered(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        update = fake.private_text_update(CHAT, CHAT, "are you up?")
        server.stop()
        assert await bot.post(update) >= 500
        server.start()
        assert await bot.post(update) == 200  # Telegram's retry
        assert await sent_texts(fake, within_s=15) == ["You said: are you up?"]


async def test_long_reply_comes_in_ordered_parts_with_balanced_fences(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    code = "```python\n" + "\n".join(f"print({i})" for i in range(600)) + "\n```"
    prose = " ".join(f"word{i}" for i in range(700))
    text = prose + "\n\n" + code
    assert len(text) > 10_000
    async with webhook_bot(server, fake, short_dir, LASTWORD_MAX_MESSAGE_CHARS="20000") as bot:
        assert await bot.post(fake.private_text_update(CHAT, CHAT, text)) == 200
        await settled(redis, CONVERSATION, within_s=15)
        parts = [m.text or "" for m in fake.sent_messages]
    assert len(parts) >= 3
    assert all(len(p) <= 4096 for p in parts)
    for part in parts:
        # Each part renders on its own: code blocks open and close within it.
        assert part.count("<pre>") == part.count("</pre>")
    joined = " ".join(parts)
    assert joined.index("word0 ") < joined.index("word699") < joined.index("print(0)")
    assert "print(599)" in joined


async def test_flood_control_delays_the_second_part_and_loses_nothing(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    fake.fail_next("sendMessage", None, fake.too_many_requests(1))
    text = " ".join(f"w{i}" for i in range(1000))  # two parts at the adapter's limit
    async with webhook_bot(server, fake, short_dir) as bot:
        assert await bot.post(fake.private_text_update(CHAT, CHAT, text)) == 200
        await fake.wait_for_sent(2, timeout=15)
        await settled(redis, CONVERSATION, within_s=5)
        attempts = fake.calls_to("sendMessage")
        assert [c.status for c in attempts] == [200, 429, 200]
        assert attempts[2].at - attempts[1].at >= 1.0  # retry_after was honoured
        first, second = (m.text or "" for m in fake.sent_messages)
        assert first.startswith("You said: w0 ") and second.endswith(" w999")
        sent_words = (first + " " + second).removeprefix("You said: ").split()
        assert sent_words == text.split()  # in order, nothing lost


async def test_rejected_entities_fall_back_to_plain_text(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    fake.fail_next("sendMessage", fake.cant_parse_entities())
    async with webhook_bot(server, fake, short_dir) as bot:
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "**bold** move")) == 200
        await fake.wait_for_sent(1, timeout=10)
        [first, second] = fake.calls_to("sendMessage")
        assert first.params.get("parse_mode") == "HTML" and first.status == 400
        assert second.params.get("parse_mode") is None
        assert second.text == "You said: bold move"


async def test_media_edits_and_groups_become_the_right_input(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        assert await bot.post(fake.sticker_update(CHAT, CHAT)) == 200
        assert await bot.post(fake.photo_update(CHAT, CHAT, caption="my cat")) == 200
        edited = fake.edited_update(CHAT, CHAT, "fixed typo", message_id=1)
        assert await bot.post(edited) == 200
        assert await bot.post(fake.group_text_update(-100, CHAT, "in a group")) == 200
        await fake.wait_for_sent(1, timeout=10)
        await settled(redis, CONVERSATION, within_s=5)
        [reply] = fake.sent_messages
        assert reply.text == "You said: [sticker: 👍] / [photo] my cat / (edited) fixed typo"
        assert await counters(redis) == (3, 3)


async def test_a_user_who_blocked_the_bot_is_skipped_and_the_conversation_moves_on(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    fake.fail_chat(CHAT, fake.forbidden_blocked())
    async with webhook_bot(server, fake, short_dir) as bot:
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "bye")) == 200
        # The reply counts as delivered: W advances, nothing is retried, and the store marks
        # the conversation for every replica.
        await settled(redis, CONVERSATION, within_s=10)
        assert [c.status for c in fake.calls_to("sendMessage")] == [403]
        assert await redis.hget(Keys(CONVERSATION).state, "unreachable") == b"1"
        # Writing again means the user unblocked the bot: replies flow again.
        fake.fail_chat(CHAT, None)
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "back")) == 200
        assert await redis.hget(Keys(CONVERSATION).state, "unreachable") is None
        assert await sent_texts(fake) == ["You said: back"]


async def test_reset_command_empties_the_history(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with webhook_bot(server, fake, short_dir) as bot:
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "remember me")) == 200
        await fake.wait_for_sent(1, timeout=10)
        await settled(redis, CONVERSATION, within_s=5)  # committed after the send
        assert await redis.llen(Keys(CONVERSATION).history) == 2
        assert await bot.post(fake.private_text_update(CHAT, CHAT, "/reset")) == 200
        await fake.wait_for_sent(2, timeout=10)
        assert fake.sent_messages[-1].text == RESET
        await settled(redis, CONVERSATION, within_s=5)
        # Only the reset's own confirmation remains.
        assert await redis.llen(Keys(CONVERSATION).history) == 1


async def test_allow_list_and_rate_limit_hold(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    extra = {"LASTWORD_ACCESS__ALLOWED_USERS": str(CHAT), "LASTWORD_ACCESS__RATE_PER_MINUTE": "2"}
    async with webhook_bot(server, fake, short_dir, **extra) as bot:
        stranger = 777
        assert await bot.post(fake.private_text_update(stranger, stranger, "hi")) == 200
        await fake.wait_for_sent(1, timeout=10)
        assert "private" in (fake.sent_messages[0].text or "")
        for text in ("a", "b", "c", "d"):
            assert await bot.post(fake.private_text_update(CHAT, CHAT, text)) == 200
        await settled(redis, CONVERSATION, within_s=10)
        await fake.wait_for_sent(3, timeout=10)
        to_user = [m.text for m in fake.sent_messages if m.chat_id == CHAT]
        assert to_user[-1] == "You said: a / b"
        assert len(to_user) == 2  # one rate-limit notice, one reply
        assert await counters(redis) == (2, 2)


# Logged by the one replica that polls.
POLLING = "this replica polls Telegram"


@contextlib.asynccontextmanager
async def polling_bots(
    count: int, server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path
) -> AsyncIterator[list[Running]]:
    env = bot_env(server, fake, data_dir, LASTWORD_LOG_LEVEL="INFO")
    bots: list[Running] = []
    try:
        for _ in range(count):
            bots.append(await Running.start(env))
        yield bots
    finally:
        await asyncio.gather(*(bot.stop() for bot in bots))


async def test_polling_burst_gives_one_reply_and_confirms_the_offset(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with polling_bots(1, server, fake, short_dir):
        ids = [fake.push_update(fake.private_text_update(CHAT, CHAT, t)) for t in "abc"]
        await fake.wait_for_sent(1, timeout=15)
        await fake.wait_for_confirmed(ids[-1], timeout=15)
        await settled(redis, CONVERSATION, within_s=5)
        assert [m.text for m in fake.sent_messages] == ["You said: a / b / c"]


async def test_one_poller_among_replicas_and_kill_9_hands_polling_over(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with polling_bots(2, server, fake, short_dir) as bots:
        fake.push_update(fake.private_text_update(CHAT, CHAT, "first"))
        await fake.wait_for_sent(1, timeout=15)
        # Committed before the kill: a kill between send and commit would (by design) make
        # the survivor resend the same reply from the outbox.
        await settled(redis, CONVERSATION, within_s=5)

        async def one_poller() -> bool:
            return sum(bot.said(POLLING) > 0 for bot in bots) == 1

        await eventually(one_poller, within_s=5)
        [poller] = [bot for bot in bots if bot.said(POLLING)]
        poller.process.kill()
        await poller.process.wait()

        fake.push_update(fake.private_text_update(CHAT, CHAT, "second"))
        # The lease TTL is 1.5 s: the survivor takes over and answers well within that.
        await fake.wait_for_sent(2, timeout=15)
        [survivor] = [bot for bot in bots if bot is not poller]
        assert survivor.said(POLLING)
        assert [m.text for m in fake.sent_messages] == ["You said: first", "You said: second"]
        # Telegram would have answered 409 to a second concurrent poller.
        assert fake.max_concurrent_get_updates == 1


async def test_three_webhook_replicas_give_one_reply_per_burst(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    rng = random.Random(7)
    chats = [5001, 5002, 5003, 5004]
    async with contextlib.AsyncExitStack() as stack:
        bots = [
            await stack.enter_async_context(webhook_bot(server, fake, short_dir / str(n)))
            for n in range(3)
        ]
        for chat in chats:
            for word in ("red", "green", "blue"):
                update = fake.private_text_update(chat, chat, f"{word}{chat}")
                targets = rng.sample(bots, 2 if rng.random() < 0.3 else 1)  # some redelivered
                for target in targets:
                    assert await target.post(update) == 200
        await fake.wait_for_sent(len(chats), timeout=20)

        await asyncio.gather(
            *(settled(redis, f"telegram:{chat}", version=3, within_s=10) for chat in chats)
        )
    replies = {m.chat_id: m.text for m in fake.sent_messages}
    assert len(fake.sent_messages) == len(chats)  # one reply per burst, none twice
    for chat in chats:
        assert replies[chat] == f"You said: red{chat} / green{chat} / blue{chat}"

"""Telegram when things fail: `lastword run` processes with the real adapter and
python-telegram-bot, against the loopback fake Bot API scripted to fail (flood control, bad
gateways, a webhook that cannot be deleted, chats that are gone or blocked the bot), with a
real Redis server. The replicas must stay up, keep polling, and never wedge a conversation."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from bot.service.app import make_store
from bot.store import BudgetKeys, Keys
from bot.store.embedded import EmbeddedRedis
from tests.support.factories import SettingsFactory
from tests.support.fakes.loopback import free_port
from tests.support.fakes.telegram_server import (
    FakeTelegram,
    RecordedCall,
    WebhookConfig,
    post_update,
)
from tests.support.running import START_S, Running
from tests.support.telegram_runs import CHAT, CONVERSATION, SECRET, bot_env, counters, sent_texts
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(45)

# Logged by the replica that takes the poller role, each time its polling starts.
POLLING = "this replica polls Telegram"
# Logged by the core when a role's work ended with an error and was handed back.
ROLE_FAILED = "role telegram:poller failed"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as telegram:
        yield telegram


@contextlib.asynccontextmanager
async def replicas(
    server: EmbeddedRedis, fake: FakeTelegram, envs: list[dict[str, str]]
) -> AsyncIterator[list[Running]]:
    """`lastword run` processes sharing one Redis, one per environment, logging at INFO."""
    bots: list[Running] = []
    try:
        for env in envs:
            bots.append(await Running.start(env))
        yield bots
    finally:
        for bot in bots:
            await bot.stop()


def polling_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, **extra: str
) -> dict[str, str]:
    return bot_env(server, fake, data_dir, LASTWORD_LOG_LEVEL="INFO", **extra)


def webhook_env(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, port: int
) -> dict[str, str]:
    return bot_env(
        server,
        fake,
        data_dir,
        LASTWORD_LOG_LEVEL="INFO",
        LASTWORD_TELEGRAM__MODE="webhook",
        LASTWORD_TELEGRAM__WEBHOOK_LISTEN=f"127.0.0.1:{port}",
        LASTWORD_TELEGRAM__WEBHOOK_SECRET=SECRET,
        LASTWORD_TELEGRAM__WEBHOOK_URL="https://bot.example/telegram",
    )


async def start_webhook(
    server: EmbeddedRedis, fake: FakeTelegram, data_dir: Path, stack: contextlib.AsyncExitStack
) -> tuple[Running, str]:
    """A webhook replica, once it has registered its webhook; and where to post to it."""
    port = free_port()
    registered = len(fake.calls_to("setWebhook"))
    env = webhook_env(server, fake, data_dir, port)
    [bot] = await stack.enter_async_context(replicas(server, fake, [env]))
    await fake.wait_for_calls("setWebhook", registered + 1, timeout=15)
    return bot, f"http://127.0.0.1:{port}/telegram"


async def health(port: int) -> tuple[int, str]:
    """/healthz: its status, and what it says of the adapter ("" when it does not answer)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
            http.get(f"http://127.0.0.1:{port}/healthz") as response,
        ):
            body = await response.json()
            return response.status, str(body["checks"]["adapter"])
    except aiohttp.ClientError:
        return 0, ""


def spacing(calls: list[RecordedCall]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(calls)]


async def test_polling_outlives_flood_control_then_bad_gateway_on_two_replicas(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    # From the first poll: 429 (retry after 1 s) for 5 s, then 502 for 5 s, then healthy.
    fake.fail_for("getUpdates", 5, fake.too_many_requests(1))
    fake.fail_for("getUpdates", 5, fake.server_error(502))
    ports = [free_port(), free_port()]
    envs = [
        polling_env(server, fake, short_dir / str(n), LASTWORD_METRICS_LISTEN=f"127.0.0.1:{port}")
        for n, port in enumerate(ports)
    ]
    async with replicas(server, fake, envs) as bots:
        await fake.wait_for_calls("getUpdates", 1, timeout=15)
        ids = [fake.push_update(fake.private_text_update(CHAT, CHAT, t)) for t in "abc"]
        await eventually(_polling(bots), within_s=5)
        [poller] = [bot for bot in bots if bot.said(POLLING)]
        port = ports[bots.index(poller)]

        async def reported_down() -> bool:
            return await health(port) == (503, "not connected")

        # While getUpdates keeps failing, /healthz says so.
        await eventually(reported_down, within_s=8)
        await fake.wait_for_sent(1, timeout=25)
        await fake.wait_for_confirmed(ids[-1], timeout=5)
        await settled(redis, CONVERSATION, within_s=5)

        async def reported_up() -> bool:
            return await health(port) == (200, "ok")

        await eventually(reported_up, within_s=5)
        assert [m.text for m in fake.sent_messages] == ["You said: a / b / c"]
        polls = fake.calls_to("getUpdates")
        flooded = [c for c in polls if c.status == 429]
        assert len(flooded) >= 3
        assert all(gap >= 1.0 for gap in spacing(flooded))  # retry_after was honoured
        assert any(c.status == 502 for c in polls)
        # The poll never died: one replica polled from start to end, without a handover.
        assert sum(bot.said(POLLING) for bot in bots) == 1
        assert not any(bot.said(ROLE_FAILED) for bot in bots)
        assert [bot.process.returncode for bot in bots] == [None, None]
        assert fake.max_concurrent_get_updates == 1


async def test_a_webhook_that_cannot_be_deleted_at_first_does_not_end_polling(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    # Left over from a webhook deployment: getUpdates is refused until it is deleted.
    fake.webhook = WebhookConfig("https://old.example/telegram", None, None, None, False)
    fake.fail_next("deleteWebhook", fake.too_many_requests(1), fake.server_error(500))
    async with replicas(server, fake, [polling_env(server, fake, short_dir)]) as [bot]:
        await fake.wait_for_calls("getUpdates", 1, timeout=15)
        deletes = fake.calls_to("deleteWebhook")
        assert [c.status for c in deletes] == [429, 500, 200]
        assert deletes[1].at - deletes[0].at >= 1.0  # retry_after was honoured
        fake.push_update(fake.private_text_update(CHAT, CHAT, "polling yet?"))
        assert await sent_texts(fake) == ["You said: polling yet?"]
        # Polling began only once the webhook was gone (Telegram would answer 409 before).
        assert all(c.status in (200, None) for c in fake.calls_to("getUpdates"))
        assert fake.calls_to("getUpdates")[0].at > deletes[-1].at
        # The failures were retried within the poll: its role was never handed back.
        assert bot.said(POLLING) == 1
        assert bot.said(ROLE_FAILED) == 0
        assert bot.process.returncode is None


async def test_an_unexpected_error_while_taking_a_webhook_update_answers_500_and_names_it(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    # A key of the wrong type makes ingest fail with WRONGTYPE, an error reply nobody
    # classified (so not the store-down 503 path).
    garbage = Keys(CONVERSATION).seen
    await redis.set(garbage, "not a sorted set")
    async with contextlib.AsyncExitStack() as stack:
        bot, url = await start_webhook(server, fake, short_dir, stack)
        update = fake.private_text_update(CHAT, CHAT, "anyone?")
        message_id = update["message"]["message_id"]
        assert await post_update(url, update, SECRET) == 500
        assert bot.said(f"message {message_id} of {CONVERSATION} could not be stored") == 1
        assert await counters(redis) == (0, 0)
        await redis.delete(garbage)
        # Telegram delivers it again, as it does after any 5xx.
        assert await post_update(url, update, SECRET) == 200
        assert await sent_texts(fake) == ["You said: anyone?"]
        assert bot.process.returncode is None


async def test_two_edits_within_one_second_are_both_taken_in(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        _, url = await start_webhook(server, fake, short_dir, stack)
        original = fake.private_text_update(CHAT, CHAT, "helo")
        message_id = original["message"]["message_id"]
        first = fake.edited_update(CHAT, CHAT, "hello", message_id=message_id)
        second = fake.edited_update(CHAT, CHAT, "hello there", message_id=message_id)
        # Telegram's edit_date has whole seconds: two quick edits carry the same one.
        second["edited_message"]["edit_date"] = first["edited_message"]["edit_date"]
        for update in (original, first, second, second):  # the last one redelivered
            assert await post_update(url, update, SECRET) == 200
        await fake.wait_for_sent(1, timeout=10)
        await settled(redis, CONVERSATION, within_s=5)
        assert await counters(redis) == (3, 3)
        [reply] = fake.sent_messages
        assert reply.text == "You said: helo / (edited) hello / (edited) hello there"


async def test_a_chat_that_is_not_found_gives_the_reply_up_and_the_next_message_is_answered(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    fake.fail_chat(CHAT, fake.chat_not_found())
    async with contextlib.AsyncExitStack() as stack:
        bot, url = await start_webhook(server, fake, short_dir, stack)
        assert await post_update(url, fake.private_text_update(CHAT, CHAT, "hi?"), SECRET) == 200
        # Given up at the first refusal, not retried for minutes: the conversation moves on.
        await settled(redis, CONVERSATION, within_s=10)
        await eventually(_said(bot, f"gave up the reply to {CONVERSATION}"), within_s=5)
        assert [c.status for c in fake.calls_to("sendMessage")] == [400]
        fake.fail_chat(CHAT, None)
        assert await post_update(url, fake.private_text_update(CHAT, CHAT, "now?"), SECRET) == 200
        assert await sent_texts(fake) == ["You said: now?"]
        await settled(redis, CONVERSATION, within_s=5)  # committed after the send
        assert await counters(redis) == (2, 2)


async def test_flood_control_of_two_minutes_holds_its_chat_and_the_reply_is_not_pushed(
    server: EmbeddedRedis,
    redis: Redis,
    fake: FakeTelegram,
    short_dir: Path,
    make_settings: SettingsFactory,
) -> None:
    fake.fail_next("sendMessage", fake.too_many_requests(120))
    async with contextlib.AsyncExitStack() as stack:
        _, url = await start_webhook(server, fake, short_dir, stack)
        assert await post_update(url, fake.private_text_update(CHAT, CHAT, "hey"), SECRET) == 200
        await fake.wait_for_calls("sendMessage", 1, timeout=START_S)
        store = make_store(make_settings(), redis)

        async def held() -> dict[str, int]:
            return await store.held(BudgetKeys("telegram"))

        # Every replica holds the chat for the two minutes Telegram asked for (one chat's 429 is
        # that chat's: the others are not held); the reply waits in its outbox (a bot that
        # keeps pushing is banned for longer).
        holds = await eventually(held, within_s=5, what="the flood control held in the store")
        chat = f"chat:{CHAT}"
        assert set(holds) == {chat} and 100_000 < holds[chat] <= 120_000
        with contextlib.suppress(TimeoutError):
            await fake.wait_for_calls("sendMessage", 2, timeout=3)
        assert [c.status for c in fake.calls_to("sendMessage")] == [429]
        assert await redis.hget(Keys(CONVERSATION).outbox, "text") == b"You said: hey"


async def test_a_user_who_unblocked_the_bot_is_answered_by_a_replica_that_saw_the_block(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    state = Keys(CONVERSATION).state
    fake.fail_chat(CHAT, fake.forbidden_blocked())
    async with contextlib.AsyncExitStack() as stack:
        a, a_url = await start_webhook(server, fake, short_dir / "a", stack)
        assert await post_update(a_url, fake.private_text_update(CHAT, CHAT, "bye"), SECRET) == 200
        # Replica A learns of the block; the mark is in the store, for every replica.
        await settled(redis, CONVERSATION, within_s=10)
        assert [c.status for c in fake.calls_to("sendMessage")] == [403]
        assert await redis.hget(state, "unreachable") == b"1"
        await eventually(_said(a, f"{CONVERSATION} cannot be reached"), within_s=5)

        # The user unblocks the bot and writes again; the message reaches replica B, which
        # crashes before its cycle. A finishes the conversation and must really send.
        fake.fail_chat(CHAT, None)
        b, b_url = await start_webhook(server, fake, short_dir / "b", stack)
        back = fake.private_text_update(CHAT, CHAT, "back")
        assert await post_update(b_url, back, SECRET) == 200
        await b.kill()
        assert await redis.hget(state, "unreachable") is None
        assert await sent_texts(fake) == ["You said: back"]
        await settled(redis, CONVERSATION, within_s=5)
        assert await counters(redis) == (2, 2)
        assert a.process.returncode is None


def _said(bot: Running, text: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bot.said(text) > 0

    return check


def _polling(bots: list[Running]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return sum(bot.said(POLLING) for bot in bots) > 0

    return check

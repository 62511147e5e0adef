"""Every burst ends in one reply (issue 19): a reply that cannot be written however often it
is tried ends with an apology that says what went wrong, committed like any reply, and the
next message is answered afresh. Admin commands answer misuse with their usage line, and
carry out a change only once the reply announcing it has passed the pre-send check.

The runtime runs in this process over the real store; the failures are real ones: a key the
server holds in the wrong type answers WRONGTYPE to every attempt, as a store damaged by hand
or by another program would."""

from __future__ import annotations

import html
import logging
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from bot.blame import SOMETHING
from bot.commands import admin
from bot.llm.echo import EchoLLM
from bot.store import Keys
from bot.store.keys import ACCESS_KEY
from tests.support.builders import message
from tests.support.chatting import fake
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI
from tests.support.waits import eventually, settled
from tests.support.world import World

__all__ = ["fake"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.timeout(60)

CONV = "test:1"
ADMIN = "u1"


def day_key() -> str:
    return Keys(CONV).day(datetime.now(UTC).date())


async def test_a_reply_that_fails_every_time_ends_in_one_apology_and_the_next_is_answered(
    runtime_factory: RuntimeFactory, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The day's token count in the wrong type: reading the user's spending fails each time.
    await redis.set(day_key(), "not a hash")
    runtime, outbound = await runtime_factory()
    caplog.set_level(logging.WARNING, logger="bot.core.cycle")
    await runtime.ingest(message(n=1))
    await runtime.ingest(message(n=2))
    [apology] = await outbound.wait_for(1, timeout=20)
    await settled(runtime, CONV, version=2)
    assert apology.text.startswith("Sorry, I couldn't answer your last messages")
    assert SOMETHING in apology.text and "WRONGTYPE" not in apology.text
    stats = runtime.stats
    assert (stats.given_up, stats.failed) == (1, 2)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "after 3 attempts" in errors[0].getMessage()
    assert "WRONGTYPE" in errors[0].getMessage()
    # The apology is history like any reply: the burst is answered, and the next is new.
    history = await runtime.store.history(CONV)
    assert [e.role for e in history] == ["user", "user", "assistant"]

    await redis.delete(day_key())
    await runtime.ingest(message(n=3))
    await outbound.wait_for(2)
    await settled(runtime, CONV, version=3)
    assert outbound.texts()[1] == "You said: text 3"


async def test_one_attempt_gives_up_at_once(runtime_factory: RuntimeFactory, redis: Redis) -> None:
    await redis.set(day_key(), "not a hash")
    runtime, outbound = await runtime_factory(llm={"provider": "echo", "attempts": 1})
    await runtime.ingest(message(n=1))
    [apology] = await outbound.wait_for(1)
    assert apology.text.startswith("Sorry, I couldn't answer your last message:")
    assert (runtime.stats.given_up, runtime.stats.failed) == (1, 0)


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        ("/budget 42 ²", admin.USAGE["budget"]),
        ("/budget 42 " + "9" * 400, admin.USAGE["budget"]),
        ("/budget 42 -5", admin.USAGE["budget"]),
        ("/budget 42", admin.USAGE["budget"]),
        ("/budget ² 5", admin.USAGE["budget"]),
        ("/allow", admin.USAGE["allow"]),
        ("/allow 4²", admin.USAGE["allow"]),
        ("/deny 42 43", admin.USAGE["deny"]),
        ("/deny " + "7" * 65, admin.USAGE["deny"]),
        ("/stats today", admin.USAGE["stats"]),
    ],
)
async def test_admin_misuse_is_answered_with_the_usage_line_and_changes_nothing(
    runtime_factory: RuntimeFactory, redis: Redis, command: str, answer: str
) -> None:
    runtime, outbound = await runtime_factory(access={"rate_per_minute": 0, "admins": [ADMIN]})
    await runtime.ingest(message(command, n=1))
    [reply] = await outbound.wait_for(1)
    assert reply.text.startswith(answer)
    await settled(runtime, CONV, version=1)
    assert await redis.hlen(ACCESS_KEY) == 0
    await runtime.ingest(message(n=2))
    await outbound.wait_for(2)
    assert outbound.texts()[1] == "You said: text 2"


async def test_a_budget_in_range_is_applied_and_announced(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime, outbound = await runtime_factory(access={"rate_per_minute": 0, "admins": [ADMIN]})
    await runtime.ingest(message("/budget 42 1000000000000", n=1))
    [reply] = await outbound.wait_for(1)
    assert reply.text == "Done: 42 may spend 1,000,000,000,000 tokens a day from now on."
    spending = await runtime.store.spending("test:42", "42")
    assert spending.budget == 10**12


async def test_an_admin_change_waits_for_the_reply_that_announces_it_to_pass_the_check(
    runtime_factory: RuntimeFactory, redis: Redis
) -> None:
    runtime, outbound = await runtime_factory(
        access={"rate_per_minute": 0, "admins": [ADMIN]}, model=EchoLLM(delay_ms=3000)
    )
    await runtime.ingest(message("/deny 200", n=1))
    await runtime.ingest(message("and tell me a joke", n=2))

    # The reply is being written (the model is thinking): nothing is changed yet.
    async def generating() -> bool:
        return runtime.cycles_running > 0 and runtime.stats.cycles > 0

    async def interrupted() -> bool:
        return runtime.stats.interrupted == 1

    await eventually(generating, within_s=10)
    assert await redis.hget(ACCESS_KEY, "200") is None
    # A newer message makes that reply stale: it is dropped, and its change with it.
    await runtime.ingest(message("and a second one", n=3))
    await eventually(interrupted, within_s=5)
    assert await redis.hget(ACCESS_KEY, "200") is None
    # The one reply that goes out announces the change, and it is in force.
    [reply] = await outbound.wait_for(1, timeout=20)
    assert reply.text.startswith("Done: I refuse 200's messages from now on.")
    assert "a second one" in reply.text
    record = await redis.hget(ACCESS_KEY, "200")
    assert record is not None and b'"deny"' in record


async def test_budget_misuse_through_a_real_replica_is_answered_and_so_is_what_follows(
    world: World,
) -> None:
    """The issue's case end to end: `lastword run` on Telegram, the OpenAI client on the fake
    provider. `/budget 42 ²` once failed the cycle on every attempt, silencing the admin."""
    telegram, provider = world.telegram, world.provider
    chat = 100
    async with world.bot(LASTWORD_ACCESS__ADMINS=str(chat)) as bot:
        await bot.post(telegram.private_text_update(chat, chat, "/budget 42 ²"))
        [reply] = await telegram.wait_for_sent(1, timeout=15)
        assert html.unescape(reply.text or "") == admin.USAGE["budget"]
        await settled(world.redis, f"telegram:{chat}", version=1)
        await bot.post(telegram.private_text_update(chat, chat, "/budget 42 " + "9" * 400))
        await bot.post(telegram.private_text_update(chat, chat, "still there?"))
        second = (await telegram.wait_for_sent(2, timeout=15))[1]
        await settled(world.redis, f"telegram:{chat}", version=3)
        assert bot.running.process.returncode is None
    assert html.unescape(second.text or "").startswith(admin.USAGE["budget"])
    assert "still there?" in (second.text or "")
    assert [r.last_user_text for r in provider.requests] == ["still there?"]
    assert await world.redis.hlen(ACCESS_KEY) == 0


async def test_outages_are_not_attempts(
    runtime_factory: RuntimeFactory, redis: Redis, fake: FakeOpenAI
) -> None:
    # LASTWORD_LLM__ATTEMPTS=3 counts failed attempts: two outages (Redis out of memory, each
    # once the reply was written) then one error are one failed attempt, and the burst is
    # answered, not given up on.
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "attempts": 3}
    # A lease that outlives the outage: it cannot be renewed while writes are refused.
    runtime, outbound = await runtime_factory(llm=llm, lease={"ttl_ms": 10_000})

    async def handed_back(failed: int) -> None:
        async def released() -> bool:
            return runtime.stats.failed >= failed and not await redis.exists(Keys(CONV).lease)

        await eventually(released, within_s=10, what=f"attempt {failed} handed back")

    fake.hold()
    await runtime.ingest(message(n=1))
    try:
        for outage in (1, 2):
            # The reply to the burst is being written (the request before it has finished).
            await fake.wait_for_request(lambda r: not r.finished)
            # Every write that adds data is refused with OOM: the pre-send check's is.
            await redis.config_set("maxmemory", 1)
            fake.release()
            fake.hold()
            await handed_back(outage)
            await redis.config_set("maxmemory", 0)
        fake.release()
        # Then an error that is no outage: the user's spending cannot be read.
        await redis.set(day_key(), "not a hash")
        await handed_back(3)
        await redis.delete(day_key())
    finally:
        await redis.config_set("maxmemory", 0)
        fake.release()
    [reply] = await outbound.wait_for(1, timeout=30)
    await settled(runtime, CONV, version=1)
    assert reply.text == "You said: text 1"
    assert (runtime.stats.given_up, runtime.stats.failed) == (0, 3)


async def test_a_commit_that_fails_for_good_is_logged_once_and_the_conversation_moves_on(
    runtime_factory: RuntimeFactory, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The tool record damaged by hand: every commit of a sent reply fails on it (WRONGTYPE),
    # however often it is retried, while the lease would renew for ever.
    await redis.set(Keys(CONV).tools, "damaged by hand")
    runtime, outbound = await runtime_factory()
    caplog.set_level(logging.WARNING, logger="bot.core.cycle")
    await runtime.ingest(message(n=1))
    await outbound.wait_for(1)
    await settled(runtime, CONV, version=1)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "failed for good" in errors[0].getMessage()
    assert runtime.stats.commits_failed == 1
    # Settled: nothing is left to send again, and nothing is owed.
    assert not await redis.exists(Keys(CONV).outbox, Keys(CONV).lease)

    await runtime.ingest(message(n=2))
    await outbound.wait_for(2)
    await settled(runtime, CONV, version=2)
    assert outbound.texts() == ["You said: text 1", "You said: text 2"]
    assert runtime.stats.commits_failed == 2

"""A written reply waits in its outbox (SPEC I9): a runtime against the fake provider, its
platform limited and held by a 429, over the real store (bot/core/cycle.py `_turn`).

Through a hold the reply is kept and generated once; a newer message from the user still
supersedes it (one new reply covers both); a reply that waited longer than
`outbound.max_reply_age_s` is dropped in one log line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.core.runtime import Runtime
from bot.store import Keys
from tests.support.builders import message
from tests.support.chatting import CONV
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.paced_platform import Platform
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(60)

HOLD_S = 2.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        server.reply = lambda request: f"re: {request.last_user_text}"
        yield server


async def started(
    runtime_factory: RuntimeFactory, make_settings: SettingsFactory, fake: FakeOpenAI, **extra: Any
) -> tuple[Runtime, RecordingOutbound]:
    """A runtime answering through `fake`, its platform limited (`Platform`)."""
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0}
    interrupt = {"interrupt": extra.pop("interrupt")} if "interrupt" in extra else {}
    settings = make_settings(llm=llm | {"model": FAKE_MODEL_ID} | interrupt, **extra)
    return await runtime_factory(settings, outbound=Platform())


async def one_then_two_while_held(runtime: Runtime, redis: Redis) -> None:
    """The bot held by a 429; "one", and once its reply waits in the outbox, "two"; settled."""
    await runtime.outbound.throttled("bot", HOLD_S)
    assert await runtime.ingest(message("one", n=1))

    async def waiting() -> bool:
        return await redis.hget(Keys(CONV).outbox, "text") is not None

    await eventually(waiting, within_s=HOLD_S, what="the first reply in its outbox")
    assert await runtime.ingest(message("two", n=2))
    await settled(runtime, CONV, version=2)


async def test_a_reply_held_by_a_429_waits_in_its_outbox_and_is_generated_once(
    runtime_factory: RuntimeFactory, make_settings: SettingsFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    runtime, platform = await started(runtime_factory, make_settings, fake)
    await runtime.outbound.throttled("bot", HOLD_S)
    assert await runtime.ingest(message("hello", n=1))

    async def in_the_outbox() -> bytes | str | None:
        return await redis.hget(Keys(CONV).outbox, "text")

    # Written, checked and kept while the platform holds the bot; nothing sent meanwhile.
    text = await eventually(in_the_outbox, within_s=HOLD_S, what="the reply in its outbox")
    assert text == b"re: hello"
    assert platform.sent == []
    await settled(runtime, CONV)
    assert platform.texts() == ["re: hello"]
    assert len(fake.requests) == 1


async def test_a_newer_message_supersedes_a_reply_waiting_its_turn(
    runtime_factory: RuntimeFactory, make_settings: SettingsFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    runtime, platform = await started(runtime_factory, make_settings, fake)
    await one_then_two_while_held(runtime, redis)
    # One reply, to both: the one written for "one" never went out.
    assert len(platform.sent) == 1
    assert runtime.stats.discarded == 1
    assert fake.requests[-1].last_user_text.endswith("two")
    assert "one" in json.dumps(fake.requests[-1].messages)
    assert len(fake.requests) == 2


async def test_a_reply_that_waited_past_its_age_is_dropped_in_one_line(
    runtime_factory: RuntimeFactory,
    make_settings: SettingsFactory,
    fake: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0}
    settings = make_settings(llm=llm | {"model": FAKE_MODEL_ID}, outbound={"max_reply_age_s": 0.5})
    runtime, platform = await runtime_factory(settings, outbound=Platform())
    await runtime.outbound.throttled("bot", HOLD_S)
    with caplog.at_level(logging.INFO):
        assert await runtime.ingest(message("hello", n=1))
        await settled(runtime, CONV)
    assert platform.sent == []
    dropped = [r for r in caplog.records if "dropped the reply" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info]
    assert len(fake.requests) == 1


async def test_with_interrupts_off_a_reply_that_waited_is_checked_again_before_it_goes(
    runtime_factory: RuntimeFactory, make_settings: SettingsFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    # Nothing watches the conversation while the reply waits: the pre-send check made again
    # once its turn has come is what finds the newer message.
    runtime, platform = await started(runtime_factory, make_settings, fake, interrupt=False)
    await one_then_two_while_held(runtime, redis)
    assert len(platform.sent) == 1
    assert platform.sent[0].text == fake.reply(fake.requests[-1])
    assert fake.requests[-1].last_user_text.endswith("two")

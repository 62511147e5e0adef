"""Commands (/start, /help, /reset) and access control (allow-list, per-user rate limit),
shared by every platform: in-process against the real store and the loopback fake model."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.app import make_store
from bot.commands import HELP, RATE_LIMITED, REFUSAL, RESET, START, command_of, plan
from bot.llm import OpenAILLM
from bot.message import Attachment, InboundMessage
from bot.runtime import Runtime
from bot.settings import Settings
from tests.conftest import SettingsFactory
from tests.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.fakes.outbound import RecordingOutbound

CONV = "test:1"


def message(n: int, text: str, user: str = "u1") -> InboundMessage:
    return InboundMessage("test", "1", user, f"m{n}", text)


@contextlib.asynccontextmanager
async def bot(
    make_settings: SettingsFactory, redis: Redis, **overrides: Any
) -> AsyncIterator[tuple[Runtime, RecordingOutbound, FakeOpenAI]]:
    async with FakeOpenAI() as fake:
        llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0}
        settings: Settings = make_settings(llm=llm | {"model": FAKE_MODEL_ID}, **overrides)
        outbound = RecordingOutbound()
        model = OpenAILLM(settings.llm)
        runtime = Runtime(settings, make_store(settings, redis), model, outbound)
        runtime.start()
        try:
            yield runtime, outbound, fake
        finally:
            await runtime.stop()
            await model.client.close()


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("/start", "start"),
        ("/help", "help"),
        ("  /RESET now", "reset"),
        ("/reset@LastwordBot", "reset"),
        ("/unknown", None),
        ("/", None),
        ("reset", None),
        ("a /reset in the middle", None),
    ],
)
def test_command_names(text: str, name: str | None) -> None:
    assert command_of(text) == name


def test_plan_drops_what_came_before_the_last_reset() -> None:
    burst = [message(i, t) for i, t in enumerate(["a", "/reset", "b", "/help", "/reset", "c"])]
    result = plan(watermark=10, unanswered=burst)
    assert result.reset == 15  # the second /reset is version 10 + 5
    assert result.answers == (RESET,)
    assert [m.text for m in result.for_model] == ["c"]
    keep = plan(watermark=0, unanswered=[message(1, "/help"), message(2, "x")])
    assert (keep.reset, keep.answers, [m.text for m in keep.for_model]) == (0, (HELP,), ["x"])


async def test_start_and_help_answer_without_the_model(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    async with bot(make_settings, redis) as (runtime, outbound, fake):
        assert await runtime.ingest(message(1, "/start"))
        assert await runtime.ingest(message(2, "/help"))
        await runtime.settled(CONV)
        assert outbound.texts() == [START + "\n\n" + HELP]
        assert fake.requests == []
        assert await runtime.store.counters(CONV) == (2, 2)  # commands advance W too


async def test_reset_empties_history_and_drops_the_burst_before_it(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    async with bot(make_settings, redis) as (runtime, outbound, fake):
        assert await runtime.ingest(message(1, "remember the word apple"))
        await runtime.settled(CONV)
        assert len(await runtime.store.history(CONV)) == 2

        for n, text in [(2, "forget this"), (3, "/reset"), (4, "what word?")]:
            assert await runtime.ingest(message(n, text))
        await runtime.settled(CONV)

        assert outbound.texts()[-1] == RESET + "\n\nYou said: what word?"
        last = fake.requests[-1]
        # Nothing from before the reset reached the model: no history, no "forget this".
        assert [m["role"] for m in last.messages] == ["system", "user"]
        assert last.last_user_text == "what word?"
        history = await runtime.store.history(CONV)
        assert [(h.role, h.version, h.text) for h in history] == [
            ("user", 4, "what word?"),
            ("assistant", 4, RESET + "\n\nYou said: what word?"),
        ]
        assert await runtime.store.counters(CONV) == (4, 4)


async def test_allow_list_refuses_once_and_never_reaches_the_model(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    access = {"allowed_users": ["friend"]}
    async with bot(make_settings, redis, access=access) as (runtime, outbound, fake):
        assert not await runtime.ingest(message(1, "hello?", user="stranger"))
        assert not await runtime.ingest(message(2, "hello??", user="stranger"))
        assert outbound.texts() == [REFUSAL]
        assert await runtime.store.counters(CONV) == (0, 0)

        assert await runtime.ingest(message(3, "hi", user="friend"))
        await runtime.settled(CONV)
        assert outbound.texts() == [REFUSAL, "You said: hi"]
        assert [r.last_user_text for r in fake.requests] == ["hi"]


async def test_rate_limit_drops_the_excess_with_one_notice(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    async with bot(make_settings, redis, access={"rate_per_minute": 3}) as (
        runtime,
        outbound,
        fake,
    ):
        accepted = [await runtime.ingest(message(n, f"text {n}")) for n in range(1, 7)]
        assert accepted == [True, True, True, False, False, False]
        # A redelivery of an accepted message is still just a duplicate, not counted.
        assert not await runtime.ingest(message(1, "text 1"))
        await runtime.settled(CONV)
        [request] = fake.requests
        prompt = request.last_user_text
        assert 0 <= prompt.index("text 1") < prompt.index("text 2") < prompt.index("text 3")
        assert "text 4" not in prompt
        assert outbound.texts() == [RATE_LIMITED, "You said: " + prompt]
        assert await runtime.store.counters(CONV) == (3, 3)


def test_allowed_users_read_from_a_comma_separated_variable(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_settings()  # clears LASTWORD_* from the environment for this test
    monkeypatch.setenv("LASTWORD_ACCESS__ALLOWED_USERS", "12, 34,,56")
    monkeypatch.setenv("LASTWORD_ACCESS__RATE_PER_MINUTE", "0")
    access = Settings().access
    assert access.allowed_users == ["12", "34", "56"]
    assert access.rate_per_minute == 0


async def test_the_model_is_told_it_cannot_see_attachments(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    async with bot(make_settings, redis) as (runtime, _, fake):
        sticker = InboundMessage(
            "test", "1", "u1", "m1", "", attachments=(Attachment("sticker", "file-1"),)
        )
        assert await runtime.ingest(sticker)
        assert await runtime.ingest(message(2, "plain words"))
        await runtime.settled(CONV)
        assert await runtime.ingest(message(3, "no media now"))
        await runtime.settled(CONV)
    with_media, without = fake.requests
    assert "cannot see" in with_media.messages[0]["content"]
    assert "[sticker]" in with_media.last_user_text
    assert "cannot see" not in without.messages[0]["content"]

"""Who turns memory off: the operator for everyone (`LASTWORD_MEMORY__ENABLED=false`), a person
for themselves (`/memory off`). Off means off: no facts in the request, no memory tool offered,
`/remember` refused and said so, and for the operator's switch nothing read or kept at all."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from bot.commands.memory import OFF_FOR_YOU, OFF_HERE
from bot.memory.tool import NAME
from bot.store.keys import PersonKeys
from tests.support.chatting import fake, say
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)

KEY = PersonKeys("test", "u1").memory


def llm(fake: FakeOpenAI) -> dict[str, Any]:
    return {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0} | {
        "model": FAKE_MODEL_ID
    }


async def test_a_person_turns_their_memory_off_and_on(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    runtime, outbound = await runtime_factory(llm=llm(fake))
    await say(runtime, 1, "/remember I like tea")
    await say(runtime, 2, "hello")
    assert "I like tea" in fake.requests[-1].last_user_text
    assert NAME in fake.requests[-1].tool_names
    await say(runtime, 3, "/memory off")
    await say(runtime, 4, "hello again")
    assert "I like tea" not in fake.requests[-1].last_user_text
    assert NAME not in fake.requests[-1].tool_names
    await say(runtime, 5, "/remember I like coffee")
    assert outbound.texts()[-1] == OFF_FOR_YOU
    await say(runtime, 6, "/memory on")
    await say(runtime, 7, "and now?")
    assert "I like tea" in fake.requests[-1].last_user_text
    assert "I like coffee" not in fake.requests[-1].last_user_text


async def test_the_operator_turns_memory_off_for_everyone(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    runtime, outbound = await runtime_factory(llm=llm(fake), memory={"enabled": False})
    await say(runtime, 1, "/remember I like tea")
    assert outbound.texts()[-1] == OFF_HERE
    await say(runtime, 2, "/memory")
    assert outbound.texts()[-1] == OFF_HERE
    await say(runtime, 3, "hello")
    assert NAME not in fake.requests[-1].tool_names
    assert "<memory>" not in fake.requests[-1].last_user_text
    assert "memory" not in fake.requests[-1].messages[0]["content"].lower()
    await say(runtime, 4, "/start")
    assert "remember" not in outbound.texts()[-1]
    assert not await redis.exists(KEY)

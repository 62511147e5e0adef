"""/persona across replicas: two runtimes on one real server. Instructions set on one replica
are in the system prompt of the other's next answer (and of the rest of the burst that set
them); `/persona` shows them, `/persona off` removes them, and one over the limit is refused
and changes nothing."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from bot.commands.persona import NONE, TURNED_OFF
from bot.llm.prompt import PERSONA_INTRO
from bot.store import Keys
from tests.support.chatting import CONV, fake, replica, say
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI

__all__ = ["fake"]  # the fixture, imported for pytest

# The setting's default, LASTWORD_LLM__PERSONA_CHARS.
PERSONA_CHARS = 1000
PIRATE = "Answer like a pirate,\nin two lines at most."

pytestmark = pytest.mark.timeout(60)


def system_of(fake: FakeOpenAI) -> str:
    return str(fake.requests[-1].messages[0]["content"])


async def test_a_persona_set_on_one_replica_is_followed_by_another(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    a, chat = await replica(runtime_factory, fake)
    b, _ = await replica(runtime_factory, fake, chat)
    await say(a, 1, "/persona")
    assert chat.texts() == [NONE]

    # The rest of the burst that sets it already follows it.
    await say(a, 2, f"/persona {PIRATE}", "hello")
    assert system_of(fake).endswith(f"{PERSONA_INTRO}\n{PIRATE}")

    await say(b, 4, "and now?")
    assert system_of(fake).endswith(f"{PERSONA_INTRO}\n{PIRATE}")
    await say(b, 5, "/persona")
    assert chat.texts()[-1] == f"Your persona:\n{PIRATE}"

    await say(a, 6, "/persona off")
    await say(b, 7, "plain again?")
    assert PERSONA_INTRO not in system_of(fake)
    assert len(fake.requests) == 3  # the commands alone never reached the model


async def test_a_persona_over_the_limit_is_refused_and_changes_nothing(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    a, out = await replica(runtime_factory, fake)
    await say(a, 1, "/persona Be brief.")
    await say(a, 2, "/persona " + "x" * (PERSONA_CHARS + 1))
    assert out.texts()[-1] == (
        f"A persona can be at most {PERSONA_CHARS:,} characters; yours has {PERSONA_CHARS + 1:,}."
    )
    assert await redis.hget(Keys(CONV).state, "persona") == b"Be brief."
    await say(a, 3, "/persona " + "y" * PERSONA_CHARS)
    assert await redis.hget(Keys(CONV).state, "persona") == b"y" * PERSONA_CHARS


async def test_a_limit_of_zero_turns_persona_off(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    a, out = await replica(runtime_factory, fake, persona_chars=0)
    await say(a, 1, "/persona Be brief.", "hello")
    # The command's answer, then the model's to the rest of the burst, in one reply.
    assert out.texts()[0].startswith(TURNED_OFF + "\n")
    assert await redis.hget(Keys(CONV).state, "persona") is None
    assert PERSONA_INTRO not in system_of(fake)

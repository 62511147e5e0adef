"""Another memory provider, plugged in as a third party would: tests/plugins/
lastword_notebook_memory declares one in the `lastword.memory` group, and
`LASTWORD_MEMORY__PROVIDER=notebook` picks it. The core writes and reads through it alone:
nothing of the person's memory is kept in lastword's store."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.memory import Person
from bot.store.keys import PersonKeys
from tests.support.chatting import fake, say
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


async def test_a_provider_installed_as_a_plugin_keeps_the_facts(
    runtime_factory: RuntimeFactory,
    fake: FakeOpenAI,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    llm = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0}
    runtime, outbound = await runtime_factory(
        llm=llm | {"model": FAKE_MODEL_ID}, memory={"provider": "notebook"}
    )
    notebook = runtime.cycle.memory
    assert type(notebook).__module__ == "lastword_notebook_memory"
    await say(runtime, 1, "/remember I like tea")
    assert outbound.texts()[-1].startswith("Done: I'll remember that")
    assert [f.text for f in (await notebook.recall(Person("test", "u1"))).facts] == ["I like tea"]
    assert not await redis.exists(PersonKeys("test", "u1").memory)
    await say(runtime, 2, "what do I like?")
    assert "I like tea" in fake.requests[-1].last_user_text

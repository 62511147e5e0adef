"""Fixtures of the commands tests: the fake provider and a runtime started on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.core.runtime import Runtime
from tests.support.commands import Start
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def bot(fake: FakeOpenAI, runtime_factory: RuntimeFactory) -> Start:
    """Starts a runtime whose model is the fake; keyword arguments override settings."""

    async def start(
        llm: dict[str, Any] | None = None, **overrides: Any
    ) -> tuple[Runtime, RecordingOutbound]:
        model = {"provider": "openai", "base_url": fake.base_url, "api_key": "k", "retries": 0}
        model |= {"model": FAKE_MODEL_ID} | (llm or {})
        return await runtime_factory(llm=model, **overrides)

    return start

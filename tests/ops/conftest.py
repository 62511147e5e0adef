"""Fixtures of the operations tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fakes.openai_server import FakeOpenAI


@pytest.fixture
async def openai_fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake

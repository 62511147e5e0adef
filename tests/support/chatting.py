"""What tests that talk to the fake provider share: the fake OpenAI server as a fixture, a
runtime that talks to it (one per replica, all on the test's real Redis server), and `say`,
which sends a numbered burst and waits until it is answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.core.runtime import Runtime
from bot.tools import Toolbox
from bot.traces import Tracing
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.waits import settled

CONV = "test:1"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def replica(
    runtime_factory: RuntimeFactory,
    fake: FakeOpenAI,
    outbound: RecordingOutbound | None = None,
    toolbox: Toolbox | None = None,
    lease_ttl_ms: int | None = None,
    tracing: Tracing | None = None,
    **llm: Any,
) -> tuple[Runtime, RecordingOutbound]:
    """A runtime answering through `fake`; `llm` adds or overrides LLM settings. Replicas given
    one `outbound` share it as they share a platform: whichever of them takes a burst's wake-up
    (its own timer, or another's sweep) answers it, and the user sees one chat. Its tools are
    `toolbox`'s; its lease lasts the tests' short TTL unless `lease_ttl_ms` says otherwise; its
    traces go to `tracing` (else nowhere)."""
    base: dict[str, Any] = {"provider": "openai", "base_url": fake.base_url, "api_key": "k"}
    base |= {"model": FAKE_MODEL_ID, "retries": 0}
    overrides: dict[str, Any] = {"llm": base | llm}
    if lease_ttl_ms is not None:
        overrides["lease"] = {"ttl_ms": lease_ttl_ms}
    return await runtime_factory(outbound=outbound, toolbox=toolbox, tracing=tracing, **overrides)


async def say(runtime: Runtime, n: int, *texts: str) -> None:
    """Send a burst to `CONV`, numbered from `n`, and wait for its reply."""
    for i, text in enumerate(texts):
        assert await runtime.ingest(message(text, n=n + i))
    await settled(runtime, CONV)

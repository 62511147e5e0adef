"""What a given-up reply's apology says went wrong comes from the error itself (`bot.blame`):
the area it left first names it, whatever module raised it.

- an error leaving two areas is the inner one's; one no area claimed is "something";
- the model's client, the transcriber and the commands each name their own errors, through a
  real call to the loopback fake provider, and a command that fails every attempt is
  apologised for as a command.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import SecretStr
from redis.asyncio import Redis

from bot.blame import COMMAND, FILES, MODEL, SOMETHING, VOICE, blamed, cause_of
from bot.config.settings import LLMSettings, MediaSettings
from bot.llm.base import Usage
from bot.llm.openai import OpenAILLM
from bot.llm.prompt import Prompt
from bot.llm.transcribe import OpenAITranscriber
from bot.store.keys import Keys
from tests.support.builders import message
from tests.support.chatting import fake
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, ScriptedError
from tests.support.waits import settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

BROKEN = ScriptedError(400, {"error": {"message": "no such thing", "type": "invalid_request"}})


def test_the_first_area_an_error_leaves_names_it() -> None:
    with pytest.raises(KeyError) as raised, blamed(FILES), blamed(VOICE):
        raise KeyError("x")
    assert cause_of(raised.value) == VOICE


def test_an_error_no_area_claimed_is_something() -> None:
    assert cause_of(ValueError("x")) == SOMETHING


async def test_the_models_errors_are_the_ai_services(fake: FakeOpenAI) -> None:
    llm = OpenAILLM(LLMSettings(base_url=fake.base_url, api_key=SecretStr("k"), retries=0))
    fake.fail_next(BROKEN)
    try:
        with pytest.raises(Exception) as raised:
            await llm.complete(Prompt("sys", (), ("hi",)), Usage())
    finally:
        await llm.close()
    assert cause_of(raised.value) == MODEL


async def test_a_transcriptions_errors_are_the_voice_notes(fake: FakeOpenAI) -> None:
    llm = LLMSettings(base_url=fake.base_url, api_key=SecretStr("k"), retries=0)
    transcriber = OpenAITranscriber(MediaSettings(), llm)
    fake.fail_next_transcription(BROKEN)
    try:
        with pytest.raises(Exception) as raised:
            await transcriber.transcribe(b"OggS" + bytes(60), "voice.ogg", "audio/ogg")
    finally:
        await transcriber.client.close()
    assert cause_of(raised.value) == VOICE


async def test_a_command_that_fails_every_attempt_is_apologised_for_as_a_command(
    runtime_factory: RuntimeFactory, redis: Redis
) -> None:
    runtime, outbound = await runtime_factory(llm={"provider": "echo", "attempts": 1})
    # The person's usage in the wrong type: /usage cannot read it.
    await redis.set(Keys("test:1").day(datetime.now(UTC).date()), "not a hash")
    await runtime.ingest(message("/usage", n=1))
    [apology] = await outbound.wait_for(1)
    await settled(runtime, "test:1", version=1)
    assert apology.text.startswith("Sorry, I couldn't answer your last message:")
    assert COMMAND in apology.text

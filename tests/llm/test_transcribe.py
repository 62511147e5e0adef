"""Transcription credentials go only to the host they belong to.

Two loopback OpenAI fakes play the LLM's provider and a transcription server on another port
(another origin): the LLM's key reaches the LLM's origin and nowhere else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from bot.config.settings import LLMSettings, MediaSettings
from bot.llm.transcribe import OpenAITranscriber, transcription_key
from tests.support.fakes.openai_server import FakeOpenAI

LLM_KEY = "sk-the-llm-key"
OWN_KEY = "sk-the-transcription-key"
NO_KEY = "unset"  # what the client sends when it has none to send
OGG = b"OggS" + bytes(60)


@pytest.fixture
async def provider() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def elsewhere() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


async def key_sent(media: MediaSettings, llm: LLMSettings, fake: FakeOpenAI) -> str:
    """The bearer key a transcription made with these settings carried to `fake`."""
    transcriber = OpenAITranscriber(media, llm)
    try:
        await transcriber.transcribe(OGG, "voice.ogg", "audio/ogg")
    finally:
        await transcriber.client.close()
    [request] = fake.transcriptions
    return request.api_key


def llm_at(url: str) -> LLMSettings:
    return LLMSettings(base_url=url, api_key=SecretStr(LLM_KEY))


async def test_a_transcription_server_on_another_host_never_gets_the_llm_key(
    provider: FakeOpenAI, elsewhere: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    media = MediaSettings(transcription_base_url=elsewhere.base_url)
    assert await key_sent(media, llm_at(provider.base_url), elsewhere) == NO_KEY
    assert provider.transcriptions == []
    assert "not sent there" in caplog.text
    assert LLM_KEY not in caplog.text


async def test_the_llm_key_goes_with_transcriptions_to_the_llms_own_host(
    provider: FakeOpenAI,
) -> None:
    # Unset: the LLM's endpoint. Set to the same origin (another path): the same.
    for url in (None, provider.origin + "/v1/"):
        provider.transcriptions.clear()
        media = MediaSettings(transcription_base_url=url)
        assert await key_sent(media, llm_at(provider.base_url), provider) == LLM_KEY


async def test_a_transcription_key_of_its_own_goes_wherever_transcriptions_go(
    provider: FakeOpenAI, elsewhere: FakeOpenAI
) -> None:
    media = MediaSettings(
        transcription_base_url=elsewhere.base_url, transcription_api_key=SecretStr(OWN_KEY)
    )
    assert await key_sent(media, llm_at(provider.base_url), elsewhere) == OWN_KEY


@pytest.mark.parametrize(
    ("llm_url", "transcription_url", "shared"),
    [
        # The origin is scheme, host and port; default ports count as given.
        ("https://api.example.com/v1", "https://API.example.com:443/v2", True),
        ("https://api.example.com/v1", "http://api.example.com/v1", False),
        ("https://api.example.com/v1", "https://api.example.com:8443/v1", False),
        ("https://api.example.com/v1", "https://whisper.example.com/v1", False),
        ("http://127.0.0.1:8000/v1", "http://localhost:8000/v1", False),
        # No LLM base URL: OpenAI's own.
        (None, "https://api.openai.com/v1", True),
        (None, "https://whisper.internal/v1", False),
    ],
)
def test_the_llm_key_is_shared_only_with_the_llms_origin(
    llm_url: str | None, transcription_url: str, shared: bool
) -> None:
    llm = LLMSettings(base_url=llm_url, api_key=SecretStr(LLM_KEY))
    key = transcription_key(MediaSettings(transcription_base_url=transcription_url), llm)
    assert (key == llm.api_key) is shared
    assert shared or key is None

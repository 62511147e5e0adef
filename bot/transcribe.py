"""Voice notes and audio files into text, through an OpenAI-compatible `/audio/transcriptions`
endpoint: OpenAI's own, or a self-hosted Whisper server that speaks the same API.

The cycle caches what comes back (`Store.keep_transcript`), so a generation that is
interrupted and started again does not pay for the same transcription twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

from bot.settings import LLMSettings, MediaSettings

if TYPE_CHECKING:
    from openai import AsyncOpenAI


class TranscriptionFailed(Exception):
    """The audio could not be transcribed; the reason is shown to the model and logged."""


class Transcriber(Protocol):
    async def transcribe(self, audio: bytes, name: str, mime: str) -> str:
        """The words spoken in `audio`. Raises `TranscriptionFailed`."""
        ...


class OpenAITranscriber:
    """`/audio/transcriptions` through the official client (multipart, auth, retries)."""

    def __init__(self, media: MediaSettings, llm: LLMSettings) -> None:
        # Imported here, as the LLM client is: it costs start-up time that echo never needs.
        from openai import AsyncOpenAI

        key = media.transcription_api_key or llm.api_key
        self.model = media.transcription_model
        self.client: AsyncOpenAI = AsyncOpenAI(
            base_url=media.transcription_base_url or llm.base_url,
            api_key=key.get_secret_value() if key else "unset",
            timeout=media.transcription_timeout_s,
            max_retries=2,
        )

    async def transcribe(self, audio: bytes, name: str, mime: str) -> str:
        import openai

        try:
            result = await self.client.audio.transcriptions.create(
                model=self.model, file=(name or "voice.ogg", audio, mime or "audio/ogg")
            )
        except openai.APIStatusError as exc:
            raise TranscriptionFailed(
                f"the transcription service answered {exc.status_code}"
            ) from None
        except openai.APIError as exc:
            raise TranscriptionFailed(
                f"the transcription service failed: {type(exc).__name__}"
            ) from None
        return result.text.strip()


def make_transcriber(
    media: MediaSettings, llm: LLMSettings, provider: Literal["openai", "echo"]
) -> Transcriber | None:
    """The transcriber the settings ask for; None when there is none to ask (no model set,
    or the offline echo model with no transcription server of its own)."""
    if not media.transcription_model:
        return None
    if provider == "echo" and media.transcription_base_url is None:
        return None
    return OpenAITranscriber(media, llm)

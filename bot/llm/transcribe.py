"""Voice notes and audio files into text, through an OpenAI-compatible `/audio/transcriptions`
endpoint: OpenAI's own, or a self-hosted Whisper server that speaks the same API.

The cycle caches what comes back (`Store.keep_transcript`), so a generation that is
interrupted and started again does not pay for the same transcription twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import SecretStr

from bot.blame import VOICE, blames
from bot.config.credentials import Credential
from bot.config.settings import LLMSettings, MediaSettings

if TYPE_CHECKING:
    pass


log = logging.getLogger(__name__)

TRANSCRIPTION_KEY = "LASTWORD_MEDIA__TRANSCRIPTION_API_KEY"

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port of `url`: what a key is given to (the port made explicit)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port out of range: matches no other URL's origin
        port = -1
    return scheme, (parts.hostname or "").lower(), port


def transcription_key(media: MediaSettings, llm: LLMSettings) -> SecretStr | None:
    """The key to send with transcriptions: their own, else the LLM's, but only to the LLM's
    own origin (scheme, host, port). A transcription server elsewhere without a key of its
    own gets none: the LLM's key belongs to the LLM's provider, never to another host."""
    from bot.llm.openai import OPENAI_BASE_URL

    if media.transcription_api_key is not None:
        return media.transcription_api_key
    if media.transcription_base_url is None:
        return llm.api_key
    if _origin(media.transcription_base_url) == _origin(llm.base_url or OPENAI_BASE_URL):
        return llm.api_key
    return None


class TranscriptionFailed(Exception):
    """The audio could not be transcribed; the reason is shown to the model and logged."""


class Transcriber(Protocol):
    async def transcribe(self, audio: bytes, name: str, mime: str) -> str:
        """The words spoken in `audio`. Raises `TranscriptionFailed`."""
        ...


class OpenAITranscriber:
    """`/audio/transcriptions` through the official client (multipart, auth, retries)."""

    def __init__(self, media: MediaSettings, llm: LLMSettings) -> None:
        # The OpenAI-compatible side is imported only when transcriptions are made: with its
        # HTTP stack, a sixth of the start of a replica that makes none (the offline echo).
        from bot.llm.openai import KEY_SETTING, OPENAI_BASE_URL, openai_client

        key = transcription_key(media, llm)
        if key is None and llm.api_key is not None:
            log.warning(
                "transcriptions go to another host than the LLM's and have no key of their "
                "own (LASTWORD_MEDIA__TRANSCRIPTION_API_KEY): the LLM's key is not sent there"
            )
        self.model = media.transcription_model
        base_url = media.transcription_base_url or llm.base_url
        self.key = Credential(
            TRANSCRIPTION_KEY if media.transcription_api_key or key is None else KEY_SETTING,
            f"the transcription service at {base_url or OPENAI_BASE_URL}",
            configured=key is not None,
        )
        self.client = openai_client(base_url, key, media.transcription_timeout_s, retries=2)

    @property
    def base_url(self) -> str:
        return str(self.client.base_url)

    async def probe(self, timeout_s: float, *, level: int = logging.ERROR) -> None:
        """Whether the service takes the key, into `self.key` (`bot.llm.openai.probe_key`)."""
        from bot.llm.openai import probe_key

        await probe_key(self.client, self.key, timeout_s, level=level)

    @blames(VOICE)
    async def transcribe(self, audio: bytes, name: str, mime: str) -> str:
        import openai

        from bot.llm.openai import key_fix

        try:
            result = await self.client.audio.transcriptions.create(
                model=self.model, file=(name or "voice.ogg", audio, mime or "audio/ogg")
            )
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                self.key.refused(f"{exc.status_code} to a transcription", key_fix(self.key))
            raise TranscriptionFailed(
                f"the transcription service answered {exc.status_code}"
            ) from None
        except openai.APIError as exc:
            raise TranscriptionFailed(
                f"the transcription service failed: {type(exc).__name__}"
            ) from None
        self.key.accepted()
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

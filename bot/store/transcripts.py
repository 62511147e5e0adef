"""The media cache: transcripts of voice notes and audio files (and documents' text), kept for
the conversation's retention so neither a generation started again nor a later turn pays for
one twice, and indexed per conversation so /forget erases them all."""

from __future__ import annotations

from collections.abc import Sequence

from bot.store import scripts
from bot.store.calls import Calls
from bot.store.replies import as_text


class Transcripts(Calls):
    """Read and keep transcripts, by the files' stable keys."""

    async def transcripts(self, conversation: str, file_keys: Sequence[str]) -> list[str | None]:
        """The cached transcripts of these files of one conversation, None where there is
        none; one round trip (the keys share the conversation's slot)."""
        if not file_keys:
            return []
        keys = self.layout.keys(conversation)
        async with self._reaching():
            found = await self.redis.mget([keys.transcript(f) for f in file_keys])
        return [None if v is None else as_text(v) for v in found]

    async def keep_transcript(self, conversation: str, file_key: str, text: str) -> None:
        """Cache a transcript, for the conversation's retention: a generation interrupted and
        started again, and later turns' history, read it instead of paying for it again. The
        conversation's index of cached files names it, for /forget (`Store.forget`)."""
        keys = self.layout.keys(conversation)
        named = {"transcript": keys.transcript(file_key), "heard": keys.heard}
        args: dict[str, str | int] = {
            "file_key": file_key,
            "text": text,
            "retention_ms": self.settings.retention_ms,
        }
        await self._run(scripts.TRANSCRIPT, named, args)

"""The media cache: transcripts of voice notes and audio files, kept for the conversation's
retention so neither a generation started again nor a later turn pays for one twice."""

from __future__ import annotations

from collections.abc import Sequence

from bot.store.calls import Calls
from bot.store.keys import Keys
from bot.store.replies import as_text


class Transcripts(Calls):
    """Read and keep transcripts, by the files' stable keys."""

    async def transcripts(self, conversation: str, file_keys: Sequence[str]) -> list[str | None]:
        """The cached transcripts of these files of one conversation, None where there is
        none; one round trip (the keys share the conversation's slot)."""
        if not file_keys:
            return []
        keys = Keys(conversation)
        async with self._reaching():
            found = await self.redis.mget([keys.transcript(f) for f in file_keys])
        return [None if v is None else as_text(v) for v in found]

    async def keep_transcript(self, conversation: str, file_key: str, text: str) -> None:
        """Cache a transcript, for the rest of the conversation's retention: a generation
        interrupted and started again, and later turns' history, read it instead of paying
        for it again."""
        async with self._reaching():
            await self.redis.set(
                Keys(conversation).transcript(file_key), text, px=self.settings.retention_ms
            )

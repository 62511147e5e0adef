"""A recording platform with a platform's limits and latency, for the pacing tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bot.message import Call, Scope, Throttled
from tests.support.fakes.outbound import RecordingOutbound


@dataclass
class Platform(RecordingOutbound):
    """A platform that limits the bot to `per_second` calls a second and each chat to one,
    takes `latency_s` to answer a message (a call in flight meanwhile), and answers a
    preview 429 while `refusing_previews_s` is set."""

    per_second: int = 3
    latency_s: float = 0.0
    draft_interval_s: float | None = 0.5
    refusing_previews_s: float | None = None
    drafted: list[str] = field(default_factory=list)

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        every = Scope("bot", self.per_second, 1.0)
        if call != "message":
            return (every,)
        return (every, Scope(f"chat:{conversation.rpartition(':')[2]}", 1, 1.0))

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        await asyncio.sleep(self.latency_s)
        await super().send(conversation, text, idempotency_key, reply_to)

    async def typing(self, conversation: str) -> None:
        self._refuse_preview(conversation)
        await super().typing(conversation)

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        self._refuse_preview(conversation)
        self.drafted.append(text)

    def _refuse_preview(self, conversation: str) -> None:
        if self.refusing_previews_s is not None:
            raise Throttled(self.refusing_previews_s, f"chat:{conversation}", inferred=True)

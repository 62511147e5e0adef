"""A platform stand-in for in-process tests: records what the core sends, in order.

It plays the chat platform (an outsider), not any part of lastword, so tests can assert on
exactly what a user would have seen.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bot.message import NoFiles


@dataclass(frozen=True)
class Sent:
    conversation: str
    text: str
    idempotency_key: str
    reply_to: str | None = None


@dataclass
class RecordingOutbound(NoFiles):
    max_message_chars: int = 4096
    typing_interval_s: float = 0.05
    sent: list[Sent] = field(default_factory=list)
    typing_calls: list[str] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        self.sent.append(Sent(conversation, text, idempotency_key, reply_to))
        self._changed.set()

    async def typing(self, conversation: str) -> None:
        self.typing_calls.append(conversation)

    def texts(self, conversation: str | None = None) -> list[str]:
        return [s.text for s in self.sent if conversation in (None, s.conversation)]

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Sent]:  # noqa: ASYNC109
        """Wait until at least `count` parts were sent; fails with an AssertionError listing
        what was sent otherwise."""
        try:
            async with asyncio.timeout(timeout):
                while len(self.sent) < count:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"gave up waiting for {count} parts sent after {timeout:g}s; "
                f"{len(self.sent)} were: {self.texts()!r}"
            ) from None
        return list(self.sent)

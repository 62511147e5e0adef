"""The user's typing, as the platform reports it: what holds their window open while they write.

An adapter that sees typing (`bot.message.SeesTyping`) passes every signal on through
`Sink.user_typing`, and a platform may send many: Discord repeats `TYPING_START` every few seconds,
a terminal reports every keystroke. Only one a second per person reaches the store (and the
first after each message they send, which is what tells a follow-up from a pause), so a flood
of signals costs a round trip a second per person at most, and never slows their messages.
What the store does with one is typing.lua's.
"""

from __future__ import annotations

import time

# A person's signals reach the store at most this often (the store drops closer ones too, for
# signals taken in by different replicas).
EVERY_S = 1.0
# People whose last signal is remembered, at most; past it, those older than `EVERY_S` are
# forgotten, and while it is still full new ones are dropped (a flood of typing from that many
# people at once is shed, never their messages).
REMEMBERED = 10_000


class TypingSignals:
    """Which of a replica's typing signals go on to the store."""

    def __init__(self, every_s: float = EVERY_S, remembered: int = REMEMBERED) -> None:
        self.every_s = every_s
        self.remembered = remembered
        # Conversation -> when (monotonic) its last signal went on.
        self._last: dict[str, float] = {}

    def due(self, conversation: str) -> bool:
        """Whether a signal of `conversation` now goes on to the store (noted if so)."""
        now = time.monotonic()
        last = self._last.get(conversation)
        if last is not None and now - last < self.every_s:
            return False
        if last is None and len(self._last) >= self.remembered:
            self._last = {c: t for c, t in self._last.items() if now - t < self.every_s}
            if len(self._last) >= self.remembered:
                return False
        self._last[conversation] = now
        return True

    def message(self, conversation: str) -> None:
        """The person sent a message: their next signal is a new one, whenever it comes."""
        self._last.pop(conversation, None)

"""The typing indicator, kept alive per conversation from its first message to the reply.

Platforms show "typing" for a few seconds after each call, so it is repeated every
`Outbound.typing_interval_s` until the reply goes out (or the cycle ends without one), except
while a live draft shows the bot at work: then the indicator would only cost a call. It is
also skipped while the event loop lags with many conversations typing
(`bot.loop_lag.shedding`): acknowledgements and replies come first.
"""

from __future__ import annotations

import asyncio
import logging

from bot.loop_lag import shedding
from bot.message import Outbound
from bot.outbound.drafts import showing

log = logging.getLogger(__name__)


class Typing:
    """Keeps a typing indicator alive per conversation, from first message to reply."""

    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def show(self, conversation: str) -> None:
        if conversation not in self._tasks:
            self._tasks[conversation] = asyncio.create_task(self._repeat(conversation))

    def hide(self, conversation: str) -> None:
        task = self._tasks.pop(conversation, None)
        if task is not None:
            task.cancel()

    async def _repeat(self, conversation: str) -> None:
        while True:
            if conversation not in showing(self.outbound) and not shedding(len(self._tasks)):
                try:
                    await self.outbound.typing(conversation)
                except Exception as exc:
                    # An indicator is a nicety; a platform hiccup must not end the conversation.
                    log.debug("typing indicator failed for %s: %s", conversation, exc)
            await asyncio.sleep(self.outbound.typing_interval_s)

    def stop(self) -> None:
        for conversation in list(self._tasks):
            self.hide(conversation)

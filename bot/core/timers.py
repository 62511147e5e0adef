"""Wake-ups: an in-process timer per conversation, backed by a sweep of the durable due-index.

The replica that ingested a message arms a local timer for the window's deadline, so the
common case wakes within a few milliseconds of it. The due-index in Redis is the truth,
though: every replica sweeps it periodically and wakes whatever is overdue, which is how the
conversations of a replica that died (or whose timer was lost with it) get finished.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from bot.cancel import cancel_and_wait
from bot.message import Unavailable

log = logging.getLogger(__name__)


class Timers:
    def __init__(
        self,
        wake: Callable[[str], None],
        overdue: Callable[[], Awaitable[list[str]]],
        sweep_interval_s: float,
    ) -> None:
        self._wake = wake
        self._overdue = overdue
        self._interval = sweep_interval_s
        self._handles: dict[str, asyncio.TimerHandle] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = False

    def arm(self, conversation: str, look_in_ms: int) -> None:
        """Wake `conversation` after `look_in_ms`, replacing any earlier timer for it.

        The newest delay always wins: it comes from the server's latest view of the window.
        Once stopped, nothing is armed: the due-index keeps the conversation for any replica.
        """
        if self._stopped:
            return
        old = self._handles.pop(conversation, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._handles[conversation] = loop.call_later(
            max(look_in_ms, 0) / 1000, self._fire, conversation
        )

    def _fire(self, conversation: str) -> None:
        self._handles.pop(conversation, None)
        self._wake(conversation)

    def start(self) -> None:
        self._stopped = False
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="sweep")

    async def _sweep_forever(self) -> None:
        # The flag, not only cancel(), ends the loop: on Python 3.11 a cancellation that lands
        # inside a store call can be lost (see bot.cancel), and while the sweeper spends most
        # of its time in such calls, re-cancelling may keep missing it.
        while not self._stopped:
            # Jitter keeps replicas from sweeping in lockstep and racing for the same leases.
            await asyncio.sleep(self._interval * random.uniform(0.5, 1.0))
            try:
                overdue = await self._overdue()
            except Unavailable as exc:
                log.warning("sweep skipped: %s", exc)
                continue
            except Exception:
                # Whatever it was (an unclassified error reply, a bug), the sweep is how
                # orphaned conversations get finished: it must outlive it.
                log.exception("sweep failed; trying again at the next one")
                continue
            if self._stopped:
                return
            # Overdue in the store beats any local timer: that timer may be a "busy"
            # retry set for a lease that has since been handed back.
            for conversation in overdue:
                self._wake(conversation)

    async def stop(self) -> None:
        self._stopped = True
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)

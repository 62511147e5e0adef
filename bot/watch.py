"""Watching for newer messages while the model generates, so a stale generation can be cut.

Each replica keeps one watcher task for all its generating conversations: every poll
interval it reads their versions in one pipelined round trip, and signals those whose version
moved. A poll per conversation would cost a round trip and a task wake-up each; with a few
hundred generations in flight that alone would keep a replica's event loop busy and make every
interrupt late. The task runs only while something is watched.

A message this replica takes in is signalled at once (`moved`): the poll is for the messages
other replicas take in, and waiting for it would add up to a poll interval to every interrupt.
"""

from __future__ import annotations

import asyncio
import logging

from bot.cancel import cancel_and_wait
from bot.store import Store, StoreUnavailable

log = logging.getLogger(__name__)


class VersionWatch:
    def __init__(self, store: Store, poll_s: float) -> None:
        self.store = store
        self.poll_s = poll_s
        self._watched: dict[str, tuple[int, asyncio.Event]] = {}
        self._poller: asyncio.Task[None] | None = None

    def watch(self, conversation: str, version: int) -> asyncio.Event:
        """An event set once the conversation's version is no longer `version`. A process
        runs one cycle per conversation at a time, so one watch per conversation."""
        moved = asyncio.Event()
        self._watched[conversation] = (version, moved)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="version watch")
        return moved

    def moved(self, conversation: str, version: int) -> None:
        """This replica has just taken in a message that moved `conversation` to `version`:
        signal its watch now rather than at the next poll."""
        current = self._watched.get(conversation)
        if current is not None and current[0] != version:
            current[1].set()

    def unwatch(self, conversation: str, moved: asyncio.Event) -> None:
        current = self._watched.get(conversation)
        if current is not None and current[1] is moved:
            del self._watched[conversation]

    async def _poll(self) -> None:
        while self._watched:
            await asyncio.sleep(self.poll_s)
            watched = list(self._watched.items())
            if not watched:
                return
            try:
                versions = await self.store.versions([conversation for conversation, _ in watched])
            except StoreUnavailable as exc:
                # Missing an interrupt costs tokens, not correctness: the pre-send check
                # still drops the stale reply.
                log.debug("version watch skipped a poll: %s", exc)
                continue
            except Exception:
                # Unexpected, and not fatal for the same reason; the watch must outlive it,
                # or every generation on this replica would run to its end.
                log.exception("version watch failed a poll")
                continue
            for (_, (version, moved)), current in zip(watched, versions, strict=True):
                if current != version:
                    moved.set()

    async def stop(self) -> None:
        self._watched.clear()
        if self._poller is not None:
            await cancel_and_wait(self._poller)

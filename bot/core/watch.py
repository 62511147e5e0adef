"""Watching for newer messages while the model generates, so a stale generation can be cut;
and, for a speculative generation, for the user seen typing (`bot.core.typing_signals`).

Each replica keeps one watcher task for all its generating conversations: every poll
interval it reads their versions in one pipelined round trip, and signals those whose version
moved. A poll per conversation would cost a round trip and a task wake-up each; with a few
hundred generations in flight that alone would keep a replica's event loop busy and make every
interrupt late. The task runs only while something is watched.

A reply waiting for its turn in the outbound budget costs nothing while it waits, so its
conversation is read only every WAITING_POLL_S: with a thousand replies held by a 429 that is a
thousand reads a second in one round trip, not twenty thousand; a newer message that came
meanwhile is still caught by the pre-send check made again after the wait.

A message this replica takes in is signalled at once (`moved`): the poll is for the messages
other replicas take in, and waiting for it would add up to a poll interval to every interrupt.
A watcher may also give a callback, called the moment the version is seen to move: a loaded
event loop takes a while for every task it must wake, and the generation can be cancelled
before any of them (the event still wakes whoever waits on it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from bot.cancel import cancel_and_wait
from bot.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

# How often a waiting reply's conversation is read (a generating one's: every poll).
WAITING_POLL_S = 1.0


@dataclass(frozen=True)
class Watched:
    """One conversation's watch: the version its generation covers, its lease's fence (a
    typing signal cuts a speculative generation by naming it), and whom to tell."""

    version: int
    fence: int
    moved: asyncio.Event
    on_moved: Callable[[], None] | None
    waiting: bool = False

    def signal(self) -> None:
        if self.moved.is_set():
            return
        self.moved.set()
        if self.on_moved is None:
            return
        try:
            self.on_moved()
        except Exception:
            # Called from ingest too: a failing callback must not refuse the message. The
            # event is set, so the generation is still cut, a little later.
            log.exception("a version watch callback failed")


class VersionWatch:
    def __init__(self, store: Store, poll_s: float) -> None:
        self.store = store
        self.poll_s = poll_s
        self._watched: dict[str, Watched] = {}
        self._poller: asyncio.Task[None] | None = None

    def watch(
        self,
        conversation: str,
        version: int,
        fence: int,
        on_moved: Callable[[], None] | None = None,
        *,
        waiting: bool = False,
    ) -> asyncio.Event:
        """An event set once the conversation's version is no longer `version`, or a typing
        signal cut the generation of lease `fence` (a speculative one), and `on_moved` called
        then, synchronously. A process runs one cycle per conversation at a time, so one
        watch per conversation. `waiting`: a reply waiting its turn, read less often."""
        moved = asyncio.Event()
        self._watched[conversation] = Watched(version, fence, moved, on_moved, waiting)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="version watch")
        return moved

    def moved(self, conversation: str, version: int) -> None:
        """This replica has just taken in a message that moved `conversation` to `version`:
        signal its watch now rather than at the next poll."""
        watched = self._watched.get(conversation)
        if watched is not None and watched.version != version:
            watched.signal()

    def cut(self, conversation: str, fence: int) -> None:
        """This replica has just taken in a typing signal that cut the speculative generation
        of lease `fence`: signal its watch now rather than at the next poll."""
        watched = self._watched.get(conversation)
        if watched is not None and watched.fence == fence:
            watched.signal()

    def unwatch(self, conversation: str, moved: asyncio.Event) -> None:
        watched = self._watched.get(conversation)
        if watched is not None and watched.moved is moved:
            del self._watched[conversation]

    async def _poll(self) -> None:
        waiting_read_at = 0.0
        while self._watched:
            await asyncio.sleep(self.poll_s)
            now = time.monotonic()
            with_waiting = now - waiting_read_at >= WAITING_POLL_S
            if with_waiting:
                waiting_read_at = now
            watched = [
                (conversation, one)
                for conversation, one in self._watched.items()
                if with_waiting or not one.waiting
            ]
            if not watched:
                continue
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
            for (_, one), (version, cut) in zip(watched, versions, strict=True):
                if version != one.version or cut == one.fence:
                    one.signal()

    async def stop(self) -> None:
        self._watched.clear()
        if self._poller is not None:
            await cancel_and_wait(self._poller)

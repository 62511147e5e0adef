"""Live drafts: the reply shown as it is written, where the platform can show one.

Telegram's `sendMessageDraft` streams an ephemeral preview into a private chat; it vanishes
unless the bot sends the final message. That fits the design: the preview is best effort and
holds no promise, while the one reply still goes out through the outbox, after the pre-send
check, like every reply. A cycle that is interrupted simply stops drafting; the next one drafts
under the same id (the first unanswered version), so its preview replaces the old one.

A `Drafter` sends the first, empty draft at once (Telegram shows "Thinking…"), then the text
so far at most once per interval. A 429 slows it down; any other failure is logged and
ignored, and after a few in a row it stops trying for this reply. It never delays the reply.

A speculative generation, started while the user's quiet window is still open, is held:
nothing at all is shown before the window closes (the user may still be typing, and the reply
may yet be thrown away), and the first draft after it carries all the text generated so far
("Thinking…" only if there is none yet).

A draft shows the bot at work, so while one is shown (`showing`) the typing indicator is not
sent for that conversation. Drafts and typing are the first work shed when the event loop
lags with many of them in flight (`bot.loop_lag.shedding`): a replica flooded with messages
spends its loop on acknowledging them and on the replies themselves, not on previews.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Set
from typing import Protocol, cast

from bot.cancel import cancel_and_wait
from bot.llm.base import strip_reasoning
from bot.loop_lag import shedding
from bot.message import Place, Throttled

log = logging.getLogger(__name__)

# One draft call may take this long before it is given up (the next one carries newer text).
DRAFT_TIMEOUT_S = 5.0
# Failures in a row (other than 429) after which a reply is no longer drafted.
MAX_FAILURES = 3


class Drafts(Protocol):
    """What an outbound that can show a reply as it is written adds to `Outbound`."""

    # How often a draft may be updated; None: drafts are off.
    draft_interval_s: float | None

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        """Show `text` as the draft `draft_id` (non-zero) of the conversation; "" shows that
        the bot is thinking. Raises `bot.message.Throttled` on a 429 (or when
        the outbound budget sheds it)."""


# The conversations each outbound (by id) shows a live draft in right now; an outbound with
# none has no entry, so this holds only drafts in flight.
_showing: dict[int, set[str]] = {}
# The drafters running now, on every outbound: how many previews shedding would save.
_running: set[Drafter] = set()


def showing(outbound: object) -> Set[str]:
    """The conversations `outbound` shows a live draft in right now."""
    return _showing.get(id(outbound), frozenset())


def drafts_of(outbound: object) -> Drafts | None:
    """The outbound's drafts, if it has them and they are on."""
    # Its members looked up directly, not a runtime-checkable protocol's isinstance: this runs
    # for every generation and every draft, and that check walks the protocol's class tree
    # on each call (Python 3.11), several times the cost of the two lookups.
    if callable(getattr(outbound, "draft", None)) and getattr(outbound, "draft_interval_s", None):
        return cast(Drafts, outbound)
    return None


class Drafter:
    """The drafts of one generation; none before `hold_until` (a `time.monotonic()` instant),
    if given."""

    def __init__(
        self,
        drafts: Drafts,
        conversation: str,
        draft_id: int,
        hold_until: float | None = None,
    ) -> None:
        assert drafts.draft_interval_s
        self.drafts = drafts
        self.conversation = conversation
        self.draft_id = draft_id
        self.interval_s = drafts.draft_interval_s
        self.hold_until = hold_until
        self.sent = 0
        # Seconds from start() (or the end of the hold, if later) to the first draft the
        # platform accepted, once there is one: the preview's own delay, not the window's.
        self.first_after_s: float | None = None
        self._latest = ""
        self._shown: str | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        _running.add(self)
        self._task = asyncio.ensure_future(self._run())

    def update(self, text: str) -> None:
        """The answer so far. Called for every streamed piece, so it only keeps the text:
        the reasoning is stripped once per draft sent, not once per piece."""
        self._latest = text
        self._changed.set()

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        _running.discard(self)
        shown = _showing.get(id(self.drafts))
        if shown is not None:
            shown.discard(self.conversation)
            if not shown:
                del _showing[id(self.drafts)]

    async def _run(self) -> None:
        if self.hold_until is not None:
            await asyncio.sleep(max(self.hold_until - time.monotonic(), 0.0))
            self._started = max(self._started, self.hold_until)
        failures = 0
        self._changed.set()
        while failures < MAX_FAILURES:
            await self._changed.wait()
            self._changed.clear()
            if shedding(len(_running)):
                # Shed: tried again after the interval, with the text as it is by then.
                self._changed.set()
                await asyncio.sleep(self.interval_s)
                continue
            text = strip_reasoning(self._latest)
            if text == self._shown:
                continue
            try:
                async with asyncio.timeout(DRAFT_TIMEOUT_S):
                    await self.drafts.draft(self.conversation, self.draft_id, text)
            except Throttled as exc:
                # Slower from now on, and not before the platform allows it.
                self.interval_s = max(self.interval_s * 2, exc.retry_after_s)
                self._changed.set()
                await asyncio.sleep(exc.retry_after_s)
                continue
            except Exception as exc:  # best effort: a draft never fails the reply
                failures += 1
                log.debug("draft for %s failed: %r", self.conversation, exc)
                self._changed.set()
                await asyncio.sleep(self.interval_s)
                continue
            failures = 0
            self.sent += 1
            self._shown = text
            if self.first_after_s is None:
                self.first_after_s = time.monotonic() - self._started
                _showing.setdefault(id(self.drafts), set()).add(self.conversation)
            if text:
                # The interval spaces updates of the text; the first words follow "Thinking…"
                # as soon as they come.
                await asyncio.sleep(self.interval_s)
        log.info("stopped drafting for %s: %d failures in a row", self.conversation, failures)


@contextlib.asynccontextmanager
async def drafting(
    drafts: Drafts | None, conversation: str, draft_id: int, hold_until: float | None = None
) -> AsyncIterator[Drafter | None]:
    """A `Drafter` for the generation inside the block (None when drafts are off), stopped
    when the block ends, before the reply is checked and sent. With `hold_until` (a
    `time.monotonic()` instant: when a speculative generation's window closes) nothing is
    drafted before then; a block that ends earlier drafts nothing at all. Never in a group: a
    draft is a private preview, and a room would see every person's."""
    if drafts is None or Place.of(conversation).group:
        yield None
        return
    drafter = Drafter(drafts, conversation, draft_id, hold_until)
    drafter.start()
    try:
        yield drafter
    finally:
        await drafter.stop()

"""Pacing: every platform call drawn from one outbound budget the whole fleet shares.

Telegram and Discord limit what a bot may send, not what a process may: about 30 messages a
second bot-wide on Telegram, one a second in a chat, 20 a minute in a group; 50 requests a
second on Discord, 5 messages per 5 s in a channel. Past them comes a 429, and a bot that
keeps pushing is banned for longer. Replicas that each paced themselves alone would together
break limits none of them sees, so before each call a replica asks the store
(`bot.store.budget`) whether the call fits every limit the adapter says it falls under
(`Limited.scopes`: the bot's, the chat's, the group's):

- A message (a reply's part, a notice) waits its turn. Replies whose window closed first go
  first (in a group, of those whose person is within their share: below), whichever replica
  holds them. The first part of a reply waits before the pre-send check (`Paced.turn`), so a
  reply that waited is still checked against newer messages and never goes out stale; its
  lease is renewed meanwhile, as for any other step.
- A preview (a live draft, a typing indicator) goes now or never: it is shed when the budget
  runs short, before any reply would wait, and never while a reply waits.
- In a group, the group's limits (every scope with a subject: its chat's, its minute) are
  shared fairly between the people the replies are for, across the group's topics: each person
  takes the group's slots at most at their share of its rate (the whole of it while they talk
  alone), after a few that may go at once (`bot.store.budget.FAIR_BURST`), and whoever has
  had their share waits behind those who have not, so a member who
  floods the group delays another by about one slot's interval, never by the group's whole
  period. Their own extra replies wait; newer messages fold into them as always.
- A 429 that any replica hears holds its scope for every replica until its `retry_after` ends.
- A call counts from the moment it was answered (`Store.done`), not from when it was allowed:
  the platform saw it before that, so however late a replica's loop runs, no later call can
  land inside its window early.

With the store unreachable, messages wait (a reply stays in its outbox) and previews are
shed: the fleet never sends blind, and a store that comes back finds the budget as it was.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field

from bot.drafts import drafts_of
from bot.message import (
    Attachment,
    Call,
    Limited,
    Outbound,
    Place,
    Scope,
    Throttled,
    Unavailable,
    kind_of,
)
from bot.store import BudgetKeys, Store, Taken
from bot.store.budget import IN_FLIGHT_MS

log = logging.getLogger(__name__)

# 429s in a row for one message before its send fails (transient: the core backs the reply
# off across replicas and tries again, a bounded number of times).
THROTTLED_ATTEMPTS = 5
# A slot taken by `turn` and not used within this long is given back rather than trusted:
# the store stops counting a call in flight after IN_FLIGHT_MS.
SLOT_FRESH_S = IN_FLIGHT_MS / 1000 / 2
# A message waits its turn at most this long before its send fails (transient, so the reply
# is backed off and tried again): a budget held for ever must not hold a cycle for ever.
MAX_TURN_S = 300.0
# A preview asks the store at most this long; a message's turn may take longer, but each ask
# is bounded by the store client's own timeout.
PREVIEW_TIMEOUT_S = 2.0


@dataclass
class PacingStats:
    """What pacing did on this replica, by scope kind ("bot", "chat", ...) or call."""

    waits: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    shed: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    throttled: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    held_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass(frozen=True)
class Slot:
    """A call the budget allowed: its id in each scope, and when it was allowed."""

    grant: str
    scopes: tuple[Scope, ...]
    at: float = field(default_factory=time.monotonic)


class Paced:
    """The adapter's `Outbound` (with its drafts, if any), every call paced by the budget.
    `mode` is LASTWORD_OUTBOUND__BUDGET: shared (one budget for every replica of the platform's
    bot), replica (this replica's own, as if it were alone) or off (none: 429s waited out)."""

    def __init__(
        self, inner: Outbound, store: Store, platform: str, replica: str, *, mode: str
    ) -> None:
        self.inner = inner
        self.store = store
        self.keys = BudgetKeys(platform, None if mode == "shared" else replica)
        self.paced = mode != "off" and isinstance(inner, Limited)
        self.stats = PacingStats()
        self.max_message_chars = inner.max_message_chars
        self.typing_interval_s = inner.typing_interval_s
        drafts = drafts_of(inner)
        self.draft_interval_s: float | None = drafts.draft_interval_s if drafts else None

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        if not self.paced:
            return ()
        assert isinstance(self.inner, Limited)
        return self.inner.scopes(conversation, call)

    # Messages

    async def turn(self, conversation: str, order_ms: int) -> Slot | None:
        """Wait until a message may go out in `conversation`, behind the replies whose window
        closed before `order_ms` (server clock); the slot goes to `send(..., slot=)`. None
        when the platform is not paced. Raises `Unavailable` while the store is down."""
        scopes = self.scopes(conversation, "message")
        if not scopes:
            return None
        person, fair = shared_fairly(conversation, scopes)
        # The conversation's own: one reply of a conversation waits at a time, so a turn cut
        # short by a newer message (its reply gone stale) leaves no ticket behind to keep
        # others waiting; the next reply takes its place.
        ticket = conversation
        began = time.monotonic()
        waited_on: set[str] = set()
        while True:
            grant = secrets.token_hex(8)
            taken = await self.store.take(
                self.keys,
                scopes,
                call="message",
                ticket=ticket,
                order_ms=order_ms,
                grant=grant,
                person=person,
                fair=fair,
            )
            if taken.status == "granted":
                for kind in waited_on:
                    self.stats.wait_s[kind] += time.monotonic() - began
                return Slot(grant, scopes)
            kind = kind_of(taken.scope)
            if kind not in waited_on:
                waited_on.add(kind)
                self.stats.waits[kind] += 1
            if time.monotonic() - began > MAX_TURN_S:
                raise Throttled(taken.wait_ms / 1000, taken.scope)
            await asyncio.sleep(taken.wait_ms / 1000)

    async def give_back(self, slot: Slot | None) -> None:
        """A slot `turn` gave that no message will use (the reply was found stale)."""
        if slot is not None:
            await self._done(slot, used=False)

    async def send(
        self,
        conversation: str,
        text: str,
        idempotency_key: str,
        reply_to: str | None = None,
        *,
        slot: Slot | None = None,
    ) -> None:
        """Send one part in its turn (`slot`, if `turn` already waited for it), as a reply to
        the message `reply_to` if given (groups only). A 429 holds the scope it names for
        every replica, and the part waits its turn again."""
        if slot is not None and time.monotonic() - slot.at > SLOT_FRESH_S:
            await self.give_back(slot)
            slot = None
        order_ms = 0  # a part already promised (past its pre-send check) goes first
        for attempt in range(1, THROTTLED_ATTEMPTS + 1):
            if slot is None:
                slot = await self.turn(conversation, order_ms)
            try:
                if reply_to is None:
                    await self.inner.send(conversation, text, idempotency_key)
                else:
                    await self.inner.send(conversation, text, idempotency_key, reply_to)
            except Throttled as exc:
                await self.throttled(exc.scope, exc.retry_after_s)
                if attempt == THROTTLED_ATTEMPTS:
                    raise
                if not self.paced:
                    # No budget to wait in: waited out here, as told.
                    await asyncio.sleep(exc.retry_after_s)
                continue
            finally:
                if slot is not None:
                    await self._done(slot, used=True)
                    slot = None
            return

    # Previews

    async def typing(self, conversation: str) -> None:
        """Show the typing indicator, if the budget has room for it now; else it is shed."""
        slot, shed = await self._preview(conversation, "typing")
        if shed is None:
            await self._previewed(slot, self.inner.typing(conversation))

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        """The reply so far as a draft, if the budget has room for it now. A draft shed, or
        refused with a 429, raises `Throttled` so the drafter slows down."""
        drafts = drafts_of(self.inner)
        assert drafts is not None
        slot, shed = await self._preview(conversation, "draft")
        if shed is not None:
            # Not tried again sooner than the next draft would be (a store that refuses at
            # once must not make the drafter spin).
            raise Throttled(max(shed.wait_ms / 1000, self.draft_interval_s or 0.0), shed.scope)
        await self._previewed(slot, drafts.draft(conversation, draft_id, text))

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        return await self.inner.fetch(attachment, max_bytes)

    # Shared news

    async def throttled(self, scope: str, retry_after_s: float) -> None:
        """The platform answered 429 for `scope`: held for every replica until it has
        passed. Best effort: with the store down nothing is sent anyway."""
        kind = kind_of(scope)
        self.stats.throttled[kind] += 1
        self.stats.held_s[kind] += retry_after_s
        log.warning("the platform throttled %s for %.1fs", scope, retry_after_s)
        if not self.paced:
            return
        try:
            await self.store.hold(self.keys, scope, int(retry_after_s * 1000))
        except Unavailable as exc:
            log.warning("could not share the hold of %s (%s)", scope, exc)

    # Inside

    async def _preview(self, conversation: str, call: Call) -> tuple[Slot | None, Taken | None]:
        """A preview's slot, or the answer that shed it (on any store failure too): (slot,
        None) granted, (None, taken) shed, (None, None) not paced."""
        scopes = self.scopes(conversation, call)
        if not scopes:
            return None, None
        grant = secrets.token_hex(8)
        try:
            async with asyncio.timeout(PREVIEW_TIMEOUT_S):
                taken = await self.store.take(
                    self.keys, scopes, call=call, ticket="-", order_ms=0, grant=grant
                )
        except (Unavailable, TimeoutError):
            taken = Taken("shed", 0, "store", False)
        if taken.status == "granted":
            return Slot(grant, scopes), None
        self.stats.shed[call] += 1
        return None, taken

    async def _previewed(self, slot: Slot | None, call: Awaitable[None]) -> None:
        """Make a preview's call in its slot; a 429 is shared news."""
        try:
            await call
        except Throttled as exc:
            await self.throttled(exc.scope, exc.retry_after_s)
            raise
        finally:
            if slot is not None:
                await self._done(slot, used=True)

    async def _done(self, slot: Slot, *, used: bool) -> None:
        try:
            await self.store.done(self.keys, slot.scopes, slot.grant, used=used)
        except Unavailable as exc:
            # The call stays counted in flight a while longer: slower, never faster.
            log.info("could not record a call's answer in the budget (%s)", exc)


def shared_fairly(conversation: str, scopes: tuple[Scope, ...]) -> tuple[str, frozenset[str]]:
    """Whom a message in `conversation` is for, and the scopes it shares fairly with the other
    people there: in a group, every limit with a subject (the group's chat, its minute, a
    channel) is the group's; the bot-wide ones are everyone's, and a DM has one person."""
    place = Place.of(conversation)
    if not place.group:
        return "", frozenset()
    return place.sender, frozenset(
        scope.name for scope in scopes if kind_of(scope.name) != scope.name
    )

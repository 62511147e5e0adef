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
  holds them. A reply waits once it has passed the pre-send check, in its outbox
  (`Paced.turn`): a wait, a hold, a store outage or a restart never throws it away, and a
  newer message still supersedes it (the cycle checks again after a wait). Waiting is cheap:
  one task a replica (the pacer) asks for all of its waiting replies in one store call, when
  the first of them is told its slot can come, when a slot is given back early on any
  replica, or when a new reply might go at once; between asks, one call keeps all their
  places (their tickets) alive. A reply that stops waiting gives its place back at once, and
  a dead replica's places, and its calls in flight, lapse within `LAPSE_MS`.
- A preview (a live draft, a typing indicator) goes now or never: it is shed when the budget
  runs short, before any reply would wait, and never while a reply waits.
- In a group, the group's limits (every scope with a subject: its chat's, its minute) are
  shared fairly between the people the replies are for, across the group's topics: each person
  takes the group's slots at most at their share of its rate (the whole of it while they talk
  alone), after a few that may go at once (`bot.store.budget.FAIR_BURST`), and whoever has
  had their share waits behind those who have not, so a member who
  floods the group delays another by about one slot's interval, never by the group's whole
  period. Their own extra replies wait; newer messages fold into them as always.
- A 429 that any replica hears holds its scope for every replica until its `retry_after` ends
  (clamped to [MIN_HOLD_S, MAX_HOLD_S]), and only that scope: a preview's 429 holds previews
  alone; where the platform does not say what a 429 is about (Telegram), the call's chat, and
  the whole bot once several chats are refused close together (`bot.store.budget`).
- A call counts from the moment it was answered (`Store.done`), not from when it was allowed:
  the platform saw it before that, so however late a replica's loop runs, no later call can
  land inside its window early.

With the store unreachable, messages wait (a reply stays in its outbox, its turn asked again,
backed off, for up to OUTAGE_S) and previews are shed: the fleet never sends blind, and a store
that comes back finds the budget as it was, or, if it lost it, starts it cautiously.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable

from bot.message import (
    BOT_SCOPE,
    PREVIEWS_SCOPE,
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
from bot.outbound.drafts import drafts_of
from bot.outbound.pacer import Pacer, PacingStats, Slot
from bot.store import Ask, BudgetKeys, Store, Taken
from bot.store.budget import IN_FLIGHT_MS

log = logging.getLogger(__name__)

# 429s in a row for one message before its send fails (transient: the core backs the reply
# off across replicas and tries again, a bounded number of times).
THROTTLED_ATTEMPTS = 5
# A slot taken by `turn` and not used within this long is given back rather than trusted:
# the pacer stops keeping a call in flight after IN_FLIGHT_MS, and its slot lapses.
SLOT_FRESH_S = IN_FLIGHT_MS / 1000 / 2
# Previews of a kind a replica has heard are shed in a scope: no more of that kind are asked
# for there until the store said the scope may have room again. Past this many remembered,
# the ones whose time has passed are forgotten.
SHED_REMEMBERED = 1024
# A retry_after outside these bounds is the platform's mistake (or a hostile proxy's): a hold
# is at least a second (0 or less would let the next call straight into the same 429) and at
# most an hour (the call is then tried again, and a real flood wait holds it again).
MIN_HOLD_S = 1.0
MAX_HOLD_S = 3600.0
# A bot-wide hold longer than this is reported by /healthz and `lastword status`.
HELD_LONG_S = 30.0


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
        self.pacer = Pacer(store, self.keys, self.stats)
        self.max_message_chars = inner.max_message_chars
        self.typing_interval_s = inner.typing_interval_s
        drafts = drafts_of(inner)
        self.draft_interval_s: float | None = drafts.draft_interval_s if drafts else None
        # Until when (monotonic) previews of a kind are shed in a scope without asking, by
        # kind and scope (drafts may use more of a scope than typing indicators).
        self._shed_until: dict[tuple[Call, str], float] = {}
        self._told: set[str] = set()

    @property
    def waiting(self) -> int:
        """How many of this replica's replies have been told to wait their turn, now."""
        return self.pacer.waiting

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        if not self.paced:
            return ()
        assert isinstance(self.inner, Limited)
        return self.inner.scopes(conversation, call)

    # Messages

    async def turn(self, conversation: str, order_ms: int) -> Slot | None:
        """Wait until a message may go out in `conversation`, behind the replies whose window
        closed before `order_ms` (server clock); the slot goes to `send(..., slot=)`. None
        when the platform is not paced. However long a hold lasts, it waits; through a store
        outage it waits on, and raises `Unavailable` once the outage has lasted OUTAGE_S.
        Cancelled or failing, it gives its place in the queue back (`Pacer.turn`)."""
        scopes = self.scopes(conversation, "message")
        if not scopes:
            return None
        person, fair = shared_fairly(conversation, scopes)
        # The ticket is the conversation's own (one reply of a conversation waits at a time);
        # one grant id for every ask of this turn: an ask made again after its answer was lost
        # is granted the slot the lost answer may have granted, not a second one.
        grant = secrets.token_hex(8)
        return await self.pacer.turn(
            Ask(scopes, "message", conversation, order_ms, grant, person, fair)
        )

    async def give_back(self, slot: Slot | None) -> None:
        """A slot `turn` gave that no message will use (the reply was found stale)."""
        if slot is not None:
            self.pacer.stamp(slot, used=False)

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
                await self.throttled(exc.scope, exc.retry_after_s, inferred=exc.inferred)
                if attempt == THROTTLED_ATTEMPTS:
                    raise
                if not self.paced:
                    # No budget to wait in: waited out here, as told.
                    await asyncio.sleep(self._clamped(exc.scope, exc.retry_after_s))
                continue
            finally:
                if slot is not None:
                    self.pacer.stamp(slot, used=True)
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

    async def throttled(self, scope: str, retry_after_s: float, *, inferred: bool = False) -> None:
        """The platform answered 429 for `scope`: held for every replica until it has
        passed (`inferred`: the platform did not say what it was about, and `scope` is the
        call's chat: several of them close together hold the bot). Best effort: with the
        store down nothing is sent anyway."""
        held_s = self._clamped(scope, retry_after_s)
        kind = kind_of(scope)
        self.stats.throttled[kind] += 1
        self.stats.held_s[kind] += held_s
        log.warning("the platform throttled %s for %.1fs", scope, held_s)
        if not self.paced:
            return
        try:
            self.stats.calls["hold"] += 1
            widened = await self.store.hold(self.keys, scope, int(held_s * 1000), spread=inferred)
        except Unavailable as exc:
            log.warning("could not share the hold of %s (%s)", scope, exc)
            return
        if widened:
            log.warning(
                "the platform throttled several chats at once: every reply is held for %.1fs",
                held_s,
            )

    async def bot_held_s(self) -> float:
        """How long the platform still holds every call of the bot after a 429 (0.0: it does
        not), read from the store, so every replica says the same. Raises `Unavailable`."""
        if not self.paced:
            return 0.0
        return (await self.store.held(self.keys)).get(BOT_SCOPE, 0) / 1000

    async def stop(self) -> None:
        """Give up the places of every reply still waiting, and record the answers pending."""
        await self.pacer.stop()

    # Inside

    def _clamped(self, scope: str, retry_after_s: float) -> float:
        """A 429's retry_after within [MIN_HOLD_S, MAX_HOLD_S]; one outside is logged, once a
        process for each way it can be wrong."""
        held_s = min(max(retry_after_s, MIN_HOLD_S), MAX_HOLD_S)
        if held_s != retry_after_s:
            wrong = "long" if retry_after_s > MAX_HOLD_S else "short"
            if wrong not in self._told:
                self._told.add(wrong)
                log.warning(
                    "the platform asked to wait %gs after a 429 on %s; holding it %gs instead "
                    "(told once)",
                    retry_after_s,
                    scope,
                    held_s,
                )
        return held_s

    async def _preview(self, conversation: str, call: Call) -> tuple[Slot | None, Taken | None]:
        """A preview's slot, or the answer that shed it (on any store failure too): (slot,
        None) granted, (None, taken) shed, (None, None) not paced."""
        scopes = self.scopes(conversation, call)
        if not scopes:
            return None, None
        shed = self._shed_here(call, scopes)
        if shed is not None:
            self.stats.shed[call] += 1
            return None, shed
        grant = secrets.token_hex(8)
        taken = await self.pacer.preview(Ask(scopes, call, "-", 0, grant))
        if taken.status == "granted":
            return Slot(grant, scopes), None
        self.stats.shed[call] += 1
        self._shed_for(call, taken)
        return None, taken

    def _shed_here(self, call: Call, scopes: tuple[Scope, ...]) -> Taken | None:
        """A preview shed without asking the store, or None: the store would shed it, as a
        reply of this replica waits for one of its scopes (no preview while a reply waits),
        or it shed a preview of its kind in one of them lately and said when there may be
        room again."""
        waited_for = self.pacer.waited_for(scopes)
        if waited_for is not None:
            return Taken("shed", 0, waited_for, False)
        now = time.monotonic()
        for scope in scopes:
            until = self._shed_until.get((call, scope.name), 0.0)
            if until > now:
                return Taken("shed", round((until - now) * 1000), scope.name, False)
        return None

    def _shed_for(self, call: Call, taken: Taken) -> None:
        """Remember until when the store sheds previews of this kind in the scope that shed
        this one."""
        now = time.monotonic()
        if len(self._shed_until) >= SHED_REMEMBERED:
            self._shed_until = {
                shed: until for shed, until in self._shed_until.items() if until > now
            }
            if len(self._shed_until) >= SHED_REMEMBERED:
                self._shed_until.clear()
        self._shed_until[call, taken.scope] = now + taken.wait_ms / 1000

    async def _previewed(self, slot: Slot | None, call: Awaitable[None]) -> None:
        """Make a preview's call in its slot; a 429 holds previews alone, for every replica
        (replies never wait for a preview's sake)."""
        try:
            await call
        except Throttled as exc:
            await self.throttled(PREVIEWS_SCOPE, exc.retry_after_s)
            raise
        finally:
            if slot is not None:
                self.pacer.stamp(slot, used=True)


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

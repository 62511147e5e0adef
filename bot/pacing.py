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
  a dead replica's places lapse within `TICKET_TTL_MS`.
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
import contextlib
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field

from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.drafts import drafts_of
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
from bot.store import Ask, BudgetKeys, Store, Taken
from bot.store.budget import IN_FLIGHT_MS, TICKET_TTL_MS

log = logging.getLogger(__name__)

# 429s in a row for one message before its send fails (transient: the core backs the reply
# off across replicas and tries again, a bounded number of times).
THROTTLED_ATTEMPTS = 5
# A slot taken by `turn` and not used within this long is given back rather than trusted:
# the store stops counting a call in flight after IN_FLIGHT_MS.
SLOT_FRESH_S = IN_FLIGHT_MS / 1000 / 2
# A preview asks the store at most this long; a message's turn may take longer, but each ask
# is bounded by the store client's own timeout.
PREVIEW_TIMEOUT_S = 2.0
# A message's turn asked again through a store outage, backed off from the first delay to the
# cap, for this long in a row before its wait fails (`Unavailable`: the reply stays in its
# outbox, and the cycle is backed off across replicas).
OUTAGE_FIRST_S = 0.05
OUTAGE_CAP_S = 0.5
OUTAGE_S = 20.0
# A waiting reply asks again at least this often, however long its wait (a hold of hours).
MAX_SLEEP_S = 60.0
# How often a replica keeps the tickets of its waiting replies alive: well within their TTL.
KEEP_EVERY_S = TICKET_TTL_MS / 1000 / 3
# The most waiting replies asked for in one store call, the first in line (the script's time
# grows with them, and the server serves nothing else meanwhile); the others' places are kept
# alive meanwhile, and they are asked for once those ahead have gone.
ASK_AT_MOST = 128
# Previews a replica has heard are shed in a scope, by scope: no more are asked for there
# until the store said the scope may have room again. Past this many scopes remembered, the
# ones whose time has passed are forgotten.
SHED_REMEMBERED = 1024
# Leaving the queue is bounded: a store out of reach lets the ticket lapse instead.
LEAVE_TIMEOUT_S = 2.0
# A retry_after outside these bounds is the platform's mistake (or a hostile proxy's): a hold
# is at least a second (0 or less would let the next call straight into the same 429) and at
# most an hour (the call is then tried again, and a real flood wait holds it again).
MIN_HOLD_S = 1.0
MAX_HOLD_S = 3600.0
# A bot-wide hold longer than this is reported by /healthz and `lastword status`.
HELD_LONG_S = 30.0


@dataclass
class PacingStats:
    """What pacing did on this replica, by scope kind ("bot", "chat", ...) or call; `calls`,
    the budget's store calls by script (take, done, keep, leave, hold; a preview's take as
    take_draft or take_typing)."""

    waits: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    shed: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    throttled: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    held_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass(frozen=True)
class Slot:
    """A call the budget allowed: its id in each scope, when it was allowed, and whether the
    message had to wait for it (then newer messages may have come meanwhile)."""

    grant: str
    scopes: tuple[Scope, ...]
    at: float = field(default_factory=time.monotonic)
    waited: bool = False


@dataclass(eq=False)
class _Waiting:
    """A reply of this replica waiting its turn: its ask, where its slot is handed over, when
    the pacer asks for it next (monotonic; 0.0: at once), the scope that stopped it last and
    what it waited on, whether the store holds its place (a ticket to give back if it stops
    waiting) and whether its last ask's answer was lost (it may have been granted)."""

    ask: Ask
    slot: asyncio.Future[Slot]
    began: float = field(default_factory=time.monotonic)
    due: float = 0.0
    scope: str = ""
    waited_on: set[str] = field(default_factory=set)
    placed: bool = False
    unsure: bool = False


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
        # This replica's replies waiting their turn, by grant; the task that asks for them
        # runs while there are any, and is woken early by `_nudge`.
        self._waiting: dict[str, _Waiting] = {}
        self._pacer: asyncio.Task[None] | None = None
        self._nudge = asyncio.Event()
        # Places given back and answers recorded in tasks of their own (`_leave`, `_done`),
        # which `stop` waits for.
        self._leaving: set[asyncio.Task[None]] = set()
        # The store's count of places and slots given back early, as last seen.
        self._freed: int | None = None
        # Until when (monotonic) previews are shed in a scope without asking, by scope.
        self._shed_until: dict[str, float] = {}
        # Whether this replica has used the budget yet (a budget found without its epoch
        # afterwards lost its keys: bot.store.budget).
        self._seen = False
        self._told: set[str] = set()

    @property
    def waiting(self) -> int:
        """How many of this replica's replies have been told to wait their turn, now."""
        return sum(1 for waiting in self._waiting.values() if waiting.placed)

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
        outage it is asked for again, backed off, and raises `Unavailable` once the outage has
        lasted OUTAGE_S. Cancelled or failing, it gives its place in the queue back."""
        scopes = self.scopes(conversation, "message")
        if not scopes:
            return None
        person, fair = shared_fairly(conversation, scopes)
        # The ticket is the conversation's own (one reply of a conversation waits at a time);
        # one grant id for every ask of this turn: an ask made again after its answer was lost
        # is granted the slot the lost answer may have granted, not a second one.
        grant = secrets.token_hex(8)
        ask = Ask(scopes, "message", conversation, order_ms, grant, person, fair)
        waiting = _Waiting(ask, asyncio.get_running_loop().create_future())
        waiting.due = self._known_wait(waiting)
        self._waiting[grant] = waiting
        if not waiting.due:
            self._nudge.set()
        if self._pacer is None or self._pacer.done():
            self._pacer = asyncio.create_task(self._pace(), name="outbound budget pacer")
        try:
            return await waiting.slot
        except BaseException:
            if waiting.placed:
                self._leave(conversation, scopes)
            if waiting.unsure:
                # An ask whose answer was lost may have been granted: its slot given back.
                self._done_in_background(Slot(grant, scopes), used=False)
            raise
        finally:
            self._waiting.pop(grant, None)

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
                await self.throttled(exc.scope, exc.retry_after_s, inferred=exc.inferred)
                if attempt == THROTTLED_ATTEMPTS:
                    raise
                if not self.paced:
                    # No budget to wait in: waited out here, as told.
                    await asyncio.sleep(self._clamped(exc.scope, exc.retry_after_s))
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
        """Stop asking for the replies still waiting (they fail as `Unavailable`, and give
        their places back), and wait for the places and answers being given back."""
        if self._pacer is not None:
            await cancel_and_wait(self._pacer)
        self._fail(list(self._waiting.values()), Unavailable("this replica is stopping"))
        # Their turns run their clean-up (giving their places back) before it is waited for.
        await asyncio.sleep(0)
        if self._leaving:
            _, late = await asyncio.wait(set(self._leaving), timeout=LEAVE_TIMEOUT_S)
            for task in late:
                await cancel_and_wait(task)

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

    def _known_wait(self, waiting: _Waiting) -> float:
        """When a new reply is worth asking for, by what this replica already knows (0.0: at
        once): not before a reply here that is ahead of it and stopped by a scope it needs
        too (it cannot pass that one there). A scope shared fairly may place the one ahead
        behind it, so it does not count."""
        names = {scope.name for scope in waiting.ask.scopes}
        return min(
            (
                other.due
                for other in self._waiting.values()
                if other.scope in names
                and other.scope not in other.ask.fair
                and other.ask.order_ms <= waiting.ask.order_ms
            ),
            default=0.0,
        )

    async def _pace(self) -> None:
        """Ask for this replica's waiting replies, in one store call, whenever the first of
        them may be granted (told so by the store, a slot given back early, a new reply that
        may go at once); between asks, keep their places alive in one call every
        KEEP_EVERY_S, and place the new ones in the queue. Through a store outage it asks
        again, backed off, and a reply whose wait has met OUTAGE_S of it fails `Unavailable`.
        It never dies of a failure: an unexpected one fails the replies asked for (their
        cycles try again, backed off)."""
        outage = Backoff(OUTAGE_FIRST_S, OUTAGE_CAP_S, jitter=0.5)
        down_since: float | None = None
        kept_at = time.monotonic()
        while self._waiting:
            now = time.monotonic()
            waiting = [one for one in self._waiting.values() if not one.slot.done()]
            if not waiting:
                await asyncio.sleep(0)  # their turns are ending: they leave the queue
                continue
            keep_now = now - kept_at >= KEEP_EVERY_S
            if all(one.due > now for one in waiting):
                if not keep_now:
                    await self._sleep(min(one.due for one in waiting), kept_at + KEEP_EVERY_S)
                    continue
                if all(one.placed for one in waiting):
                    kept_at = now
                    await self._keep(waiting)
                    continue
            # The first in line, those due (or new) before the others; the rest wait their
            # places meanwhile.
            waiting.sort(key=lambda one: (one.placed and one.due > now, one.ask.order_ms))
            asked, rest = waiting[:ASK_AT_MOST], waiting[ASK_AT_MOST:]
            if keep_now and rest:
                await self._keep([one for one in rest if one.placed])
            try:
                self.stats.calls["take"] += 1
                answers = await self.store.take_all(
                    self.keys, [one.ask for one in asked], seen=self._seen
                )
            except Unavailable as exc:
                now = time.monotonic()
                down_since = down_since or now
                for one in asked:
                    one.unsure = True
                self._fail(
                    [one for one in waiting if now - max(down_since, one.began) >= OUTAGE_S], exc
                )
                log.info("the outbound budget is out of reach (%s); asking again", exc)
                await asyncio.sleep(outage.next_delay())
                continue
            except Exception as exc:
                log.exception("asking the budget for %d waiting replies failed", len(asked))
                self._fail(asked, exc)
                await asyncio.sleep(outage.next_delay())
                continue
            self._seen = True
            down_since = None
            outage.reset()
            now = time.monotonic()
            if keep_now or not rest:
                kept_at = now
            for one, taken in zip(asked, answers, strict=True):
                self._answered(one, taken, now)

    def _answered(self, waiting: _Waiting, taken: Taken, now: float) -> None:
        """The store's answer for one waiting reply: its slot handed over, or when to ask
        again. A reply that stopped waiting meanwhile gives back a slot granted to it."""
        self._freed = max(self._freed or 0, taken.freed)
        waiting.unsure = False
        if waiting.slot.done():
            # It stopped waiting (cancelled, or failed by an outage) while asked for.
            if taken.status == "granted":
                self._done_in_background(Slot(waiting.ask.grant, waiting.ask.scopes), used=False)
            return
        if taken.status == "granted":
            for kind in waiting.waited_on:
                self.stats.wait_s[kind] += now - waiting.began
            slot = Slot(waiting.ask.grant, waiting.ask.scopes, waited=waiting.placed)
            waiting.slot.set_result(slot)
            waiting.placed = False
            # Not asked for again before its turn has taken the slot.
            del self._waiting[waiting.ask.grant]
            return
        waiting.placed = True
        waiting.scope = taken.scope
        waiting.due = now + min(taken.wait_ms / 1000, MAX_SLEEP_S)
        kind = kind_of(taken.scope)
        if kind not in waiting.waited_on:
            waiting.waited_on.add(kind)
            self.stats.waits[kind] += 1

    def _fail(self, waiting: Sequence[_Waiting], exc: BaseException) -> None:
        """`waiting` stop waiting, failing with `exc` (their turns give their places back)."""
        for one in waiting:
            if not one.slot.done():
                one.slot.set_exception(exc)
            self._waiting.pop(one.ask.grant, None)

    async def _sleep(self, until: float, keep_at: float) -> None:
        """Sleep until the first waiting reply is due or their places need keeping, or until
        nudged (a new reply that may go at once)."""
        self._nudge.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, min(until, keep_at) - time.monotonic())):
                await self._nudge.wait()

    async def _keep(self, waiting: Sequence[_Waiting]) -> None:
        """Keep the places of `waiting` alive, in one store call however many; when places
        or slots were given back early on any replica since the last call, those waiting may
        come sooner than told: they are asked for at once. A failure only loses places for a
        while: they are taken again at the next ask."""
        if not waiting:
            return
        try:
            self.stats.calls["keep"] += 1
            freed = await self.store.keep(self.keys, [one.ask.ticket for one in waiting])
        except Unavailable as exc:
            log.debug("could not keep the waiting replies' places: %s", exc)
            return
        except Exception:
            log.exception("keeping the waiting replies' places failed")
            return
        if self._freed is not None and freed > self._freed:
            for one in waiting:
                one.due = 0.0
        self._freed = freed

    def _leave(self, ticket: str, scopes: Sequence[Scope]) -> None:
        """Give `ticket`'s place back now, in a task of its own: its turn is being cancelled,
        and whatever cancels it must not wait for the store."""
        task = asyncio.ensure_future(self._left(ticket, scopes))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _left(self, ticket: str, scopes: Sequence[Scope]) -> None:
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                self.stats.calls["leave"] += 1
                await self.store.leave(self.keys, scopes, ticket)
        except (Unavailable, TimeoutError) as exc:
            log.info("could not give back the place of %s (%s); it lapses", ticket, exc)
        except Exception:
            log.exception("giving back the place of %s failed; it lapses", ticket)

    async def _preview(self, conversation: str, call: Call) -> tuple[Slot | None, Taken | None]:
        """A preview's slot, or the answer that shed it (on any store failure too): (slot,
        None) granted, (None, taken) shed, (None, None) not paced."""
        scopes = self.scopes(conversation, call)
        if not scopes:
            return None, None
        shed = self._shed_here(scopes)
        if shed is not None:
            self.stats.shed[call] += 1
            return None, shed
        grant = secrets.token_hex(8)
        ask = Ask(scopes, call, "-", 0, grant)
        try:
            async with asyncio.timeout(PREVIEW_TIMEOUT_S):
                self.stats.calls[f"take_{call}"] += 1
                (taken,) = await self.store.take_all(self.keys, [ask], seen=self._seen)
            self._seen = True
        except (Unavailable, TimeoutError):
            # The ask may have been granted and only its answer lost: its slot given back once
            # the store answers, rather than left in flight.
            self._done_in_background(Slot(grant, scopes), used=False)
            taken = Taken("shed", 0, "store", False)
        if taken.status == "granted":
            return Slot(grant, scopes), None
        self.stats.shed[call] += 1
        self._shed_for(taken)
        return None, taken

    def _shed_here(self, scopes: Sequence[Scope]) -> Taken | None:
        """A preview shed without asking the store, or None: the store would shed it, as a
        reply of this replica waits for one of its scopes (no preview while a reply waits),
        or it shed a preview in one of them lately and said when there may be room again."""
        names = {scope.name for scope in scopes}
        for waiting in self._waiting.values():
            if waiting.placed and waiting.scope in names:
                return Taken("shed", 0, waiting.scope, False)
        now = time.monotonic()
        for name in names:
            until = self._shed_until.get(name, 0.0)
            if until > now:
                return Taken("shed", round((until - now) * 1000), name, False)
        return None

    def _shed_for(self, taken: Taken) -> None:
        """Remember until when the store sheds previews in the scope that shed this one."""
        now = time.monotonic()
        if len(self._shed_until) >= SHED_REMEMBERED:
            self._shed_until = {
                name: until for name, until in self._shed_until.items() if until > now
            }
            if len(self._shed_until) >= SHED_REMEMBERED:
                self._shed_until.clear()
        self._shed_until[taken.scope] = now + taken.wait_ms / 1000

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
                await self._done(slot, used=True)

    async def _done(self, slot: Slot, *, used: bool) -> None:
        """Record a granted call's answer (or its slot given back). With the store out of
        reach it is recorded once the store is back, in a task of its own: left in flight,
        the call would fill its slots for IN_FLIGHT_MS after a blip of a second."""
        try:
            self.stats.calls["done"] += 1
            await self.store.done(self.keys, slot.scopes, slot.grant, used=used)
        except Unavailable as exc:
            log.info("could not record a call's answer in the budget yet (%s)", exc)
            self._done_in_background(slot, used=used)

    def _done_in_background(self, slot: Slot, *, used: bool) -> None:
        task = asyncio.ensure_future(self._done_later(slot, used=used))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _done_later(self, slot: Slot, *, used: bool) -> None:
        """`_done` again, backed off, for up to OUTAGE_S; counted from when it is recorded, so
        later than the platform's answer: slower, never faster."""
        backoff = Backoff(OUTAGE_FIRST_S, OUTAGE_CAP_S, jitter=0.5)
        began = time.monotonic()
        while time.monotonic() - began < OUTAGE_S:
            await asyncio.sleep(backoff.next_delay())
            try:
                self.stats.calls["done"] += 1
                await self.store.done(self.keys, slot.scopes, slot.grant, used=used)
                return
            except Unavailable:
                continue
            except Exception:
                log.exception("recording a call's answer in the budget failed")
                return
        log.info("gave up recording a call's answer: it stays in flight until IN_FLIGHT_MS")


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

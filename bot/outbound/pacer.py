"""The pacer: one task a replica that talks to the outbound budget for all of the replica's
calls at once (`bot.outbound.pacing.Paced` is what the cycle sees).

Each store call carries whatever is pending when it goes: the answers of calls made since the
last one (stamps), the previews asking to go now, and the waiting replies that are due, the
first in line first (`bot.store.budget`'s `budget_take`). A call goes at once, unless the last
went less than GATHER_S ago or is still on its way: then what comes meanwhile gathers, so a
busy replica makes at most one call each GATHER_S however many platform calls it makes, and a
quiet one waits for nothing. A waiting reply is asked for again when the store said its slot can
come, when a slot was given back early on any replica, or when a new reply might go at once;
none of them polls. Between asks one call keeps all the waiting replies' places (their
tickets) alive, and the calls granted but not answered yet in flight, so a dead replica's
places and calls lapse within `LAPSE_MS` (a call kept for IN_FLIGHT_MS, the longest a call may
take, lapses too: a slot never answered is not held for ever).

Through a store outage the pacer asks again, backed off: a reply waits (and fails
`Unavailable` once the outage has lasted OUTAGE_S: it stays in its outbox, and the cycle
backs off across replicas), a preview is shed, and an answer is recorded once the store is
back (slower, never faster: it counts from when it is recorded). Whatever it meets, the task
does not die: an unexpected failure fails what it asked for, logged, and it goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.message import Scope, Unavailable, kind_of
from bot.store import Ask, BudgetKeys, InFlight, Stamp, Store, Taken
from bot.store.budget import IN_FLIGHT_MS, LAPSE_MS

log = logging.getLogger(__name__)

# A preview waits for its answer at most this long; a message's turn may take longer, but each
# store call is bounded by the store client's own timeout.
PREVIEW_TIMEOUT_S = 2.0
# The store asked again through an outage, backed off from the first delay to the cap; a reply
# whose wait has met this long of it fails (`Unavailable`), and an answer not recorded by then
# is given up (its call stays in flight until IN_FLIGHT_MS).
OUTAGE_FIRST_S = 0.05
OUTAGE_CAP_S = 0.5
OUTAGE_S = 20.0
# A waiting reply is asked for at least this often, however long its wait (a hold of hours).
MAX_SLEEP_S = 60.0
# How often the waiting replies' tickets, and the calls in flight, are kept alive: well within
# the time they lapse in.
KEEP_EVERY_S = LAPSE_MS / 1000 / 3
# The most waiting replies asked for in one store call, the first in line (the script's time
# grows with them, and the server serves nothing else meanwhile); the others' places are kept
# alive meanwhile, and they are asked for once those ahead have gone.
ASK_AT_MOST = 128
# The most answers recorded in one store call (the rest go in the next).
STAMP_AT_MOST = 256
# A store call goes at once when the last one went at least this long ago; else what comes
# meanwhile gathers until then: a busy replica makes at most one call this often, however
# many calls of the platform it makes, and a quiet one waits for nothing.
GATHER_S = 0.02
# Giving a place back is bounded: a store out of reach lets the ticket lapse instead.
LEAVE_TIMEOUT_S = 2.0


@dataclass
class PacingStats:
    """What pacing did on this replica, by scope kind ("bot", "chat", ...) or call; `calls`,
    the budget's store calls by script (take: asks and answers together; keep, leave, hold);
    `asked`, the calls asked for in them (message, draft, typing); `recorded`, the calls'
    answers recorded in them (used, or given back)."""

    waits: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    wait_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    shed: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    throttled: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    held_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    asked: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    recorded: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))


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
    """A reply waiting its turn: its ask, where its slot is handed over, when it is asked for
    next (monotonic; 0.0: at once), the scope that stopped it last and the kinds it waited on,
    whether the store holds its place (a ticket to give back if it stops waiting) and whether
    its last ask's answer was lost (it may have been granted)."""

    ask: Ask
    slot: asyncio.Future[Slot]
    began: float = field(default_factory=time.monotonic)
    due: float = 0.0
    scope: str = ""
    waited_on: set[str] = field(default_factory=set)
    placed: bool = False
    unsure: bool = False


@dataclass(eq=False)
class _Flying:
    """A call granted and not answered yet: when it was granted, and when last kept in flight
    (monotonic)."""

    call: InFlight
    granted: float
    kept: float


@dataclass(eq=False)
class _Preview:
    """A preview asking to go now, and where its answer is handed over."""

    ask: Ask
    answer: asyncio.Future[Taken]


class Pacer:
    """A replica's calls to one outbound budget (`keys`), gathered into as few store calls as
    the store's round trips allow."""

    def __init__(self, store: Store, keys: BudgetKeys, stats: PacingStats) -> None:
        self.store = store
        self.keys = keys
        self.stats = stats
        self._waiting: dict[str, _Waiting] = {}  # by grant
        self._previews: list[_Preview] = []
        self._stamps: list[tuple[Stamp, float]] = []  # with when each was made
        self._flying: dict[str, _Flying] = {}  # by grant
        self._task: asyncio.Task[None] | None = None
        self._nudge = asyncio.Event()
        # Places given back in tasks of their own (`_leave`), which `stop` waits for.
        self._leaving: set[asyncio.Task[None]] = set()
        # The store's count of places and slots given back early, as last seen.
        self._freed: int | None = None
        # When the last store call went (monotonic): the next gathers until GATHER_S after.
        self._called_at = 0.0
        # Whether this replica has used the budget yet (a budget found without its epoch
        # afterwards lost its keys: bot.store.budget).
        self._seen = False

    @property
    def waiting(self) -> int:
        """How many of this replica's replies have been told to wait their turn, now."""
        return sum(1 for waiting in self._waiting.values() if waiting.placed)

    def waited_for(self, scopes: Sequence[Scope]) -> str | None:
        """One of `scopes` that a reply of this replica waits for, if any."""
        names = {scope.name for scope in scopes}
        for waiting in self._waiting.values():
            if waiting.placed and waiting.scope in names:
                return waiting.scope
        return None

    async def turn(self, ask: Ask) -> Slot:
        """`ask` (a message) waits until it is granted. Through a store outage it waits on,
        and raises `Unavailable` once the outage has lasted OUTAGE_S. Cancelled or failing, it
        gives its place in the queue back."""
        waiting = _Waiting(ask, asyncio.get_running_loop().create_future())
        waiting.due = self._known_wait(waiting)
        self._waiting[ask.grant] = waiting
        self._wake(now=not waiting.due)
        try:
            return await waiting.slot
        except BaseException:
            if waiting.placed:
                self._leave(ask)
            if waiting.unsure:
                # An ask whose answer was lost may have been granted: its slot given back.
                self.stamp(Slot(ask.grant, ask.scopes), used=False)
            raise
        finally:
            self._waiting.pop(ask.grant, None)

    async def preview(self, ask: Ask) -> Taken:
        """May `ask` (a preview) go now? Shed ("store") if the store does not answer within
        PREVIEW_TIMEOUT_S or fails."""
        preview = _Preview(ask, asyncio.get_running_loop().create_future())
        self._previews.append(preview)
        self._wake(now=True)
        try:
            async with asyncio.timeout(PREVIEW_TIMEOUT_S):
                return await preview.answer
        except TimeoutError:
            with contextlib.suppress(ValueError):
                self._previews.remove(preview)
            # The ask may be on its way and granted: its slot given back (`_answered`).
            return Taken("shed", 0, "store", False)

    def stamp(self, slot: Slot, *, used: bool) -> None:
        """Record that the call granted as `slot` was answered (`used`), or never made, with
        the next store call (at once if none is on its way)."""
        self._flying.pop(slot.grant, None)
        self._stamps.append((Stamp(slot.grant, slot.scopes, used), time.monotonic()))
        self._wake(now=True)

    async def stop(self) -> None:
        """Fail the replies still waiting (`Unavailable`: they give their places back), shed
        the previews, record the answers still pending (for up to LEAVE_TIMEOUT_S), and
        stop."""
        stopping = Unavailable("this replica is stopping")
        self._fail(list(self._waiting.values()), stopping)
        self._shed(self._previews)
        self._previews = []
        # A call still on its way is not waited for: it lapses once no longer kept.
        self._flying.clear()
        # Their turns run their clean-up (giving their places back) first.
        await asyncio.sleep(0)
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LEAVE_TIMEOUT_S):
                    await asyncio.shield(self._task)
            await cancel_and_wait(self._task)
        if self._leaving:
            _, late = await asyncio.wait(set(self._leaving), timeout=LEAVE_TIMEOUT_S)
            for task in late:
                await cancel_and_wait(task)

    # Inside

    def _wake(self, *, now: bool) -> None:
        """Make sure the task runs, and (`now`) asks without waiting for anyone's time."""
        if now:
            self._nudge.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="outbound budget pacer")

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

    async def _run(self) -> None:
        """While anything is pending: one store call with the answers to record, the previews
        and the waiting replies that are due (or new, or all of them when their places need
        keeping and some have none yet); else a call keeping their places every KEEP_EVERY_S
        and the calls in flight alive, or sleep until the first is due or something new
        comes."""
        outage = Backoff(OUTAGE_FIRST_S, OUTAGE_CAP_S, jitter=0.5)
        down_since: float | None = None
        kept_at = time.monotonic()
        while self._waiting or self._previews or self._stamps or self._flying:
            now = time.monotonic()
            waiting = [one for one in self._waiting.values() if not one.slot.done()]
            keep_now = bool(waiting) and now - kept_at >= KEEP_EVERY_S
            flying = self._flying_due(now)
            replies_due = any(one.due <= now for one in waiting) or (
                keep_now and not all(one.placed for one in waiting)
            )
            if not (replies_due or self._previews or self._stamps):
                if keep_now or flying:
                    kept_at = now
                    await self._keep(waiting, flying)
                elif waiting or self._flying:
                    await self._sleep(self._next_keep(waiting, kept_at))
                else:
                    await asyncio.sleep(0)  # their turns are ending: they leave the queue
                continue
            if now - self._called_at < GATHER_S:
                await asyncio.sleep(self._called_at + GATHER_S - now)
                continue
            self._called_at = now
            asked: list[_Waiting] = []
            rest: list[_Waiting] = []
            if replies_due:
                # The first in line, those due (or new) before the others; the rest wait their
                # places meanwhile.
                waiting.sort(key=lambda one: (one.placed and one.due > now, one.ask.order_ms))
                asked, rest = waiting[:ASK_AT_MOST], waiting[ASK_AT_MOST:]
            if (keep_now and rest) or flying:
                await self._keep([one for one in rest if one.placed] if keep_now else [], flying)
            previews, self._previews = self._previews, []
            stamps, self._stamps = self._stamps[:STAMP_AT_MOST], self._stamps[STAMP_AT_MOST:]
            self.stats.calls["take"] += 1
            for ask in (*(one.ask for one in asked), *(one.ask for one in previews)):
                self.stats.asked[ask.call] += 1
            try:
                answers = await self.store.take_all(
                    self.keys,
                    [*(one.ask for one in asked), *(one.ask for one in previews)],
                    stamps=[stamp for stamp, _ in stamps],
                    seen=self._seen,
                )
                self._took(asked, previews, [stamp for stamp, _ in stamps], answers)
            except Unavailable as exc:
                log.info("the outbound budget is out of reach (%s); asking again", exc)
                now = time.monotonic()
                down_since = down_since or now
                for one in asked:
                    one.unsure = True
                self._fail(
                    [one for one in waiting if now - max(down_since, one.began) >= OUTAGE_S], exc
                )
                self._shed(previews)
                kept = [(stamp, at) for stamp, at in stamps if now - at < OUTAGE_S]
                self._stamps[:0] = kept
                if len(kept) < len(stamps):
                    log.info("gave up recording calls' answers: they stay in flight a while")
                await asyncio.sleep(outage.next_delay())
                continue
            except Exception as exc:
                log.exception(
                    "a call to the outbound budget failed (replies %d, previews %d, answers %d)",
                    len(asked),
                    len(previews),
                    len(stamps),
                )
                self._fail(asked, exc)
                # Those already answered (an answer that failed to be taken in) keep theirs.
                self._shed([preview for preview in previews if not preview.answer.done()])
                await asyncio.sleep(outage.next_delay())
                continue
            down_since = None
            outage.reset()
            if replies_due and (keep_now or len(asked) == len(waiting)):
                kept_at = time.monotonic()

    def _took(
        self,
        asked: Sequence[_Waiting],
        previews: Sequence[_Preview],
        stamps: Sequence[Stamp],
        answers: Sequence[Taken],
    ) -> None:
        """The store's answers to one call, taken in: inside the call's `try`, so whatever
        goes wrong here too fails only what was asked, logged, and the pacer goes on."""
        self._seen = True
        now = time.monotonic()
        for stamp in stamps:
            self.stats.recorded["used" if stamp.used else "given back"] += 1
            if not stamp.used:
                self._soon()
        for one, taken in zip(asked, answers[: len(asked)], strict=True):
            self._answered(one, taken, now)
        for preview, taken in zip(previews, answers[len(asked) :], strict=True):
            if preview.answer.done():
                if taken.status == "granted":  # too late: given back
                    self.stamp(Slot(preview.ask.grant, preview.ask.scopes), used=False)
            else:
                if taken.status == "granted":
                    self._flies(preview.ask)
                preview.answer.set_result(taken)
        if answers:
            self._heard(answers[-1].freed)

    def _answered(self, waiting: _Waiting, taken: Taken, now: float) -> None:
        """The store's answer for one waiting reply: its slot handed over, or when to ask
        again. A reply that stopped waiting meanwhile gives back a slot granted to it."""
        waiting.unsure = False
        if waiting.slot.done():
            # It stopped waiting (cancelled, or failed by an outage) while asked for.
            if taken.status == "granted":
                self.stamp(Slot(waiting.ask.grant, waiting.ask.scopes), used=False)
            return
        if taken.status == "granted":
            for kind in waiting.waited_on:
                self.stats.wait_s[kind] += now - waiting.began
            slot = Slot(waiting.ask.grant, waiting.ask.scopes, waited=waiting.placed)
            self._flies(waiting.ask)
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

    def _flies(self, ask: Ask) -> None:
        """`ask` was granted: its call is in flight until its answer is recorded (`stamp`),
        counted from when the store call that granted it went."""
        call = InFlight(ask.grant, ask.scopes)
        self._flying[ask.grant] = _Flying(call, self._called_at, self._called_at)

    def _flying_due(self, now: float) -> list[_Flying]:
        """The calls in flight to keep alive now: all of them, once one has gone KEEP_EVERY_S
        unkept (one store call keeps them all). One granted IN_FLIGHT_MS ago is no longer
        kept: its answer is never coming (a call hung, a slot its turn never used), and its
        slots lapse."""
        for grant, one in list(self._flying.items()):
            if now - one.granted >= IN_FLIGHT_MS / 1000:
                del self._flying[grant]
                log.info(
                    "a call granted %.0fs ago was never answered; its slot lapses",
                    now - one.granted,
                )
        if any(now - one.kept >= KEEP_EVERY_S for one in self._flying.values()):
            return list(self._flying.values())
        return []

    def _next_keep(self, waiting: Sequence[_Waiting], kept_at: float) -> float:
        """When the pacer has something to do next, with nothing new (monotonic): the first
        waiting reply due, the waiting replies' places or a call in flight to keep."""
        return min(
            (
                *(one.due for one in waiting),
                *((kept_at + KEEP_EVERY_S,) if waiting else ()),
                *(one.kept + KEEP_EVERY_S for one in self._flying.values()),
            ),
            default=time.monotonic(),
        )

    def _heard(self, freed: int) -> None:
        """The store's count of places and slots given back early: if it grew since last
        heard, on any replica, the waiting replies may come sooner than told."""
        if self._freed is not None and freed > self._freed:
            self._soon()
        self._freed = max(self._freed or 0, freed)

    def _soon(self) -> None:
        """A slot or place came free early: every waiting reply is asked for at once."""
        for one in self._waiting.values():
            one.due = 0.0

    def _fail(self, waiting: Sequence[_Waiting], exc: BaseException) -> None:
        """`waiting` stop waiting, failing with `exc` (their turns give their places back)."""
        for one in waiting:
            if not one.slot.done():
                one.slot.set_exception(exc)
            self._waiting.pop(one.ask.grant, None)

    def _shed(self, previews: Sequence[_Preview]) -> None:
        """`previews` are shed: the store did not answer. Their asks may have been granted and
        only the answer lost: their slots are given back once the store answers."""
        for preview in previews:
            if not preview.answer.done():
                preview.answer.set_result(Taken("shed", 0, "store", False))
            self.stamp(Slot(preview.ask.grant, preview.ask.scopes), used=False)

    async def _sleep(self, until: float) -> None:
        """Sleep until `until` (monotonic), or until nudged (something new to ask at once)."""
        self._nudge.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, until - time.monotonic())):
                await self._nudge.wait()

    async def _keep(self, waiting: Sequence[_Waiting], flying: Sequence[_Flying] = ()) -> None:
        """Keep the places of `waiting` and the calls `flying` alive, in one store call however
        many. A failure only loses them for a while: a place is taken again at the next ask,
        and a call lapses (counted as made then) until kept again."""
        if not waiting and not flying:
            return
        now = time.monotonic()
        for one in flying:
            one.kept = now
        try:
            self.stats.calls["keep"] += 1
            freed = await self.store.keep(
                self.keys, [one.ask.ticket for one in waiting], [one.call for one in flying]
            )
        except Unavailable as exc:
            log.debug("could not keep the waiting replies' places: %s", exc)
            return
        except Exception:
            log.exception("keeping the waiting replies' places failed")
            return
        self._heard(freed)

    def _leave(self, ask: Ask) -> None:
        """Give `ask`'s place back now, in a task of its own: its turn is being cancelled, and
        whatever cancels it must not wait for the store."""
        task = asyncio.ensure_future(self._left(ask))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _left(self, ask: Ask) -> None:
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                self.stats.calls["leave"] += 1
                await self.store.leave(self.keys, ask.scopes, ask.ticket)
        except (Unavailable, TimeoutError) as exc:
            log.info("could not give back the place of %s (%s); it lapses", ask.ticket, exc)
        except Exception:
            log.exception("giving back the place of %s failed; it lapses", ask.ticket)

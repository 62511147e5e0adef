"""The outbound budget of a platform's bot, shared by every replica: may calls go out now,
and if not, when, and which calls were answered or never made (`budget_take`, for any number
of each at once); a 429 heard (`budget_hold`); the tickets of a replica's waiting replies
kept alive (`budget_keep`), or given up (`budget_leave`). All of a platform's budget keys share
one hash tag (`BudgetKeys`), so one script sees the bot-wide limit and the chat's together, on
a Cluster too.

A scope that several people's replies draw on (a group's) may be shared fairly between them:
each person takes its slots at most at their share of its rate, and a person who has had their
share waits behind those who have not, so one member flooding a group delays another by about
one slot's interval (budget_take.lua)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from bot.message import BOT_SCOPE, PREVIEWS_SCOPE, Scope
from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import BudgetKeys
from bot.store.replies import as_text, decoded

# The longest a call may take: its replica keeps a call granted in flight (`Budget.keep`) until
# it is answered, for up to this long.
IN_FLIGHT_MS = 30_000
# A waiting reply's place, or a call in flight, not kept alive for this long (its replica
# died) lapses: the place goes to those behind, and the call counts as made then (the platform
# saw it before, if at all), so a dead replica holds others' replies about this long, not
# IN_FLIGHT_MS. A replica keeps its places and calls alive more often than this.
LAPSE_MS = 2_000
# A fair bound on how long a platform takes to answer a call: a slot whose call is in flight
# (or will be made by a reply ahead) is told to come this much after it could at the soonest.
POLL_MS = 100
# A budget's epoch outlives its last call this long: a budget idle for longer starts free.
EPOCH_KEEP_MS = 86_400_000
# A platform that does not say what a 429 is about (Telegram): 429s in this many different
# chats within SPREAD_MS hold the whole bot, not just those chats.
SPREAD_COUNT = 3
SPREAD_MS = 5_000
# The 429 counters every replica reads (`heard`) are kept this long after the last 429.
HEARD_KEEP_MS = 86_400_000
# In a scope shared fairly (a group's), the slots a person may take at once, ahead of their
# share's pace: a quick exchange with the bot in a quiet group (a command's answer, then the
# reply) is not spread out; past them, a flood is paced, so a group's slots keep freeing for
# the others.
FAIR_BURST = 3
# The share of a scope that a preview must leave free: replies first, then drafts, then
# typing indicators (a third and a half of the bot-wide budget kept for what comes first).
KEEP_FREE_PCT = {"message": 0, "draft": 34, "typing": 50}


@dataclass(frozen=True)
class Taken:
    """budget_take.lua's answer to one ask. `status`: granted, wait (a message: ask again in
    `wait_ms`) or shed (a preview); `scope` and `held`: what stopped the call, and whether
    a 429's hold did; `freed`: how many places were given back early so far (`Budget.keep`)."""

    status: Literal["granted", "wait", "shed"]
    wait_ms: int
    scope: str
    held: bool
    freed: int = 0


@dataclass(frozen=True)
class Ask:
    """One call asking for its turn (`Budget.take_all`): `call` under every scope in `scopes`,
    recorded as `grant` if granted. A message that must wait joins the queue under `ticket`,
    placed by `order_ms` (server clock: when its window closed; 0 for a part already
    promised), and keeps its place while its ticket is kept alive (`keep`). The scopes named
    in `fair` are shared fairly between people, the message being for `person`."""

    scopes: tuple[Scope, ...]
    call: Literal["message", "draft", "typing"]
    ticket: str
    order_ms: int
    grant: str
    person: str = ""
    fair: Collection[str] = ()


@dataclass(frozen=True)
class InFlight:
    """A call granted as `grant` under `scopes` and not answered yet (`Budget.keep`)."""

    grant: str
    scopes: tuple[Scope, ...]


@dataclass(frozen=True)
class Stamp:
    """The answer of a call granted as `grant` (`Budget.take_all`): `used`, it was made, and
    counts from now in each of its scopes' windows; else it never was, its slots given back."""

    grant: str
    scopes: tuple[Scope, ...]
    used: bool


class Budget(Calls):
    async def take_all(
        self,
        keys: BudgetKeys,
        asks: Sequence[Ask],
        *,
        stamps: Sequence[Stamp] = (),
        burst: int = FAIR_BURST,
        seen: bool = False,
    ) -> list[Taken]:
        """Record `stamps` (answers of calls granted before), then: may each of `asks` go out
        now? In one call however many there are, in their order (each sees the slots the ones
        before it took): a replica's waiting replies, previews and answers go together. A
        person may run `burst` slots ahead of their pace in a scope shared fairly. `seen`: the
        caller has used this budget before, so a budget without its epoch lost its keys, and
        starts cautiously."""
        script = scripts.BUDGET_TAKE
        named = {
            "tickets": keys.tickets,
            "holds": keys.holds,
            "epoch": keys.epoch,
            "previews_hold": keys.scope(PREVIEWS_SCOPE)[2],
            "freed": keys.freed,
        }
        args = {
            "in_flight_ms": IN_FLIGHT_MS,
            "lapse_ms": LAPSE_MS,
            "poll_ms": POLL_MS,
            "fair_burst": burst,
            "epoch_keep_ms": EPOCH_KEEP_MS,
            "seen": int(seen),
        }
        rest: list[str | int] = [len(stamps)]
        scope_keys: list[str] = []
        for stamp in stamps:
            rest += (stamp.grant, int(stamp.used), len(stamp.scopes))
            scope_keys += (keys.scope(scope.name)[0] for scope in stamp.scopes)
        for ask in asks:
            rest += (
                "reply" if ask.call == "message" else "preview",
                ask.ticket,
                ask.order_ms,
                ask.grant,
                ask.person,
                KEEP_FREE_PCT[ask.call],
                len(ask.scopes),
            )
            for scope in ask.scopes:
                rest += (
                    scope.name,
                    scope.count,
                    max(1, round(scope.per_s * 1000)),
                    int(scope.name in ask.fair),
                )
                scope_keys += (*keys.scope(scope.name), keys.people(scope.name))
        reply = decoded(await self._run(script, named, args, rest, scope_keys))
        freed = int(reply["freed"])
        return [
            Taken(
                answer["status"],
                int(answer["wait_ms"]),
                str(answer["scope"]),
                bool(answer["held"]),
                freed,
            )
            for answer in reply["answers"]
        ]

    async def take(
        self,
        keys: BudgetKeys,
        scopes: Sequence[Scope],
        *,
        call: Literal["message", "draft", "typing"],
        ticket: str,
        order_ms: int,
        grant: str,
        person: str = "",
        fair: Collection[str] = (),
        burst: int = FAIR_BURST,
        seen: bool = False,
    ) -> Taken:
        """May one call go out now (`Ask`, `take_all`)?"""
        ask = Ask(tuple(scopes), call, ticket, order_ms, grant, person, fair)
        (taken,) = await self.take_all(keys, [ask], burst=burst, seen=seen)
        return taken

    async def done(
        self, keys: BudgetKeys, scopes: Sequence[Scope], grant: str, *, used: bool
    ) -> None:
        """The call granted as `grant` was answered (`used`), or never made (`Stamp`)."""
        await self.take_all(keys, [], stamps=[Stamp(grant, tuple(scopes), used)], seen=True)

    async def hold(
        self, keys: BudgetKeys, scope: str, hold_ms: int, *, spread: bool = False
    ) -> bool:
        """No call under `scope` for `hold_ms`, on any replica (a 429's retry_after). `spread`:
        the platform did not say what the 429 was about and `scope` is a guess (the call's
        chat); several such within SPREAD_MS hold the bot's scope too. True if they did."""
        script = scripts.BUDGET_HOLD
        named = {
            "hold": keys.scope(scope)[2],
            "holds": keys.holds,
            "heard": keys.heard,
            "recent": keys.recent,
            "bot_hold": keys.scope(BOT_SCOPE)[2],
        }
        args: dict[str, str | int] = {
            "scope": scope,
            "hold_ms": max(1, hold_ms),
            "spread": int(spread),
            "spread_count": SPREAD_COUNT,
            "spread_ms": SPREAD_MS,
            "bot_scope": BOT_SCOPE,
            "heard_keep_ms": HEARD_KEEP_MS,
        }
        return bool(decoded(await self._run(script, named, args))["widened"])

    async def keep(
        self, keys: BudgetKeys, tickets: Sequence[str], calls: Sequence[InFlight] = ()
    ) -> int:
        """The replies waiting under `tickets` still wait, and `calls` are still on their way:
        their places are kept and the calls kept in flight (and lapsed places dropped).
        Returns how many places and slots have been given back early, or lapsed, so far (a
        count that only grows, but for a store that lost it)."""
        named = {"tickets": keys.tickets, "freed": keys.freed}
        args = {"lapse_ms": LAPSE_MS, "freed_keep_ms": EPOCH_KEEP_MS}
        rest: list[str | int] = [len(tickets), *tickets]
        sent: list[str] = []
        for call in calls:
            rest += (call.grant, len(call.scopes))
            sent += (keys.scope(scope.name)[0] for scope in call.scopes)
        return int(await self._run(scripts.BUDGET_KEEP, named, args, rest, sent))

    async def leave(self, keys: BudgetKeys, scopes: Sequence[Scope], ticket: str) -> None:
        """The reply waiting under `ticket` stopped waiting: its place goes to those behind."""
        queues = [keys.scope(scope.name)[1] for scope in scopes]
        named = {"tickets": keys.tickets, "freed": keys.freed}
        args: dict[str, str | int] = {"ticket": ticket, "freed_keep_ms": EPOCH_KEEP_MS}
        await self._run(scripts.BUDGET_LEAVE, named, args, rest_keys=queues)

    async def heard(self, keys: BudgetKeys) -> dict[str, tuple[int, int]]:
        """The 429s heard by every replica lately, by the kind of scope: (how many, ms held)."""
        async with self._reaching():
            found = await self.redis.hgetall(keys.heard)
        fields = {as_text(name): int(value) for name, value in found.items()}
        kinds = {name.partition(":")[0] for name in fields}
        return {
            kind: (fields.get(f"{kind}:count", 0), fields.get(f"{kind}:held_ms", 0))
            for kind in sorted(kinds)
        }

    async def held(self, keys: BudgetKeys) -> dict[str, int]:
        """The scopes held after a 429 right now, each with the ms its hold has left."""
        async with self._reaching():
            found = await self.redis.zrange(keys.holds, 0, -1)
            scopes = [as_text(scope) for scope in found if isinstance(scope, bytes | str)]
            left = [await self.redis.pttl(keys.scope(scope)[2]) for scope in scopes]
        return {scope: ms for scope, ms in zip(scopes, left, strict=True) if ms > 0}

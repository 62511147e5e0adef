"""The outbound budget of a platform's bot, shared by every replica: may a call go out now,
and if not, when (`budget_take`); a call answered or never made (`budget_done`); a 429 heard
(`budget_hold`). All of a platform's budget keys share one hash tag (`BudgetKeys`), so one
script sees the bot-wide limit and the chat's together, on a Cluster too.

A scope that several people's replies draw on (a group's) may be shared fairly between them:
each person takes its slots at most at their share of its rate, and a person who has had their
share waits behind those who have not, so one member flooding a group delays another by about
one slot's interval (budget_take.lua)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from bot.message import Scope
from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import BudgetKeys
from bot.store.replies import as_text, decoded

# A granted call counts as made this far ahead until it is answered: a call whose answer is
# never recorded (its replica died) holds its slot this long, the longest a call may take.
IN_FLIGHT_MS = 30_000
# A waiting reply not heard from for this long (its replica died, or gave up) no longer
# keeps its place in the queue.
TICKET_TTL_MS = 10_000
# How soon to ask again when a slot frees at a moment the script cannot know (a call in flight
# whose answer will free it, or a reply ahead that may take it).
POLL_MS = 50
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
    """budget_take.lua's answer. `status`: granted, wait (a message: ask again in
    `wait_ms`) or shed (a preview); `scope` and `held`: what stopped the call, and whether
    a 429's hold did."""

    status: Literal["granted", "wait", "shed"]
    wait_ms: int
    scope: str
    held: bool


class Budget(Calls):
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
    ) -> Taken:
        """May `call` go out now under every scope in `scopes`? Granted, it is recorded as
        `grant` in each (in flight until `done`). A message that must wait joins the queue
        under `ticket`, placed by `order_ms` (server clock: when its window closed; 0 for a
        part already promised). The scopes named in `fair` are shared fairly between people,
        a message being for `person`, who may run `burst` slots ahead of their pace."""
        script = scripts.BUDGET_TAKE
        named = {"tickets": keys.tickets, "holds": keys.holds}
        scope_keys = [
            key for scope in scopes for key in (*keys.scope(scope.name), keys.people(scope.name))
        ]
        args = {
            "kind": "reply" if call == "message" else "preview",
            "ticket": ticket,
            "order_ms": order_ms,
            "grant": grant,
            "person": person,
            "in_flight_ms": IN_FLIGHT_MS,
            "ticket_ttl_ms": TICKET_TTL_MS,
            "poll_ms": POLL_MS,
            "keep_free_pct": KEEP_FREE_PCT[call],
            "fair_burst": burst,
        }
        rest = [
            value
            for scope in scopes
            for value in (
                scope.name,
                scope.count,
                max(1, round(scope.per_s * 1000)),
                int(scope.name in fair),
            )
        ]
        raw = await self._run(script, named, args, rest, scope_keys)
        reply = decoded(raw)
        return Taken(
            reply["status"], int(reply["wait_ms"]), str(reply["scope"]), bool(reply["held"])
        )

    async def done(
        self, keys: BudgetKeys, scopes: Sequence[Scope], grant: str, *, used: bool
    ) -> None:
        """The call granted as `grant` was answered (`used`), counting from now in each
        scope's window; or never made, its slots given back."""
        script = scripts.BUDGET_DONE
        sent = [keys.scope(scope.name)[0] for scope in scopes]
        await self._run(script, {}, {"grant": grant, "used": int(used)}, rest_keys=sent)

    async def hold(self, keys: BudgetKeys, scope: str, hold_ms: int) -> None:
        """No call under `scope` for `hold_ms`, on any replica (a 429's retry_after)."""
        script = scripts.BUDGET_HOLD
        named = {"hold": keys.scope(scope)[2], "holds": keys.holds}
        await self._run(script, named, {"scope": scope, "hold_ms": max(1, hold_ms)})

    async def held(self, keys: BudgetKeys) -> dict[str, int]:
        """The scopes held after a 429 right now, each with the ms its hold has left."""
        async with self._reaching():
            found = await self.redis.zrange(keys.holds, 0, -1)
            scopes = [as_text(scope) for scope in found if isinstance(scope, bytes | str)]
            left = [await self.redis.pttl(keys.scope(scope)[2]) for scope in scopes]
        return {scope: ms for scope, ms in zip(scopes, left, strict=True) if ms > 0}

"""Usage: the tokens replies cost, per conversation, per person's day and month (wherever
they write: their DM, every group and topic), and per shard's day, for budgets, `/usage`,
`/stats` and `lastword status`. A conversation's own day and month are the place's share of
its person's.

One count everywhere: the prompt plus completion tokens of every generation (sent, interrupted
or thrown away), on the replica's UTC day. Only the budget weighs them by model cost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from bot.message import Place
from bot.store import scripts
from bot.store.access import AccessRecord
from bot.store.calls import Calls
from bot.store.config import DAY_KEEP_MS, utc_today
from bot.store.errors import StoreUnavailable
from bot.store.replies import as_text

log = logging.getLogger(__name__)

# A month's tokens outlive the month, so /usage on its last day still reads it whole.
MONTH_KEEP_MS = 62 * 86_400_000
# A user's day and month (usage.lua): the weighed tokens, then the tokens as spent.
SPENT_FIELDS = ["tokens", "prompt", "completion"]


@dataclass(frozen=True)
class Tokens:
    """Tokens as spent: the prompt the model read and the completion it wrote."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    @classmethod
    def read(cls, prompt: Any, completion: Any) -> Tokens:
        """From a hash's fields (None: never counted)."""
        return cls(int(prompt or 0), int(completion or 0))


@dataclass(frozen=True)
class Spending:
    """A person's spending today and this month (UTC), in every place, and the daily budget an
    admin set for them (None: the settings' budget). `today` and `month` weigh each token by
    its model's cost, as the budget is counted; `tokens_today` and `tokens_month` are the
    tokens as spent, the count /stats and `lastword status` show too. `here_today` and
    `here_month`: the share of those spent in the place asked from."""

    today: int
    month: int
    budget: int | None
    tokens_today: Tokens
    tokens_month: Tokens
    here_today: Tokens = Tokens(0, 0)
    here_month: Tokens = Tokens(0, 0)


@dataclass(frozen=True)
class DayTotals:
    """What every replica did on one UTC day: tokens, generations, replies sent, generations
    cut short or thrown away for a newer message, replies the starvation guard forced out,
    and the conversations that spent tokens."""

    prompt: int = 0
    completion: int = 0
    generations: int = 0
    replies: int = 0
    interrupted: int = 0
    forced: int = 0
    users: int = 0

    @classmethod
    def summed(cls, totals: Sequence[Mapping[Any, Any]], users: Sequence[int]) -> DayTotals:
        """The shards' totals (hashes) and counts of conversations, added up."""
        # Every field but `users` is a field of the shards' totals hashes, of the same name.
        sums = {f.name: 0 for f in fields(cls) if f.name != "users"}
        for shard in totals:
            for name, value in shard.items():
                if as_text(name) in sums:
                    sums[as_text(name)] += int(value)
        return cls(users=sum(int(n) for n in users), **sums)


class Usage(Calls):
    """Count what replies cost, and read it back."""

    async def add_usage(
        self, conversation: str, user: str, prompt: int, completion: int, cost: float = 1.0
    ) -> int:
        """Count the tokens a reply cost, in the conversation (with its shard's day) and in
        its person's day and month; returns what the person spent today, weighed. `cost`
        weighs them for the person's budget (a dearer model's tokens count for more); the
        tokens as spent are kept beside the weighed ones. Two scripts, one per slot
        (`Calls._run_each`: one round trip on one server)."""
        k = self.layout.keys(conversation)
        today = utc_today()
        totals, ranking = self.layout.usage_day_keys(k.shard, today)
        keys = {
            "usage": k.usage,
            "day": k.day(today),
            "totals": totals,
            "ranking": ranking,
            "month": k.month(today),
        }
        args: dict[str, str | int] = {
            "prompt": prompt,
            "completion": completion,
            "user": user,
            "day_keep_ms": DAY_KEEP_MS,
            "conversation": conversation,
            "retention_ms": self.settings.retention_ms,
            "month_keep_ms": MONTH_KEEP_MS,
            "cost": repr(cost),
        }
        person = self.layout.person_keys(Place.of(conversation).platform, user)
        theirs = {"day": person.day(today), "month": person.month(today)}
        spent: dict[str, str | int] = {
            "prompt": prompt,
            "completion": completion,
            "cost": repr(cost),
            "day_keep_ms": DAY_KEEP_MS,
            "month_keep_ms": MONTH_KEEP_MS,
        }
        _, today_spent = await self._run_each(
            [(scripts.USAGE, keys, args), (scripts.PERSON_USAGE, theirs, spent)]
        )
        return int(today_spent)

    async def spending(self, conversation: str, user: str) -> Spending:
        """Tokens the person `user` of the conversation's platform has spent today and this
        month (UTC), in every place and in this one, weighed and as spent, and the daily
        budget an admin set for them, from two slots (the conversation's, with the budget's
        copy in its shard; the person's): on one server, in one round trip. On a cluster, one
        round trip to each slot, at once: the person's slot may be on another node, and if it
        cannot be reached, the place's own counts stand for the person's (the budget then
        holds per place until it is back), so a node down does not stop replies in
        conversations that are not its own."""
        k = self.layout.keys(conversation)
        person = self.layout.person_keys(Place.of(conversation).platform, user)
        today = utc_today()
        place = [k.day(today), k.month(today)]
        theirs = [person.day(today), person.month(today)]
        if self.clustered:
            (place_counts, record), their_counts = await asyncio.gather(
                self._read(place, k.access, user), self._theirs(theirs)
            )
            place_day, place_month = place_counts
            day, month = their_counts or place_counts
        else:
            (place_day, place_month, day, month), record = await self._read(
                place + theirs, k.access, user
            )
        (day_weighed, *day_tokens), (month_weighed, *month_tokens) = day, month
        budget = None if record is None else AccessRecord.from_json(user, record).budget
        return Spending(
            int(day_weighed or 0),
            int(month_weighed or 0),
            budget,
            Tokens.read(*day_tokens),
            Tokens.read(*month_tokens),
            Tokens.read(*place_day[1:]),
            Tokens.read(*place_month[1:]),
        )

    async def _theirs(self, counts: list[str]) -> list[Any] | None:
        """The person's day and month counts (`_read`); None if their slot cannot be
        reached."""
        try:
            found, _ = await self._read(counts)
        except StoreUnavailable as exc:
            log.warning("a person's spending was read from the place alone: %s", exc)
            return None
        return found

    async def _read(
        self, counts: list[str], access: str = "", user: str = ""
    ) -> tuple[list[Any], Any]:
        """Each of the `counts` hashes' counts (`SPENT_FIELDS`), and `user`'s access record
        from `access` if named (None if not): one round trip."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for key in counts:
                pipe.hmget(key, SPENT_FIELDS)
            if access:
                pipe.hget(access, user)
            found: list[Any] = await pipe.execute()
        return (found[:-1], found[-1]) if access else (found, None)

    async def today(self) -> DayTotals:
        """What every replica did today (UTC), summed over the shards: one round trip (on a
        cluster, one to each primary, all at once)."""
        day = utc_today()
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            for shard in range(self.layout.shards):
                totals, ranking = self.layout.usage_day_keys(shard, day)
                pipe.hgetall(totals)
                pipe.zcard(ranking)
            found: list[Any] = await pipe.execute()
        return DayTotals.summed(found[::2], found[1::2])

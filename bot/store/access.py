"""Access: what admins changed in chat for a user (/allow, /deny, /budget), kept in
`{lw:access}` and copied into every shard, where ingest and the budget check read it."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bot.message import Unavailable
from bot.store import scripts
from bot.store.calls import Calls
from bot.store.keys import ACCESS_KEY, ACCESS_SEQ_KEY
from bot.store.replies import as_text, decoded

log = logging.getLogger(__name__)

# A sweep mends at most this many shards' copies of the access changes (the rest at the next).
MEND_SHARDS_PER_SWEEP = 8


@dataclass(frozen=True)
class AccessRecord:
    """What admins changed in chat for one user (`keys.ACCESS_KEY`)."""

    user: str
    access: Literal["allow", "deny"] | None  # None: as the settings say
    budget: int | None  # daily tokens; None: the settings' budget
    by: str  # the admin who made the last change
    at_ms: int
    seq: int

    @classmethod
    def from_json(cls, user: str, raw: bytes | str) -> AccessRecord:
        data = json.loads(raw)
        budget = data.get("budget")
        return cls(
            user=user,
            access=data.get("access"),
            budget=None if budget is None else int(budget),
            by=str(data.get("by", "")),
            at_ms=int(data.get("at", 0)),
            seq=int(data.get("seq", 0)),
        )


class Access(Calls):
    """An admin's changes to a user's access, and their copies in the shards."""

    async def change_access(
        self, user: str, change: Literal["access", "budget"], value: str, by: str
    ) -> AccessRecord:
        """An admin's change to a user's access or daily budget ("" clears it), seen by
        every replica once this returns: the user's record, then its copy in every shard.
        Raises `Unavailable` if any part failed; making the change again is harmless."""
        keys = {"records": ACCESS_KEY, "sequence": ACCESS_SEQ_KEY}
        args = {"user": user, "field": change, "value": value, "by": by}
        reply = decoded(await self._run_durable(scripts.ACCESS_SET, keys, args))
        record = AccessRecord.from_json(user, reply["record"])
        # A shard that held every change up to the one before holds every one up to this.
        whole = (record.seq, int(reply["previous"]))
        copy = [record.user, reply["record"], record.seq]
        await self._copy_access(whole, copy, range(self.layout.shards))
        return record

    async def spread_access(self) -> int:
        """Copy every user's access record into every shard again, where a shard lacks it
        or holds an older one (a copy is not waited for at the durability level, so a
        failover may lose one). Run at start-up; returns the records spread. The sweep mends
        a shard found behind `{lw:access}` the same way (`due`)."""
        return await self._spread_access(range(self.layout.shards))

    async def _spread_access(self, shards: Sequence[int]) -> int:
        """Copy every user's access record into these shards, where a shard lacks it or holds
        an older one: one round trip to read, one to copy. Returns the number of records."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            # The seq first: every change it counts is then among the records read after it.
            pipe.get(ACCESS_SEQ_KEY)
            pipe.hgetall(ACCESS_KEY)
            latest, records = await pipe.execute()
        copies: list[str | int] = []
        for user, raw in records.items():
            copies += [as_text(user), as_text(raw), AccessRecord.from_json(as_text(user), raw).seq]
        await self._copy_access((int(latest or 0), 0), copies, shards)
        return len(records)

    async def _copy_access(
        self, whole: tuple[int, int], copies: list[str | int], shards: Sequence[int]
    ) -> None:
        """Copy records (user id, record json, seq, for each) into these shards, where a
        shard lacks one or holds an older one. `whole`: the seq a shard then holds every change
        up to, if it held every one up to the second before (access_copy.lua)."""
        script = scripts.ACCESS_COPY
        args = script.ordered_args({"whole_after": whole[0], "whole_before": whole[1]}, copies)

        def call(shard: int) -> tuple[list[str], list[str | int]]:
            return script.ordered_keys({"shard": self.layout.access_key(shard)}), args

        await self._in_every_shard(script, call, shards=shards)

    async def _mend_access(self, shards: Sequence[int]) -> None:
        """Mend these shards' copies of the access changes. Best effort: a failure is
        logged, and the next sweep finds them behind still and tries again; it must not cost
        the sweep its wake-ups."""
        try:
            await self._spread_access(shards)
        except Unavailable as exc:
            log.warning("could not mend the access changes of %d shards: %s", len(shards), exc)
        except Exception:
            log.exception("mending the access changes of %d shards failed", len(shards))

"""Access: what admins changed in chat for a user (/allow, /deny, /budget), kept in
`{lw:access}` and copied into every shard, where ingest and the budget check read it."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bot.message import Unavailable
from bot.store.calls import Calls
from bot.store.keys import ACCESS_KEY, ACCESS_SEQ_KEY, SHARDS, access_key
from bot.store.replies import as_text

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
        keys = [ACCESS_KEY, ACCESS_SEQ_KEY]
        raw, previous = await self._run_durable(self._access_set, keys, [user, change, value, by])
        record = AccessRecord.from_json(user, as_text(raw))
        # A shard that held every change up to the one before holds every one up to this.
        args: list[str | int] = [record.seq, int(previous), record.user, as_text(raw), record.seq]
        await self._in_every_shard(self._access_copy, lambda shard: ([access_key(shard)], args))
        return record

    async def spread_access(self) -> int:
        """Copy every user's access record into every shard again, where a shard lacks it
        or holds an older one (a copy is not waited for at the durability level, so a
        failover may lose one). Run at start-up; returns the records spread. The sweep mends
        a shard found behind `{lw:access}` the same way (`due`)."""
        return await self._spread_access(range(SHARDS))

    async def _spread_access(self, shards: Sequence[int]) -> int:
        """Copy every user's access record into these shards, where a shard lacks it or holds
        an older one: one round trip to read, one to copy. Returns the number of records."""
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            # The seq first: every change it counts is then among the records read after it.
            pipe.get(ACCESS_SEQ_KEY)
            pipe.hgetall(ACCESS_KEY)
            latest, records = await pipe.execute()
        args: list[str | int] = [int(latest or 0), 0]
        for user, raw in records.items():
            args += [as_text(user), as_text(raw), AccessRecord.from_json(as_text(user), raw).seq]
        await self._in_every_shard(
            self._access_copy, lambda shard: ([access_key(shard)], args), shards=shards
        )
        return len(records)

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

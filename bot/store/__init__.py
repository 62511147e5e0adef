"""The store: every atomic step of the flow as one Lua script against Redis, behind `Store`.

The scripts and their arguments are declared in `bot.store.scripts`; every key name comes
from `bot.store.keys`, which also describes the layout. `Store` is put together from one part
per area: conversations (the flow's steps), roles, kept values, access, usage, the transcript
cache and heartbeats, on the base in `bot.store.calls`; `bot.store.errors` tells a failure
worth a retry from a bug.
"""

from __future__ import annotations

from bot.store.access import MEND_SHARDS_PER_SWEEP, Access, AccessRecord
from bot.store.config import (
    CLOCK_SLACK_MS,
    DAY_KEEP_MS,
    RETRY_AFTER_ERROR_CAP_MS,
    RETRY_AFTER_ERROR_MS,
    StoreSettings,
)
from bot.store.conversations import (
    ACTIVE_KEEP_MS,
    RATE_WINDOW_MS,
    SEEN_CAP,
    SEEN_KEEP_MS,
    Conversations,
    Ended,
    Grant,
    HistoryEntry,
    Ingested,
    Interrupt,
    Lease,
    Outcome,
    PreSend,
    lease_token,
)
from bot.store.errors import StoreUnavailable, classify, reaching_redis
from bot.store.heartbeats import Heartbeats
from bot.store.kept import Kept
from bot.store.keys import ACCESS_SEQ_KEY, SHARDS, Keys, access_key, due_key
from bot.store.replies import as_text
from bot.store.roles import Roles
from bot.store.scripts import (
    ACCESS_COPY,
    ACCESS_SET,
    ACQUIRE,
    COMMIT,
    DUE,
    HEARTBEAT,
    INGEST,
    INTERRUPT,
    NOTICE,
    PRESEND,
    RELEASE,
    RENEW,
    ROLE,
    ROLE_RELEASE,
    USAGE,
)
from bot.store.transcripts import Transcripts
from bot.store.usage import MONTH_KEEP_MS, DayTotals, Spending, Usage

__all__ = [
    "ACCESS_COPY",
    "ACCESS_SET",
    "ACQUIRE",
    "ACTIVE_KEEP_MS",
    "CLOCK_SLACK_MS",
    "COMMIT",
    "DAY_KEEP_MS",
    "DUE",
    "HEARTBEAT",
    "INGEST",
    "INTERRUPT",
    "MEND_SHARDS_PER_SWEEP",
    "MONTH_KEEP_MS",
    "NOTICE",
    "PRESEND",
    "RATE_WINDOW_MS",
    "RELEASE",
    "RENEW",
    "RETRY_AFTER_ERROR_CAP_MS",
    "RETRY_AFTER_ERROR_MS",
    "ROLE",
    "ROLE_RELEASE",
    "SEEN_CAP",
    "SEEN_KEEP_MS",
    "SHARDS",
    "USAGE",
    "AccessRecord",
    "DayTotals",
    "Ended",
    "Grant",
    "HistoryEntry",
    "Ingested",
    "Interrupt",
    "Keys",
    "Lease",
    "Outcome",
    "PreSend",
    "Spending",
    "Store",
    "StoreSettings",
    "StoreUnavailable",
    "classify",
    "lease_token",
    "reaching_redis",
]


class Store(Conversations, Roles, Kept, Access, Usage, Transcripts, Heartbeats):
    """Typed calls for the scripts. One instance per process, shared by all its tasks."""

    async def due(self, limit: int = 100) -> list[str]:
        """Conversations, across all shards, whose next look is overdue, or scored further
        ahead than any delay the flow sets (`StoreSettings.horizon_ms`). One round trip (on a
        cluster, one to each primary, all at once: the pipeline is split by node), which also
        reads whether a shard's copies of the access changes lag behind: a few such shards
        are mended then (`MEND_SHARDS_PER_SWEEP`), the rest at the next sweep."""
        horizon = self.settings.horizon_ms
        *shards, latest = await self._in_every_shard(
            self._due,
            lambda shard: ([due_key(shard), access_key(shard)], [limit, horizon]),
            also=[("GET", ACCESS_SEQ_KEY)],
        )
        behind = [n for n, (_, whole) in enumerate(shards) if int(whole) < int(latest or 0)]
        if behind:
            await self._mend_access(behind[:MEND_SHARDS_PER_SWEEP])
        return [as_text(c) for found, _ in shards for c in found]

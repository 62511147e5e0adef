"""The store: every atomic step of the flow as one Lua script against Redis, behind `Store`.

The scripts and their arguments are declared in `bot.store.scripts`; every key name comes
from `bot.store.keys`, which also describes the layout. `Store` is put together from one part
per area: conversations (the flow's steps), roles, kept values, access, a group's move to a
new chat, usage, the transcript cache, what a user chose or may take back (persona, /forget),
a person's keys across places, their memory (`bot.store.memory`), heartbeats and the record
of tool calls, on the base in `bot.store.calls`; `bot.store.errors` tells a failure worth a
retry from a bug.
"""

from __future__ import annotations

import functools

from bot.store import scripts as _scripts
from bot.store.access import MEND_SHARDS_PER_SWEEP, Access, AccessRecord
from bot.store.budget import Ask, Budget, InFlight, Stamp, Taken
from bot.store.config import (
    CLOCK_SLACK_MS,
    DAY_KEEP_MS,
    RETRY_AFTER_ERROR_CAP_MS,
    RETRY_AFTER_ERROR_MS,
    StoreSettings,
)
from bot.store.conversations import (
    ACTIVE_KEEP_MS,
    SEEN_CAP,
    SEEN_KEEP_MS,
    TYPING_EVERY_MS,
    Acquired,
    Conversations,
    Ended,
    Failed,
    Grant,
    Heard,
    HistoryEntry,
    Ingested,
    Interrupt,
    Lease,
    NotAcquired,
    Outcome,
    PreSend,
    Resend,
    Typed,
    Window,
    lease_token,
)
from bot.store.errors import StoreUnavailable, classify, reaching_redis
from bot.store.heartbeats import Heartbeats
from bot.store.kept import Kept
from bot.store.keys import ACCESS_SEQ_KEY, BudgetKeys, Keys, Layout
from bot.store.memory import Facts, RedisMemory
from bot.store.moves import Moves
from bot.store.person import PLACES_CAP, RATE_WINDOW_MS
from bot.store.personal import FORGET_CONFIRM_MS, Personal
from bot.store.replies import decoded_each, listed
from bot.store.roles import Roles
from bot.store.tools import Begun, Record, Recorded, Tools
from bot.store.transcripts import Transcripts
from bot.store.usage import MONTH_KEEP_MS, DayTotals, Spending, Usage

# Each script's source, by its file's name in capitals: what `lastword doctor` loads on the
# server to check it (`bot.ops.doctor.store_scripts`), and the benchmarks load ahead.
ACCESS_COPY = _scripts.ACCESS_COPY.source
ACCESS_SET = _scripts.ACCESS_SET.source
ACQUIRE = _scripts.ACQUIRE.source
COMMIT = _scripts.COMMIT.source
SETTLE = _scripts.SETTLE.source
DUE = _scripts.DUE.source
FORGET = _scripts.FORGET.source
GROUP_SET = _scripts.GROUP_SET.source
GROUP_ADOPT = _scripts.GROUP_ADOPT.source
GROUP_MOVE = _scripts.GROUP_MOVE.source
HEARTBEAT = _scripts.HEARTBEAT.source
INGEST = _scripts.INGEST.source
INTERRUPT = _scripts.INTERRUPT.source
NOTICE = _scripts.NOTICE.source
PERSON = _scripts.PERSON.source
PERSON_USAGE = _scripts.PERSON_USAGE.source
PERSONA = _scripts.PERSONA.source
PRESEND = _scripts.PRESEND.source
RELEASE = _scripts.RELEASE.source
RENEW = _scripts.RENEW.source
ROLE = _scripts.ROLE.source
ROLE_RELEASE = _scripts.ROLE_RELEASE.source
TOOL_BEGIN = _scripts.TOOL_BEGIN.source
TOOL_END = _scripts.TOOL_END.source
TOOL_STEP = _scripts.TOOL_STEP.source
TRANSCRIPT = _scripts.TRANSCRIPT.source
TYPING = _scripts.TYPING.source
USAGE = _scripts.USAGE.source

__all__ = [
    "ACCESS_COPY",
    "ACCESS_SET",
    "ACQUIRE",
    "ACTIVE_KEEP_MS",
    "CLOCK_SLACK_MS",
    "COMMIT",
    "DAY_KEEP_MS",
    "DUE",
    "FORGET",
    "FORGET_CONFIRM_MS",
    "GROUP_ADOPT",
    "GROUP_MOVE",
    "GROUP_SET",
    "HEARTBEAT",
    "INGEST",
    "INTERRUPT",
    "MEND_SHARDS_PER_SWEEP",
    "MONTH_KEEP_MS",
    "NOTICE",
    "PERSON",
    "PERSONA",
    "PERSON_USAGE",
    "PLACES_CAP",
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
    "SETTLE",
    "TOOL_BEGIN",
    "TOOL_END",
    "TOOL_STEP",
    "TRANSCRIPT",
    "TYPING",
    "TYPING_EVERY_MS",
    "USAGE",
    "AccessRecord",
    "Acquired",
    "Ask",
    "Begun",
    "BudgetKeys",
    "DayTotals",
    "Ended",
    "Failed",
    "Grant",
    "Heard",
    "HistoryEntry",
    "InFlight",
    "Ingested",
    "Interrupt",
    "Keys",
    "Layout",
    "Lease",
    "NotAcquired",
    "Outcome",
    "PreSend",
    "Record",
    "Recorded",
    "RedisMemory",
    "Resend",
    "Spending",
    "Stamp",
    "Store",
    "StoreSettings",
    "StoreUnavailable",
    "Taken",
    "Typed",
    "Window",
    "classify",
    "lease_token",
    "reaching_redis",
]


@functools.lru_cache(maxsize=4)
def _due_calls(layout: Layout, clustered: bool) -> tuple[tuple[str, ...], ...]:
    """The KEYS of each call a sweep makes (`Store.due`), named once for the layout. A
    call's keys share one slot on a cluster: one call a shard, pipelined by node. One server
    holds every shard: one call reads them all (a call a shard, 64 a sweep, was half of an
    idle replica's CPU and a third of its server's)."""
    script = _scripts.DUE
    pairs = [
        {"due": layout.due_key(shard), "access": layout.access_key(shard)}
        for shard in range(layout.shards)
    ]
    if clustered:
        return tuple(tuple(script.ordered_keys(pair)) for pair in pairs)
    further = [key for pair in pairs[1:] for key in script.ordered_keys(pair)]
    return (tuple(script.ordered_keys(pairs[0], rest=further)),)


class Store(
    Conversations,
    Roles,
    Kept,
    Access,
    Moves,
    Usage,
    Transcripts,
    Personal,
    Heartbeats,
    Tools,
    Budget,
    Facts,
):
    """Typed calls for the scripts. One instance per process, shared by all its tasks."""

    async def due(self, limit: int = 100) -> list[str]:
        """Conversations, across all shards, whose next look is overdue, or scored further
        ahead than any delay the flow sets (`StoreSettings.horizon_ms`). One round trip (on a
        cluster, one to each primary, all at once: the pipeline is split by node), which also
        reads whether a shard's copies of the access changes lag behind: a few such shards
        are mended then (`MEND_SHARDS_PER_SWEEP`), the rest at the next sweep."""
        script = _scripts.DUE
        args = script.ordered_args({"limit": limit, "horizon_ms": self.settings.horizon_ms})
        calls = _due_calls(self.layout, self.clustered)
        *replies, latest = await self._in_every_shard(
            script,
            lambda n: (list(calls[n]), args),
            shards=range(len(calls)),
            also=[("GET", ACCESS_SEQ_KEY)],
        )
        shards = [shard for reply in replies for shard in decoded_each(reply)]
        behind = [n for n, s in enumerate(shards) if int(s["whole"]) < int(latest or 0)]
        if behind:
            await self._mend_access(behind[:MEND_SHARDS_PER_SWEEP])
        return [str(c) for shard in shards for c in listed(shard["found"])]

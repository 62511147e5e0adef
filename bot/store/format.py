"""The stored format's version: how this version of lastword writes what it keeps, recorded
in the store so that no replica reads data it would misread.

The store records its format beside its layout (`{lw:meta}`, field `format`), at the first
start. A replica refuses to start on a store of another format (`check_format`): a newer one
it would misread, an older one it would too, until `lastword migrate-shards` (which brings a
store made by an earlier version up to this one, with every replica stopped) has upgraded it
(`upgrade`). Replicas of versions that predate the record refuse a store that has one, since
they compare the whole record with their own. So every reader of stored data reads one format:
no branch for what an older version wrote.

The formats (docs/design.md, "Stored formats"):

1. Unrecorded: what versions up to 0.2 wrote. A reply in a history may lack its turn and the
   count of its bytes that are the model's own words (`said`); an outbox's `unsaid` may be the
   /retry message's version alone; an outbox's changes may lack their kind.
2. Every reply in a history has `turn` and `said`; `unsaid` is always `{"message", "said"}`;
   every change has its `kind`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from bot.store.keys import LAYOUT, META_KEY
from bot.store.replies import as_text

# The format this version writes and reads.
FORMAT = 2
# Its field in the store's record (`META_KEY`).
FIELD = "format"
# The kind of a change written before changes had kinds: the only change there was then
# (`bot.commands.admin.Change.kind`, as stored).
FIRST_CHANGE_KIND = "access"
# The command that upgrades a store (`bot.service.cli`).
UPGRADE_COMMAND = "lastword migrate-shards"

Client = Redis | RedisCluster


class FormatError(Exception):
    """The store's format is not this version's. The message says what to do, on one line,
    for the operator."""


def check_format(recorded: dict[str, str], *, older: bool = False) -> None:
    """Refuse (`FormatError`) a store whose record names another format than `FORMAT`, or
    none (a store made before formats were recorded); an older one passes if `older` (the
    upgrade's own check)."""
    found = recorded.get(FIELD)
    if found == str(FORMAT):
        return
    if found is None or (found.isdigit() and int(found) < FORMAT):
        if older:
            return
        raise FormatError(
            f"the store was written in stored format {found or 1}, which this version "
            f"(format {FORMAT}) no longer reads: stop every replica, run `{UPGRADE_COMMAND}` "
            "once, then start them again"
        )
    raise FormatError(
        f"the store was written by a newer lastword (stored format {found}); this version "
        f"reads format {FORMAT} and would misread it: upgrade this replica ({META_KEY} "
        "records the format)"
    )


@dataclass
class Upgraded:
    """What an upgrade rewrote."""

    histories: int = 0  # history lists with an entry rewritten
    outboxes: int = 0  # outboxes rewritten


async def upgrade(redis: Client) -> Upgraded:
    """Rewrite every history and outbox of format 1 in format 2 (with every replica stopped),
    and record the format. Running it again rewrites nothing."""
    done = Upgraded()
    for shard in range(LAYOUT.shards):
        async for key in _keys(redis, f"{LAYOUT.tags[shard]}:c:*:history"):
            done.histories += await _upgrade_history(redis, key)
        async for key in _keys(redis, f"{LAYOUT.tags[shard]}:c:*:outbox"):
            done.outboxes += await _upgrade_outbox(redis, key)
    await redis.hset(META_KEY, FIELD, str(FORMAT))
    return done


async def _keys(redis: Client, match: str) -> AsyncIterator[str]:
    async for key in redis.scan_iter(match=match, count=1000):
        yield as_text(key)


def upgraded_history(entries: list[str]) -> list[str] | None:
    """A history's entries in format 2, or None if they are already. A reply without a turn
    answered every message before it not yet answered: its turn is the oldest of them (its own
    version if none), which answers the same messages. A reply without `said` is all the
    model's words."""
    upgraded: list[str] = []
    waiting: list[int] = []
    changed = False
    for raw in entries:
        data: dict[str, Any] = json.loads(raw)
        version = int(data["v"])
        if data["role"] == "user":
            waiting.append(version)
            upgraded.append(raw)
            continue
        turn = int(data.get("turn", min((v for v in waiting if v <= version), default=version)))
        # What it answered is no longer waiting (`bot.core.history.exchanges`).
        waiting = [v for v in waiting if not turn <= v <= version]
        if "turn" in data and "said" in data:
            upgraded.append(raw)
            continue
        data["turn"] = turn
        data.setdefault("said", len(str(data["text"]).encode()))
        upgraded.append(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
        changed = True
    return upgraded if changed else None


async def _upgrade_history(redis: Client, key: str) -> int:
    entries = [as_text(e) for e in await redis.lrange(key, 0, -1)]
    upgraded = upgraded_history(entries)
    if upgraded is None:
        return 0
    pttl = int(await redis.pttl(key))
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.rpush(key, *upgraded)
        if pttl > 0:
            pipe.pexpire(key, pttl)
        await pipe.execute()
    return 1


def upgraded_outbox(fields: dict[str, str]) -> dict[str, str]:
    """The fields of an outbox to rewrite for format 2 (none if it is already)."""
    changes: dict[str, str] = {}
    unsaid = fields.get("unsaid", "")
    if unsaid.lstrip("-").isdigit():
        said = len(fields.get("text", "").encode())
        changes["unsaid"] = json.dumps({"message": int(unsaid), "said": said})
    kept = json.loads(fields["changes"]) if fields.get("changes") else []
    if any("kind" not in change for change in kept):
        for change in kept:
            change.setdefault("kind", FIRST_CHANGE_KIND)
        changes["changes"] = json.dumps(kept)
    return changes


async def _upgrade_outbox(redis: Client, key: str) -> int:
    raw: dict[Any, Any] = await redis.hgetall(key)
    changes = upgraded_outbox({as_text(k): as_text(v) for k, v in raw.items()})
    if not changes:
        return 0
    async with redis.pipeline(transaction=True) as pipe:
        for name, value in changes.items():
            pipe.hset(key, name, value)
        await pipe.execute()
    return 1

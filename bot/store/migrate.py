"""The shard layout of a deployment: recorded in the store, checked at start-up, and the
one-off move from the legacy layout (`lastword migrate-shards`).

`bot.store.keys` describes both layouts. A bot that found its conversations under other tags
than the ones it uses would see an empty store: every conversation would lose its pending
messages, history and dedupe ids. So the store records the layout (`META_KEY`: shards and the
digest of the tags), written at the first start, and a bot whose layout differs refuses to
start (`check_layout`), as does one that finds data of the legacy layout (16 shards, tagged
`{lw:0}`..`{lw:15}`) and no record.

`migrate` moves that data, with every replica stopped (it refuses while a heartbeat lives):
each conversation's keys, and each person's, to its new shard's tag (DUMP, RESTORE with the
time to live kept, DEL: this works across cluster slots), then the shards' usage of the day
and their due and activity indexes, rebuilt under the new tags, and last the record. Each step
overwrites what a previous, interrupted run wrote and deletes the legacy key only once it is
copied, so running it again finishes the job; on a migrated store it only says so. Then it
rewrites what an older version kept in this version's stored format (`bot.store.format`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from bot.store.format import FIELD, FORMAT, Upgraded, check_format, upgrade
from bot.store.keys import HEARTBEAT_PATTERN, LAYOUT, LEGACY, META_KEY
from bot.store.replies import as_text

# The shards this version lays the conversations out in.
SHARDS = LAYOUT.shards

# Keys moved per round trip.
BATCH = 500

# A conversation key's name after its tag and ":c:": the conversation (which has ":" in it),
# then the kind, "day:" and the day, "month:" and the month, or "heard:" and a file key. The
# longest conversation that leaves a known suffix.
_CONVERSATION_KEY = re.compile(
    r"(?P<conversation>.+):"
    r"(?P<suffix>state|pending|seen|window|lease|outbox|history|rate|notice|usage"
    r"|day:\d{4}-\d{2}-\d{2}|month:\d{4}-\d{2}|heard:[^:]+)"
)
# A person's key after its tag and ":p:": the person ("<platform>:<user>"), then the kind.
_PERSON_KEY = re.compile(
    r"(?P<platform>[^:]+):(?P<user>.+):"
    r"(?P<suffix>rate|places|day:\d{4}-\d{2}-\d{2}|month:\d{4}-\d{2})"
)
_USAGE_KEY = re.compile(r":usage:(?P<day>\d{4}-\d{2}-\d{2}):(?P<kind>totals|ranking)")
# Any key under a legacy tag.
_LEGACY_KEY = re.compile(r"\{lw:\d+\}:")

MIGRATE_COMMAND = "lastword migrate-shards"

# One server, or a Redis Cluster: every call here names its key, or scans every primary.
Client = Redis | RedisCluster


class LayoutError(Exception):
    """The store's data is laid out otherwise than this version of lastword expects. The
    message says what to do, on one line, for the operator."""


def expected_layout() -> dict[str, str]:
    """The layout record this version writes and expects."""
    return {"shards": str(LAYOUT.shards), "tags": LAYOUT.digest}


async def recorded_layout(redis: Client) -> dict[str, str] | None:
    raw: dict[Any, Any] = await redis.hgetall(META_KEY)
    return {as_text(k): as_text(v) for k, v in raw.items()} or None


async def record_layout(redis: Client, also: dict[str, str] | None = None) -> dict[str, str]:
    """Record this version's layout (and the fields `also` gives) where none is (field by
    field, so two replicas starting at once agree), and return what the store holds then. One
    round trip, one key."""
    async with redis.pipeline(transaction=False) as pipe:
        for field, value in {**expected_layout(), **(also or {})}.items():
            pipe.hsetnx(META_KEY, field, value)
        pipe.hgetall(META_KEY)
        replies: list[Any] = await pipe.execute()
    return {as_text(k): as_text(v) for k, v in replies[-1].items()}


def _mismatch(recorded: dict[str, str]) -> LayoutError:
    expected = expected_layout()
    return LayoutError(
        f"the store's conversations are laid out in {recorded.get('shards', '?')} shards "
        f"(tags {recorded.get('tags', '?')}), this version of lastword uses "
        f"{expected['shards']} (tags {expected['tags']}) and would not find them; run the "
        f"version that wrote them, or migrate the data ({META_KEY} records the layout)"
    )


async def legacy_keys(redis: Client, limit: int = 3) -> list[str]:
    """Up to `limit` keys of the legacy layout: its due and activity indexes first (one round
    trip), else whatever a SCAN finds under a legacy tag."""
    names = [key(n) for n in range(LEGACY.shards) for key in (LEGACY.due_key, LEGACY.active_key)]
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(name)
        exists: list[int] = await pipe.execute()
    found = [name for name, n in zip(names, exists, strict=True) if n]
    if not found:
        async for key in redis.scan_iter(match="{lw:[0-9]*", count=1000):
            if _LEGACY_KEY.match(as_text(key)):
                found.append(as_text(key))
                break
    return found[:limit]


async def check_layout(redis: Client) -> None:
    """Refuse (`LayoutError`) a store laid out otherwise than this version expects, or one
    that holds legacy data, and (`FormatError`) one of another stored format; record the
    layout and the format at the first start."""
    recorded = await recorded_layout(redis)
    if recorded is None:
        found = await legacy_keys(redis)
        if found:
            raise LayoutError(
                f"the store holds conversations in the legacy layout of {LEGACY.shards} "
                f"shards (e.g. {', '.join(found)}), which this version no longer reads: stop "
                f"every replica, run `{MIGRATE_COMMAND}` once, then start them again"
            )
        recorded = await record_layout(redis, {FIELD: str(FORMAT)})
    if not _same_layout(recorded):
        raise _mismatch(recorded)
    check_format(recorded)


def _same_layout(recorded: dict[str, str]) -> bool:
    return all(recorded.get(name) == value for name, value in expected_layout().items())


@dataclass
class Migrated:
    """What a migration moved."""

    conversations: int = 0  # conversations with at least one key moved
    keys: int = 0  # conversation keys moved
    index_entries: int = 0  # due and activity index entries
    usage_keys: int = 0  # shard usage keys of a day (totals, ranking)
    skipped: list[str] = field(default_factory=list)  # legacy keys not understood, left be
    upgraded: Upgraded = field(default_factory=Upgraded)  # rewritten in this stored format

    @property
    def nothing(self) -> bool:
        return not (self.keys or self.index_entries or self.usage_keys)


async def _batches(redis: Client, match: str) -> AsyncIterator[list[str]]:
    batch: list[str] = []
    async for key in redis.scan_iter(match=match, count=1000):
        batch.append(as_text(key))
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def _copy(redis: Client, moves: list[tuple[str, str]]) -> int:
    """Copy each (old, new) key with its time to live, replacing the new one, then delete the
    old one. Two round trips. Returns how many were moved (an old key gone meanwhile is not)."""
    async with redis.pipeline(transaction=False) as pipe:
        for old, _ in moves:
            pipe.dump(old)
            pipe.pttl(old)
        dumped: list[Any] = await pipe.execute()
    moved = 0
    async with redis.pipeline(transaction=False) as pipe:
        for (old, new), data, pttl in zip(moves, dumped[::2], dumped[1::2], strict=True):
            if data is None or pttl == -2:
                continue
            pipe.restore(new, max(int(pttl), 0), data, replace=True)
            pipe.delete(old)
            moved += 1
        await pipe.execute()
    return moved


async def _move_conversations(redis: Client, shard: int, done: Migrated, seen: set[str]) -> None:
    def target(name: str) -> str | None:
        parsed = _CONVERSATION_KEY.fullmatch(name)
        if parsed is None:
            return None
        conversation = parsed["conversation"]
        seen.add(conversation)
        return f"{LAYOUT.keys(conversation).base}:{parsed['suffix']}"

    await _move_keys(redis, f"{LEGACY.tags[shard]}:c:", target, done)


async def _move_people(redis: Client, shard: int, done: Migrated) -> None:
    """The keys of the people whose home is in legacy shard `shard`, to their home's new
    shard (`bot.store.keys.PersonKeys`)."""

    def target(name: str) -> str | None:
        parsed = _PERSON_KEY.fullmatch(name)
        if parsed is None:
            return None
        person = LAYOUT.person_keys(parsed["platform"], parsed["user"])
        return f"{person.base}:{parsed['suffix']}"

    await _move_keys(redis, f"{LEGACY.tags[shard]}:p:", target, done)


async def _move_keys(
    redis: Client, prefix: str, target: Callable[[str], str | None], done: Migrated
) -> None:
    """Every key under `prefix` to where `target` says (given the name after the prefix);
    a key it cannot place (None) is skipped and reported."""
    async for batch in _batches(redis, f"{prefix}*"):
        moves: list[tuple[str, str]] = []
        for key in batch:
            moved_to = target(key.removeprefix(prefix))
            if moved_to is None:
                done.skipped.append(key)
            else:
                moves.append((key, moved_to))
        done.keys += await _copy(redis, moves)


async def _move_usage(redis: Client, shard: int, done: Migrated) -> None:
    """The shard's usage of each day. The totals go whole to new shard `shard` (`status` adds
    up every shard's, and new shard N's come from legacy shard N alone: each holds the
    conversations of legacy shard N mod 16); the ranking's entries go to their conversation's
    new shard."""
    tag = LEGACY.tags[shard]
    async for batch in _batches(redis, f"{tag}:usage:*"):
        for key in batch:
            parsed = _USAGE_KEY.fullmatch(key.removeprefix(tag))
            if parsed is None:
                done.skipped.append(key)
                continue
            day = date.fromisoformat(parsed["day"])
            if parsed["kind"] == "totals":
                done.usage_keys += await _copy(redis, [(key, LAYOUT.usage_day_keys(shard, day)[0])])
                continue
            pttl = int(await redis.pttl(key))
            entries: Any = await redis.zrange(key, 0, -1, withscores=True)
            async with redis.pipeline(transaction=False) as pipe:
                for member, score in entries:
                    conversation = as_text(member)
                    ranking = LAYOUT.usage_day_keys(LAYOUT.shard_of(conversation), day)[1]
                    pipe.zadd(ranking, {conversation: score})
                    if pttl > 0:
                        pipe.pexpire(ranking, pttl)
                pipe.delete(key)
                await pipe.execute()
            done.usage_keys += 1


async def _move_index(redis: Client, old: str, new: Callable[[int], str], done: Migrated) -> None:
    """Every entry of a legacy index to the same index of its conversation's new shard, same
    score; then the legacy index is deleted."""
    entries: Any = await redis.zrange(old, 0, -1, withscores=True)
    for start in range(0, len(entries), BATCH):
        async with redis.pipeline(transaction=False) as pipe:
            for member, score in entries[start : start + BATCH]:
                conversation = as_text(member)
                pipe.zadd(new(LAYOUT.shard_of(conversation)), {conversation: score})
            await pipe.execute()
    await redis.delete(old)
    done.index_entries += len(entries)


async def migrate(redis: Client, progress: Callable[[str], None] = lambda _: None) -> Migrated:
    """Move the legacy layout's data to this version's layout, and record it. Refuses
    (`LayoutError`) while any replica's heartbeat lives, or if the store records a layout
    other than this version's."""
    recorded = await recorded_layout(redis)
    if recorded is not None and not _same_layout(recorded):
        raise _mismatch(recorded)
    if recorded is not None:
        check_format(recorded, older=True)  # a newer version's store is never rewritten
    alive = [as_text(key) async for key in redis.scan_iter(match=HEARTBEAT_PATTERN, count=1000)]
    if alive:
        raise LayoutError(
            f"{len(alive)} replica(s) still running ({', '.join(sorted(alive)[:3])}): stop "
            f"every replica first (`lastword status` lists them), then run `{MIGRATE_COMMAND}`"
        )
    done = Migrated()
    conversations: set[str] = set()
    # The indexes last: they are what start-up looks for, so a run cut short anywhere still
    # leaves the store refused until a run completes.
    for shard in range(LEGACY.shards):
        before = done.keys
        await _move_conversations(redis, shard, done, conversations)
        await _move_people(redis, shard, done)
        # Only a shard that held something is news; an empty store ends in one summary line.
        if done.keys > before:
            progress(f"shard {LEGACY.tags[shard]}: {done.keys} conversation keys moved so far")
    for shard in range(LEGACY.shards):
        await _move_usage(redis, shard, done)
    for shard in range(LEGACY.shards):
        await _move_index(redis, LEGACY.due_key(shard), LAYOUT.due_key, done)
        await _move_index(redis, LEGACY.active_key(shard), LAYOUT.active_key, done)
    done.conversations = len(conversations)
    # Then the stored format: what was moved, and what was in place, rewritten as this
    # version writes it. The format is recorded last, so a run cut short is refused at start
    # until a run completes.
    done.upgraded = await upgrade(redis)
    recorded = await record_layout(redis)
    if not _same_layout(recorded):
        raise _mismatch(recorded)
    return done

"""Shards that spread over a cluster, the layout record, and `lastword migrate-shards`.

The tags: each of the 64 shards in its own 64th of the slot space, so an even slot split over
up to 64 primaries gives each an even share. The record: a store is refused at start-up when
its layout is not this version's, or when it holds data of the legacy 16-shard layout. The
migration: legacy data, written by the real scripts under the legacy layout, is refused, then
moved by the command, then answered by a runtime with nothing lost.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.crc import key_slot

from bot.message import InboundMessage
from bot.service.app import make_store
from bot.store import Acquired, Store, StoreSettings
from bot.store.format import FORMAT
from bot.store.keys import (
    LAYOUT,
    LEGACY,
    LEGACY_SHARDS,
    META_KEY,
    SHARDS,
    TAGS,
    TAGS_DIGEST,
    Keys,
    Layout,
    active_key,
    due_key,
    heartbeat_key,
    legacy_tag,
    shard_of,
    usage_day_keys,
)
from bot.store.migrate import LayoutError, check_layout, legacy_keys, migrate
from tests.support import forked
from tests.support.console import clean_env
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.scripts import keyslot
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(60)

SLOTS = 16384


def test_sixty_four_shards_each_in_its_own_sixty_fourth_of_the_slots() -> None:
    assert SHARDS == 64 == len(TAGS) == len(set(TAGS)) == LAYOUT.shards
    assert LAYOUT.tags == TAGS
    width = SLOTS // SHARDS
    for shard, tag in enumerate(TAGS):
        # The midpoint of its range, by the tests' own CRC16 and by redis-py's.
        assert keyslot(f"{tag}:due") == shard * width + width // 2 == key_slot(tag.encode())
        assert tag.startswith(f"{{lw:{shard}.")
        assert tag not in {legacy_tag(n) for n in range(LEGACY_SHARDS)}
    # Written out: the tags are a deployment's data, and the store records this digest.
    assert (TAGS[0], TAGS[5], TAGS[63]) == ("{lw:0.10592}", "{lw:5.23512}", "{lw:63.7934}")
    assert TAGS_DIGEST == "54dbf74e" == LAYOUT.digest


def test_the_legacy_layout_is_sixteen_shards_of_plain_tags() -> None:
    assert LEGACY.shards == LEGACY_SHARDS == 16
    assert LEGACY.tags == tuple(f"{{lw:{n}}}" for n in range(16))
    k = Keys("telegram:42", LEGACY)
    assert (k.state, k.due) == ("{lw:5}:c:telegram:42:state", "{lw:5}:due")
    assert LEGACY.keys("telegram:42").base == k.base
    assert LEGACY.usage_day_keys(5, date(2024, 5, 6))[0] == "{lw:5}:usage:2024-05-06:totals"


def even_split(primaries: int) -> list[range]:
    """The slot ranges `redis-cli --cluster create` gives `primaries` nodes (as CLUSTER
    ADDSLOTSRANGE would be called with)."""
    per_node = SLOTS / primaries
    return [
        range(round(n * per_node), round((n + 1) * per_node) if n < primaries - 1 else SLOTS)
        for n in range(primaries)
    ]


def shards_per_node(primaries: int) -> list[int]:
    return [sum(1 for t in TAGS if key_slot(t.encode()) in r) for r in even_split(primaries)]


def test_an_even_slot_split_gets_an_even_share_of_the_shards() -> None:
    assert even_split(3) == [range(0, 5461), range(5461, 10923), range(10923, 16384)]
    assert shards_per_node(3) == [21, 22, 21]
    for primaries in range(1, SHARDS + 1):
        counts = shards_per_node(primaries)
        assert sum(counts) == SHARDS
        assert max(counts) - min(counts) <= 1, (primaries, counts)
        assert min(counts) >= 1


def test_conversations_spread_over_every_shard() -> None:
    counts = [0] * SHARDS
    for n in range(6400):
        counts[shard_of(f"telegram:{1_000_000 + n}")] += 1
    assert min(counts) > 50 and max(counts) < 150, counts


# The legacy layout, as every deployment before the 64 shards wrote it: the real scripts, run
# by a store built with that layout.


def today() -> date:
    return datetime.now(UTC).date()


def message(chat: str, n: int) -> InboundMessage:
    return InboundMessage("test", chat, "u1", f"m{n}", f"text {n}")


async def answer(store: Store, conversation: str, reply: str) -> None:
    grant = await store.acquire(conversation, "writer/1")
    assert isinstance(grant, Acquired), grant
    assert (await store.presend(grant.lease, grant.version, reply)).status == "ok"
    assert (await store.commit(grant.lease)).ok


# Twelve conversations: in legacy shards that each split over several new ones.
CHATS = [str(n) for n in range(12)]


async def write_legacy(make_settings: SettingsFactory, redis: Redis) -> Store:
    """Each conversation answered once (history, usage), then two more messages left pending
    (a due entry each), by a store of the legacy layout."""
    settings = StoreSettings.of(make_settings(debounce={"quiet_ms": 0, "max_wait_ms": 0}))
    store = Store(redis, settings, LEGACY)
    for chat in CHATS:
        await store.ingest(message(chat, 1))
        await answer(store, f"test:{chat}", f"reply to {chat}")
        await store.add_usage(f"test:{chat}", "u1", 10, 5)
        await store.ingest(message(chat, 2))
        await store.ingest(message(chat, 3))
    return store


async def snapshot(redis: Redis, layout: Layout = LAYOUT) -> dict[str, Any]:
    """Every conversation's data in `layout`, by what it is (not by key name): V, W, pending
    messages, history, dedupe ids, usage; its due and activity scores; that its keys expire."""
    seen: dict[str, Any] = {}
    for chat in CHATS:
        conversation = f"test:{chat}"
        k = Keys(conversation, layout)
        seen[conversation] = {
            "state": await redis.hgetall(k.state),
            "pending": await redis.hgetall(k.pending),
            "history": await redis.lrange(k.history, 0, -1),
            "seen": await redis.zrange(k.seen, 0, -1, withscores=True),
            "usage": await redis.hgetall(k.usage),
            "day": await redis.hgetall(k.day(today())),
            "due": await redis.zscore(k.due, conversation),
            "active": await redis.zscore(k.active, conversation),
            "ttl": await redis.pttl(k.state) > 0 and await redis.pttl(k.day(today())) > 0,
        }
    return seen


# What the store records: the layout, and the stored format (bot/store/format.py).
RECORD = {b"shards": b"64", b"tags": TAGS_DIGEST.encode(), b"format": str(FORMAT).encode()}


async def legacy_left(redis: Redis) -> list[str]:
    found = []
    for n in range(LEGACY_SHARDS):
        found += [k.decode() async for k in redis.scan_iter(match=f"{legacy_tag(n)}:*")]
    return found


async def test_a_fresh_store_records_the_layout_and_accepts_only_it(redis: Redis) -> None:
    await check_layout(redis)
    assert await redis.hgetall(META_KEY) == RECORD
    await check_layout(redis)  # again: the same layout

    await redis.hset(META_KEY, "shards", "128")
    with pytest.raises(LayoutError, match=r"128 shards.*uses 64"):
        await check_layout(redis)


async def test_legacy_data_is_refused_at_start(
    make_settings: SettingsFactory, redis: Redis
) -> None:
    await write_legacy(make_settings, redis)
    with pytest.raises(LayoutError, match=r"legacy layout of 16 shards.*lastword migrate-shards"):
        await check_layout(redis)
    assert await redis.exists(META_KEY) == 0


async def test_legacy_keys_are_found_without_the_indexes(redis: Redis) -> None:
    # An idle legacy deployment whose indexes are gone still has its conversations' keys.
    assert await legacy_keys(redis) == []
    await redis.hset("{lw:3.2945}:c:test:9:state", "v", 1)  # not legacy: a new tag
    assert await legacy_keys(redis) == []
    await redis.hset("{lw:12}:c:test:9:state", "v", 1)
    assert await legacy_keys(redis) == ["{lw:12}:c:test:9:state"]


async def test_migration_moves_everything_and_a_runtime_answers(
    make_settings: SettingsFactory,
    redis: Redis,
    runtime_factory: RuntimeFactory,
) -> None:
    await write_legacy(make_settings, redis)
    before = await snapshot(redis, LEGACY)
    legacy_usage = await redis.hgetall(LEGACY.usage_day_keys(1, today())[0])
    assert legacy_usage and {c["state"][b"v"] for c in before.values()} == {b"3"}
    assert {c["state"][b"w"] for c in before.values()} == {b"1"}
    assert all(c["due"] and c["active"] and c["ttl"] for c in before.values())
    assert len({shard_of(f"test:{chat}") for chat in CHATS}) > LEGACY_SHARDS // 2

    # A replica still running: refused, nothing moved.
    await redis.hset(heartbeat_key("r1"), "pid", 1)
    with pytest.raises(LayoutError, match="stop every replica"):
        await migrate(redis)
    assert await redis.exists(META_KEY) == 0
    await redis.delete(heartbeat_key("r1"))

    # Cut short after the first shard's keys; refused still; the next run finishes.
    def cut(line: str) -> None:
        raise RuntimeError("cut")

    with pytest.raises(RuntimeError):
        await migrate(redis, cut)
    with pytest.raises(LayoutError, match="migrate-shards"):
        await check_layout(redis)
    done = await migrate(redis)
    assert done.conversations > 0 and done.index_entries == 2 * len(CHATS)
    assert done.skipped == []

    assert await legacy_left(redis) == []
    assert await snapshot(redis) == before
    assert await redis.hgetall(META_KEY) == RECORD
    await check_layout(redis)
    # The day's usage: legacy shard N's totals under new shard N; ranking entries per shard.
    assert await redis.hgetall(usage_day_keys(1, today())[0]) == legacy_usage
    ranked = 0
    for shard in range(SHARDS):
        members: Any = await redis.zrange(usage_day_keys(shard, today())[1], 0, -1)
        for member in members:
            assert shard_of(member.decode()) == shard
            ranked += 1
    assert ranked == len(CHATS)
    assert (await migrate(redis)).nothing  # again: nothing left to do

    # A runtime of this version: dedupe kept, pending answered, history carried on.
    store = make_store(make_settings(), redis)
    assert not (await store.ingest(message("0", 3))).accepted  # a redelivery
    runtime, outbound = await runtime_factory()
    for chat in CHATS:
        await settled(runtime, f"test:{chat}", version=3)
        assert outbound.texts(f"test:{chat}") == ["You said: text 2 / text 3"]
        history = await store.history(f"test:{chat}")
        assert [h.text for h in history][-2:] == ["text 3", "You said: text 2 / text 3"]
        assert history[1].text == f"reply to {chat}"
        assert await redis.zscore(due_key(shard_of(f"test:{chat}")), f"test:{chat}") is None
        assert await redis.zscore(active_key(shard_of(f"test:{chat}")), f"test:{chat}")


def test_the_command_refuses_while_a_replica_runs_then_migrates(
    server: Any, short_dir: Path
) -> None:
    import redis as sync_redis

    client = sync_redis.Redis.from_url(server.url)
    client.hset("{lw:7}:c:test:7:state", mapping={"v": 2, "w": 1})
    client.zadd("{lw:7}:due", {"test:7": 1})
    client.hset(heartbeat_key("r1"), "pid", 1)
    env = clean_env(short_dir, LASTWORD_REDIS_URL=server.url)

    def run() -> subprocess.CompletedProcess[str]:
        return forked.run("migrate-shards", env=env, timeout=30)

    refused = run()
    assert refused.returncode == 1, refused
    assert "stop every replica" in refused.stderr
    client.delete(heartbeat_key("r1"))
    done = run()
    assert done.returncode == 0, done
    assert "migrated 1 conversations (1 keys), 1 index entries" in done.stdout
    assert client.hgetall(Keys("test:7").state) == {b"v": b"2", b"w": b"1"}
    again = run()
    assert again.returncode == 0 and "nothing to migrate" in again.stdout
    client.close()

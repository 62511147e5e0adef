"""`lastword status` data: heartbeats, roles, waiting conversations, leases and wake-ups, read
from a real server after driving it through the real store scripts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import ConnectionPool, UnixDomainSocketConnection

from bot.core.heartbeat import Heartbeat
from bot.message import InboundMessage
from bot.ops.status import duration, render
from bot.service.app import make_store
from bot.store import BudgetKeys, Store
from bot.store.census import Replica, Spender, Status, collect
from bot.store.embedded import EmbeddedRedis
from bot.store.keys import Keys, heartbeat_key, shard_of
from tests.support.factories import SettingsFactory
from tests.support.waits import eventually, server_ms


def message(chat: str, n: int, timestamp: float | None = None) -> InboundMessage:
    if timestamp is None:
        return InboundMessage("test", chat, "u1", f"m{n}", f"text {n}")
    return InboundMessage("test", chat, "u1", f"m{n}", f"text {n}", timestamp=timestamp)


def slow_store(redis: Redis, make_settings: SettingsFactory, quiet_ms: int = 60_000) -> Store:
    """A store whose windows stay open for the whole test, so ingested messages stay owed (and
    no replica may speculate on them: the next look is the deadline)."""
    debounce = {"quiet_ms": quiet_ms, "max_wait_ms": 120_000, "speculate_ms": 0}
    settings = make_settings(debounce=debounce)
    return make_store(settings, redis)


async def replica_ids(redis: Redis) -> set[str]:
    return {r.id for r in (await collect(redis)).replicas}


async def test_beat_appears_with_its_fields_and_expires(redis: Redis, store: Store) -> None:
    await store.beat("r1", {"platform": "test", "cycles": 2}, ttl_ms=500)
    now = await server_ms(redis)
    status = await collect(redis, now_ms=now)
    [replica] = status.replicas
    assert replica.id == "r1"
    assert (replica.pid, replica.host, replica.platform) == (
        os.getpid(),
        socket.gethostname(),
        "test",
    )
    assert replica.info == {"cycles": "2"}
    assert replica.last_beat_ms is not None and replica.started_at_ms == replica.last_beat_ms
    assert replica.beat_age_ms == now - replica.last_beat_ms
    assert 0 <= replica.beat_age_ms < 500
    assert 0 < replica.expires_in_ms <= 500

    async def gone() -> bool:
        return "r1" not in await replica_ids(redis)

    await eventually(gone, within_s=3)


async def test_beat_keeps_the_start_time_and_drops_old_fields(redis: Redis, store: Store) -> None:
    started = await store.beat("r1", {"cycles": 1}, ttl_ms=5000)
    again = await store.beat("r1", {"leases": 4}, ttl_ms=5000)
    assert again == started
    [replica] = (await collect(redis)).replicas
    assert replica.info == {"leases": "4"}
    # After the key expired (an outage), the caller's start time is kept.
    await redis.delete(heartbeat_key("r1"))
    assert await store.beat("r1", {}, ttl_ms=5000, started_at_ms=started - 60_000) == (
        started - 60_000
    )


async def test_heartbeat_outlives_its_ttl_and_a_clean_stop_removes_it(
    redis: Redis, store: Store
) -> None:
    leases = {"n": 0}
    heartbeat = Heartbeat(
        store, "r2", ttl_ms=300, platform="test", info=lambda: {"leases": leases["n"]}
    )
    heartbeat.start()
    try:

        async def beating() -> bool:
            return await redis.exists(heartbeat_key("r2")) == 1

        await eventually(beating)
        leases["n"] = 3

        # Five beats span well over the 300 ms TTL: the key is only alive if they renew it.
        async def renewed() -> bool:
            return heartbeat.beats >= 5

        await eventually(renewed)
        [replica] = (await collect(redis)).replicas
        assert (replica.id, replica.platform, replica.info) == ("r2", "test", {"leases": "3"})
        assert heartbeat.failures == 0
    finally:
        await heartbeat.stop()
    assert await redis.exists(heartbeat_key("r2")) == 0


@pytest.mark.fresh_server
async def test_heartbeat_rides_out_an_outage_warning_once(
    redis: Redis, store: Store, server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bot.core.heartbeat")
    heartbeat = Heartbeat(store, "r3", ttl_ms=150)
    heartbeat.start()
    try:

        async def beaten() -> bool:
            return heartbeat.beats >= 1

        await eventually(beaten)
        started = heartbeat.started_at_ms
        await asyncio.to_thread(server.stop)

        async def retried() -> bool:
            return heartbeat.failures >= 3

        await eventually(retried)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "r3" in warnings[0].getMessage()

        await asyncio.to_thread(server.start)
        beats = heartbeat.beats

        async def back() -> list[Replica]:
            # Read as status reads it, in the same look: with a 150 ms TTL, a beat late on a
            # loaded machine lets the key expire between two separate reads.
            listed = (await collect(redis)).replicas
            return [r for r in listed if r.id == "r3"] if heartbeat.beats > beats else []

        [replica] = await eventually(back)
        assert any("restored" in r.getMessage() for r in caplog.records)
        assert replica.started_at_ms == started
    finally:
        await heartbeat.stop()
    assert await redis.exists(heartbeat_key("r3")) == 0


async def test_a_held_role_shows_its_holder(redis: Redis, store: Store) -> None:
    assert await store.claim_role("telegram-poller", "r3/abcd", 5000) == 1
    status = await collect(redis)
    [role] = status.roles
    assert (role.name, role.lease.holder, role.lease.token) == ("telegram-poller", "r3", "r3/abcd")
    assert role.lease.fence == 1
    assert 0 < role.lease.expires_in_ms <= 5000
    # A released role leaves its fence counter behind but is not shown as held.
    assert await store.release_role("telegram-poller", "r3/abcd")
    assert (await collect(redis)).roles == ()


async def test_an_unanswered_conversation_shows_count_wait_and_next_look(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = slow_store(redis, make_settings)
    before = await server_ms(redis)
    first = (before - 2000) / 1000
    for n in (1, 2, 3):
        # The oldest message, not the newest, sets the wait.
        assert (await store.ingest(message("1", n, first + n - 1))).accepted
    now = await server_ms(redis)
    status = await collect(redis, now_ms=now)
    [waiting] = status.waiting
    due = await redis.zscore(Keys("test:1").due, "test:1")
    assert due is not None
    assert waiting.conversation == "test:1"
    assert waiting.unanswered == 3
    assert waiting.waited_ms == now - (before - 2000)
    assert waiting.next_look_ms == int(due) - now
    assert 55_000 < waiting.next_look_ms <= 60_000
    assert (waiting.lease, waiting.outbox) == (None, False)
    assert status.leases == ()


async def test_an_acquired_lease_shows_its_holder(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = slow_store(redis, make_settings, quiet_ms=0)
    await store.ingest(message("7", 1))

    # The window closes at the ingest's own millisecond; acquire once the server is past it.
    async def acquired() -> bool:
        return (await store.acquire("test:7", "r7/abc")).status == "acquired"

    await eventually(acquired)
    status = await collect(redis)
    [held] = status.leases
    assert (held.conversation, held.lease.holder, held.lease.fence) == ("test:7", "r7", 1)
    assert 0 < held.lease.expires_in_ms <= store.settings.ttl_ms
    [waiting] = status.waiting
    assert waiting.lease == held.lease
    assert waiting.unanswered == 1
    # The lease pushed the next look to its expiry, in case the holder dies.
    assert 0 < waiting.next_look_ms <= store.settings.ttl_ms


async def test_the_oldest_wakeup_is_the_smallest_due_score(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    chats = {"a": 30_000, "b": 10_000, "c": 20_000}
    assert len({shard_of(f"test:{chat}") for chat in chats}) > 1  # spans shards
    for n, (chat, quiet) in enumerate(chats.items()):
        await slow_store(redis, make_settings, quiet_ms=quiet).ingest(message(chat, n))
    now = await server_ms(redis)
    wakeup = (await collect(redis, now_ms=now)).oldest_wakeup
    scores = {}
    for chat in chats:
        score = await redis.zscore(Keys(f"test:{chat}").due, f"test:{chat}")
        assert score is not None
        scores[chat] = int(score)
    assert wakeup is not None
    assert (wakeup.conversation, wakeup.due_at_ms) == ("test:b", min(scores.values()))
    assert wakeup.overdue_ms == now - scores["b"] < 0

    # An overdue wake-up (quiet 0, nobody sweeping) is older still, and shows as overdue.
    await slow_store(redis, make_settings, quiet_ms=0).ingest(message("d", 9))
    later = await server_ms(redis) + 50
    wakeup = (await collect(redis, now_ms=later)).oldest_wakeup
    assert wakeup is not None and wakeup.conversation == "test:d"
    assert wakeup.overdue_ms >= 50


async def populated(redis: Redis, make_settings: SettingsFactory) -> Status:
    """A snapshot with every section filled: a replica, a role, a leased and a waiting chat."""
    store = slow_store(redis, make_settings, quiet_ms=0)
    await store.beat("r7", {"platform": "test", "cycles": 1}, ttl_ms=10_000)
    await store.claim_role("telegram-poller", "r7/abcd", 10_000)
    await store.ingest(message("7", 1))

    async def acquired() -> bool:
        return (await store.acquire("test:7", "r7/abc")).status == "acquired"

    await eventually(acquired)
    await slow_store(redis, make_settings).ingest(message("8", 2))
    await store.change_access("555", "access", "deny", by="9")
    await store.change_access("555", "budget", "2000", by="9")
    # A 429 held the bot of the replica's platform (and one of a platform no replica runs).
    await store.hold(BudgetKeys("test"), "bot", 60_000)
    await store.hold(BudgetKeys("elsewhere"), "bot", 60_000)
    return await collect(redis)


async def test_to_json_round_trips_with_stable_keys(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    data = (await populated(redis, make_settings)).to_json()
    assert json.loads(json.dumps(data)) == data
    assert set(data) == {
        "now_ms",
        "replicas",
        "roles",
        "conversations",
        "leases",
        "oldest_wakeup",
        "tokens_today",
        "access",
        "held",
        "heard",
    }
    [held] = data["held"]
    assert (held["platform"], held["scope"]) == ("test", "bot")
    assert 50_000 < held["ends_in_ms"] <= 60_000
    # The other platform's 429 is not this deployment's.
    assert data["heard"] == [{"platform": "test", "kind": "bot", "count": 1, "held_ms": 60_000}]
    [record] = data["access"]
    assert record == {
        "user": "555",
        "access": "deny",
        "budget": 2000,
        "by": "9",
        "at_ms": record["at_ms"],
        "seq": record["seq"],
    }
    # Numbered above the first change, and never below the server's time of the change.
    assert record["seq"] >= record["at_ms"]
    assert abs(record["at_ms"] - data["now_ms"]) < 60_000
    assert data["replicas"][0]["id"] == "r7" and data["replicas"][0]["info"] == {"cycles": "1"}
    assert data["roles"][0]["holder"] == "r7"
    assert {c["conversation"] for c in data["conversations"]} == {"test:7", "test:8"}
    [lease] = data["leases"]
    assert lease == {
        "conversation": "test:7",
        "token": "r7/abc",
        "holder": "r7",
        "fence": 1,
        "expires_in_ms": lease["expires_in_ms"],
    }
    assert 0 < lease["expires_in_ms"] <= 30_000
    assert data["oldest_wakeup"]["conversation"] in {"test:7", "test:8"}


HEARD = "429s heard by every replica, kept a day"


async def test_render_shows_every_section(redis: Redis, make_settings: SettingsFactory) -> None:
    text = render(await populated(redis, make_settings))
    lines = text.splitlines()
    for heading in (
        "replicas (1)",
        "roles (1)",
        "conversations waiting (2)",
        "leases held (1)",
        "oldest wake-up",
        "access changed in chat (1)",
        "held after a 429 (1): no replica sends under these",
        HEARD,
    ):
        assert heading in lines

    def row(first_cell: str, after: str) -> list[str]:
        return row_of(text, after, first_cell)

    replica = row("r7", "replicas (1)")
    assert replica[1] == socket.gethostname() and replica[2] == str(os.getpid())
    assert replica[3] == "test" and "telegram-poller" in replica and "cycles=1" in replica
    assert row("telegram-poller", "roles (1)")[1:3] == ["r7", "1"]
    # CONVERSATION UNANSWERED WAITED NEXT LOOK (two words: "in 1.5s") LEASE OUTBOX
    leased = row("test:7", "conversations waiting (2)")
    assert [leased[1], leased[3], *leased[5:]] == ["1", "in", "r7", "no"]
    owed = row("test:8", "conversations waiting (2)")
    assert [owed[1], owed[3], *owed[5:]] == ["1", "in", "none", "no"]
    assert row("test:7", "leases held (1)")[1:3] == ["r7", "1"]
    # USER ACCESS DAILY BUDGET BY WHEN ("0ms ago": two words)
    assert row("555", "access changed in chat (1)")[:4] == ["555", "deny", "2,000", "9"]
    assert row("test", "held after a 429 (1): no replica sends under these")[1] == "bot"
    assert row("test", HEARD)[1:] == ["bot", "1", "1m00s"]
    # Aligned: every row of a table starts its columns where the header's do.
    header = next(line for line in lines if line.strip().startswith("CONVERSATION  UNANSWERED"))
    for line in lines[lines.index(header) + 1 : lines.index(header) + 3]:
        assert line[header.index("UNANSWERED") - 1] == " "
        assert line[header.index("UNANSWERED")] != " "


async def test_an_empty_store_says_none_everywhere(redis: Redis) -> None:
    status = await collect(redis)
    today = datetime.now(UTC).date().isoformat()
    assert status.to_json() | {"now_ms": 0} == {
        "now_ms": 0,
        "replicas": [],
        "roles": [],
        "conversations": [],
        "leases": [],
        "oldest_wakeup": None,
        "tokens_today": {
            "day": today,
            "prompt": 0,
            "completion": 0,
            "generations": 0,
            "replies": 0,
            "interrupted": 0,
            "forced": 0,
            "users": 0,
            "top": [],
        },
        "access": [],
        "held": [],
        "heard": [],
    }
    assert render(status).count("  none") == 8
    assert (
        f"tokens today ({today}, UTC): 0 tokens (0 prompt + 0 completion) in 0 generations; "
        "0 replies to 0 users, 0 interrupted, 0 forced"
    ) in render(status)


async def test_tokens_today_add_up_over_shards_and_rank_the_conversations(
    redis: Redis, store: Store
) -> None:
    # Conversations in different shards, so the totals and the ranking are merged.
    conversations = sorted({shard_of(f"test:{n}"): f"test:{n}" for n in range(100)}.values())
    spent = {c: (100 * (i + 1), 10 * (i + 1)) for i, c in enumerate(conversations[:12])}
    for conversation, (prompt, completion) in spent.items():
        await store.add_usage(conversation, "u", prompt, completion)
    await store.add_usage(conversations[0], "u", 5000, 0)  # now the biggest spender
    tokens = (await collect(redis)).tokens_today
    assert tokens is not None
    assert tokens.prompt == sum(p for p, _ in spent.values()) + 5000
    assert tokens.completion == sum(c for _, c in spent.values())
    assert tokens.generations == len(spent) + 1
    expected = sorted(
        ((c, p + k + (5000 if c == conversations[0] else 0)) for c, (p, k) in spent.items()),
        key=lambda pair: -pair[1],
    )
    assert list(tokens.top) == [Spender(c, spent) for c, spent in expected[:10]]
    assert tokens.top[0] == Spender(conversations[0], 5110)
    text = render(await collect(redis)).splitlines()
    assert tokens.users == len(spent)
    header = text.index(
        f"tokens today ({tokens.day}, UTC): {tokens.prompt + tokens.completion:,} tokens "
        f"({tokens.prompt:,} prompt + {tokens.completion:,} completion) "
        f"in {tokens.generations} generations; "
        f"0 replies to {len(spent)} users, 0 interrupted, 0 forced"
    )
    assert text[header + 1].split() == ["CONVERSATION", "TOKENS"]
    assert text[header + 2].split() == [conversations[0], "5,110"]

    # Tomorrow starts from nothing: the counts are per UTC day.
    tomorrow = (await server_ms(redis)) + 86_400_000
    later = (await collect(redis, now_ms=tomorrow)).tokens_today
    assert later is not None and (later.prompt, later.generations, later.top) == (0, 0, ())


class CountingConnection(UnixDomainSocketConnection):
    """Counts the writes to the server: one per command, one per whole pipeline."""

    writes = 0

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.writes += 1
        await super().send_packed_command(*args, **kwargs)


async def test_a_thousand_waiting_conversations_take_three_round_trips(
    server: EmbeddedRedis, redis: Redis, make_settings: SettingsFactory
) -> None:
    store = slow_store(redis, make_settings)
    for start in range(0, 1000, 100):
        await asyncio.gather(*(store.ingest(message(str(n), n)) for n in range(start, start + 100)))
    await store.beat("r1", {}, ttl_ms=10_000)
    pool = ConnectionPool(connection_class=CountingConnection, path=str(server.socket))
    counting = Redis.from_pool(pool)
    try:
        await counting.ping()  # connects (and handshakes) outside the count
        CountingConnection.writes = 0
        # One SCAN call covers this keyspace: only the pipelines are counted.
        status = await collect(counting, scan_count=100_000)
        assert CountingConnection.writes <= 3
    finally:
        await counting.aclose()
    assert len(status.waiting) == 1000
    assert {w.unanswered for w in status.waiting} == {1}
    assert [r.id for r in status.replicas] == ["r1"]


def test_durations_read_like_a_human_would_write_them() -> None:
    assert [duration(ms) for ms in (None, 850, 12_340, 245_000, 7_380_000, 273_600_000)] == [
        "-",
        "850ms",
        "12.3s",
        "4m05s",
        "2h03m",
        "3d04h",
    ]
    assert duration(-1500) == "-1.5s"


async def test_one_of_a_kind_reads_in_the_singular(redis: Redis, store: Store) -> None:
    await store.add_usage("test:solo", "u", 10, 5)
    tokens = (await collect(redis)).tokens_today
    assert tokens is not None
    assert (
        f"tokens today ({tokens.day}, UTC): 15 tokens (10 prompt + 5 completion) in 1 generation; "
        "0 replies to 1 user, 0 interrupted, 0 forced"
    ) in render(await collect(redis)).splitlines()


async def test_a_long_bot_wide_hold_is_flagged_and_every_replicas_429s_are_counted(
    redis: Redis, store: Store, make_settings: SettingsFactory
) -> None:
    await store.beat("r1", {"platform": "test"}, ttl_ms=10_000)
    keys = BudgetKeys("test")
    # Two replicas' 429s: a chat's long hold and the bot's short one are not flagged.
    elsewhere = make_store(make_settings(), redis)
    await store.hold(keys, "chat:1", 3_600_000)
    await elsewhere.hold(keys, "chat:2", 20_000)
    await elsewhere.hold(keys, "bot", 20_000)
    status = await collect(redis)
    assert [(h.platform, h.kind, h.count, h.held_ms) for h in status.heard] == [
        ("test", "bot", 1, 20_000),
        ("test", "chat", 2, 3_620_000),
    ]
    text = render(status)
    assert row_of(text, HEARD, "test") == ["test", "bot", "1", "20.0s"]
    assert BOT_HELD not in text

    # The bot held for an hour: flagged under the holds, the time it added counted.
    await store.hold(keys, "bot", 3_600_000)
    status = await collect(redis)
    [bot] = [h for h in status.heard if h.kind == "bot"]
    # 20 s, then what the hour added past them: the hour less what was left of the 20 s.
    assert bot.count == 2 and 3_600_000 <= bot.held_ms < 3_620_000
    lines = render(status).splitlines()
    [flag] = [line for line in lines if BOT_HELD in line]
    # An hour, less what has passed since: 1h00m read within a millisecond, 59m after.
    assert flag.startswith((f"  test: {BOT_HELD} 1h00m", f"  test: {BOT_HELD} 59m")), flag
    assert flag.endswith(" (a 429)")
    held = lines.index("held after a 429 (3): no replica sends under these")
    assert lines.index(flag) == held + 5  # after the header and the three scopes' rows


BOT_HELD = "held: the platform takes no call from the bot for another"


def row_of(text: str, after: str, first_cell: str) -> list[str]:
    """The cells of the first row under the heading `after` that starts with `first_cell`."""
    lines = text.splitlines()
    start = lines.index(after)
    return next(line.split() for line in lines[start:] if line.split()[:1] == [first_cell])

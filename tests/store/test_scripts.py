"""Each store script on its own, against a real server.

The scripts are the whole concurrency story (SPEC, storage rules): dedupe, the window with its
cap, the due-index, the lease with its token and fence, the pre-send check with the starvation
guard, and the commit. These tests drive them through `Store` and look at the keys directly,
so a script that does the right thing for the wrong reason (or only most of the thing) fails.
Deadlines are checked against the server's own clock, bracketed by `TIME` before and after.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.message import Attachment, InboundMessage
from bot.store import (
    ACCESS_COPY,
    Acquired,
    Ended,
    Lease,
    NotAcquired,
    PreSend,
    Store,
    scripts,
)
from bot.store.keys import (
    HEARTBEAT_PATTERN,
    LEGACY_SHARDS,
    META_KEY,
    ROLE_TAG,
    SHARDS,
    Keys,
    PersonKeys,
    access_key,
    due_key,
    heartbeat_key,
    kept_key,
    legacy_shard_of,
    legacy_tag,
    role_key,
    shard_of,
    usage_day_keys,
)
from tests.support.factories import SettingsFactory
from tests.support.scripts import acquire_when_ready, build, crc16, keyslot
from tests.support.waits import eventually, server_ms

pytestmark = pytest.mark.timeout(30)

CONV = "test:1"


def message(n: int, chat: str = "1", message_id: str | None = None) -> InboundMessage:
    return InboundMessage("test", chat, "u1", message_id or f"m{n}", f"text {n}")


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def hash_of(redis: Redis, key: str) -> dict[str, str]:
    raw = await redis.hgetall(key)
    return {text(k): text(v) for k, v in raw.items()}


async def int_field(redis: Redis, key: str, field: str) -> int:
    value = await redis.hget(key, field)
    assert value is not None, f"{key} has no {field}"
    return int(value)


async def due_score(redis: Redis, conversation: str) -> float | None:
    score: float | None = await redis.zscore(Keys(conversation).due, conversation)
    return score


async def snapshot(redis: Redis, conversation: str) -> dict[str, Any]:
    """Everything stored for a conversation, byte for byte, plus its due-index entry.

    DUMP leaves TTLs out, which tick on their own; what a rejected step must not change is the
    content.
    """
    k = Keys(conversation)
    names = [k.state, k.pending, k.seen, k.window, k.lease, k.outbox, k.history]
    dumped: dict[str, Any] = {name: await redis.dump(name) for name in names}
    dumped["due"] = await due_score(redis, conversation)
    return dumped


async def cycle_once(store: Store, conversation: str, reply: str) -> Acquired:
    """A whole successful cycle at the store level: acquire, pre-send check, commit."""
    grant = await acquire_when_ready(store, conversation, f"token-{reply}")
    assert await store.presend(grant.lease, grant.version, reply) == PreSend("ok")
    assert (await store.commit(grant.lease)).ok
    return grant


# -- ingest: dedupe ------------------------------------------------------------------------------


async def test_redelivery_does_not_bump_version(store: Store, redis: Redis) -> None:
    first = await store.ingest(message(1))
    assert first.accepted and first.version == 1

    # Same platform id, even with a different body (a webhook retry after an edit): dropped.
    again = await store.ingest(InboundMessage("test", "1", "u1", "m1", "changed"))
    assert not again.accepted
    assert again.version == 1
    assert again.look_in_ms is None

    second = await store.ingest(message(2))
    assert second.accepted and second.version == 2
    assert await store.counters(CONV) == (2, 0)
    pending = await hash_of(redis, Keys(CONV).pending)
    assert sorted(pending) == ["1", "2"]
    assert InboundMessage.from_json(pending["1"]).text == "text 1"


async def test_recent_lists_active_conversations_with_their_last_message(
    store: Store, redis: Redis
) -> None:
    await store.ingest(InboundMessage("discord", "10", "u1", "100", "a"))
    await store.ingest(InboundMessage("discord", "10", "u1", "105", "b"))
    # A redelivery of an older message does not move `last` back.
    await store.ingest(InboundMessage("discord", "10", "u1", "100", "a"))
    await store.ingest(InboundMessage("discord", "20", "u2", "200", "c"))
    await store.ingest(InboundMessage("telegram", "10", "u1", "7", "d"))
    assert await store.recent("discord", 60_000) == {"discord:10": "105", "discord:20": "200"}
    assert await store.recent("telegram", 60_000) == {"telegram:10": "7"}

    # Ageing out: a conversation whose last message is older than the window is not listed.
    key = Keys("discord:20").active
    await redis.zadd(key, {"discord:20": await server_ms(redis) - 120_000})
    assert await store.recent("discord", 60_000) == {"discord:10": "105"}


async def test_dedupe_is_per_conversation(store: Store) -> None:
    assert (await store.ingest(message(1, chat="1"))).accepted
    # The same platform message id in another chat is another message.
    other = await store.ingest(message(1, chat="2"))
    assert other.accepted and other.version == 1
    assert not (await store.ingest(message(1, chat="2"))).accepted
    assert await store.counters("test:1") == (1, 0)
    assert await store.counters("test:2") == (1, 0)


async def test_redelivery_after_the_reply_is_still_dropped(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    await store.ingest(message(1))
    await cycle_once(store, CONV, "answered")
    again = await store.ingest(message(1))
    assert not again.accepted
    assert await store.counters(CONV) == (1, 1)
    assert await store.acquire(CONV, "late") == NotAcquired("idle")


# -- ingest: the window --------------------------------------------------------------------------


async def test_window_extends_but_never_past_cap(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    quiet, cap = 100, 400
    store = build(make_settings, redis, quiet=quiet, max_wait=cap)
    k = Keys(CONV)

    before = await server_ms(redis)
    first = await store.ingest(message(0))
    after = await server_ms(redis)
    opened = await int_field(redis, k.window, "opened")
    deadline = await int_field(redis, k.window, "deadline")
    assert before <= opened <= after
    assert deadline == opened + quiet
    assert first.look_in_ms == quiet
    assert await due_score(redis, CONV) == deadline

    # Keep typing for well over max_wait: the deadline follows the quiet period, then sticks
    # to the cap counted from the first message.
    n = 1
    previous = deadline
    while after < opened + cap + 2 * quiet:
        before = await server_ms(redis)
        result = await store.ingest(message(n))
        after = await server_ms(redis)
        window = await hash_of(redis, k.window)
        deadline = int(window["deadline"])
        assert int(window["opened"]) == opened, "a later message moved the anchor"
        assert min(before + quiet, opened + cap) <= deadline <= min(after + quiet, opened + cap)
        assert deadline >= previous
        assert result.look_in_ms is not None
        assert max(deadline - after, 0) <= result.look_in_ms <= max(deadline - before, 0)
        assert await due_score(redis, CONV) == deadline
        previous = deadline
        n += 1
        await asyncio.sleep(0.025)

    assert n > 10
    assert deadline == opened + cap
    assert result.look_in_ms == 0
    assert await store.counters(CONV) == (n, 0)

    # The lease consumes the window; the next message opens a fresh one with its own anchor.
    grant = await acquire_when_ready(store, CONV, "holder")
    assert grant.version == n
    assert not await redis.exists(k.window)
    before = await server_ms(redis)
    await store.ingest(message(n))
    reopened = await int_field(redis, k.window, "opened")
    assert reopened >= before
    assert await int_field(redis, k.window, "deadline") == reopened + quiet


# -- the due-index and the hash-tag rule ---------------------------------------------------------


def test_keyslot_matches_redis_cluster() -> None:
    # Values from the CLUSTER KEYSLOT documentation.
    assert keyslot("somekey") == 11058
    assert keyslot("foo{hash_tag}") == 2515
    assert keyslot("bar{hash_tag}") == 2515
    assert crc16(b"123456789") == 0x31C3


@pytest.mark.parametrize(
    "conversation", ["test:1", "telegram:123456789", "discord:{42}", "odd:}{:{}", "x:" + "é" * 40]
)
def test_conversation_keys_share_one_slot_with_their_due_shard(conversation: str) -> None:
    k = Keys(conversation)
    names = [k.state, k.pending, k.seen, k.window, k.lease, k.outbox, k.history, k.due]
    names += [k.heard, k.transcript("doc:file-1")]
    assert len(set(names)) == len(names)
    assert {keyslot(name) for name in names} == {keyslot(k.due)}
    assert k.due == due_key(shard_of(conversation))
    assert 0 <= shard_of(conversation) < SHARDS


def test_key_names_are_those_of_existing_deployments() -> None:
    # Written out here, not taken from `bot.store.keys`: a deployment's data lives under these
    # names, so a change there that renames any of them must fail here.
    k = Keys("telegram:42")
    kinds = ["state", "pending", "seen", "window", "lease", "outbox", "history", "rate"]
    kinds += ["notice", "usage"]
    names = {kind: getattr(k, kind) for kind in kinds}
    assert names == {kind: "{lw:53.5995}:c:telegram:42:" + kind for kind in kinds}
    assert k.day(date(2024, 5, 6)) == "{lw:53.5995}:c:telegram:42:day:2024-05-06"
    # forget.lua finds a cached transcript as the index's name, ":", its file key.
    assert k.transcript("doc:f1") == "{lw:53.5995}:c:telegram:42:heard:doc:f1"
    assert k.heard == "{lw:53.5995}:c:telegram:42:heard"
    # A person's keys are in their home's slot: telegram:42's DM's.
    person = PersonKeys("telegram", "42")
    assert (person.rate, person.places) == (
        "{lw:53.5995}:p:telegram:42:rate",
        "{lw:53.5995}:p:telegram:42:places",
    )
    assert person.day(date(2024, 5, 6)) == "{lw:53.5995}:p:telegram:42:day:2024-05-06"
    assert person.month(date(2024, 5, 6)) == "{lw:53.5995}:p:telegram:42:month:2024-05"
    assert (k.due, k.active) == ("{lw:53.5995}:due", "{lw:53.5995}:active")
    assert usage_day_keys(3, date(2024, 5, 6)) == (
        "{lw:3.2945}:usage:2024-05-06:totals",
        "{lw:3.2945}:usage:2024-05-06:ranking",
    )
    assert (SHARDS, META_KEY) == (64, "{lw:meta}")
    # The legacy layout, which `lastword migrate-shards` moves: 16 shards, `{lw:N}`.
    assert (LEGACY_SHARDS, legacy_tag(5), legacy_shard_of("telegram:42")) == (16, "{lw:5}", 5)
    assert (ROLE_TAG, role_key("telegram:poller")) == ("{lw:role}", "{lw:role}:telegram:poller")
    assert kept_key("discord:session") == "{lw:role}:kept:discord:session"
    assert (heartbeat_key("r1"), HEARTBEAT_PATTERN) == ("{lw:replica}:r1", "{lw:replica}:*")


async def test_scripts_write_only_keys_of_the_conversations_slot(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    for chat in ("1", "2", "3"):
        await store.ingest(message(1, chat=chat))
        await store.ingest(message(2, chat=chat))
    await cycle_once(store, "test:1", "reply")
    grant = await acquire_when_ready(store, "test:2", "holder")
    await store.ingest(message(3, chat="2"))
    assert (await store.presend(grant.lease, grant.version, "stale")).status == "stale"

    keys = [text(key) for key in await redis.keys("*")]
    assert keys
    for key in keys:
        if ":p:" in key:
            # A person's keys: in the slot of their home (`PersonKeys`), whoever wrote them.
            platform, user = key.split(":p:", 1)[1].rsplit(":", 1)[0].split(":", 1)
            assert keyslot(key) == keyslot(PersonKeys(platform, user).rate), key
            continue
        conversation = key.split(":c:", 1)[1].rsplit(":", 1)[0] if ":c:" in key else None
        if conversation is None:
            # The shard-wide indexes and day totals: named by their shard's tag alone.
            assert key.rsplit(":", 1)[1] in ("due", "active", "totals"), key
            continue
        assert keyslot(key) == keyslot(Keys(conversation).due), key


async def test_ingest_schedules_the_deadline_in_the_due_index(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, quiet=1000)
    await store.ingest(message(1))
    deadline = await int_field(redis, Keys(CONV).window, "deadline")
    assert await due_score(redis, CONV) == deadline
    assert await redis.zrange(Keys(CONV).due, 0, -1) == [CONV.encode()]

    # The sweep sees it only once the deadline has passed on the server's clock (asked
    # before it, by that clock: a loaded machine may stall this test past the window).
    early = CONV in await store.due()
    if await server_ms(redis) < deadline:
        assert not early

    async def listed() -> bool:
        return CONV in await store.due()

    await eventually(listed, within_s=5)
    assert await server_ms(redis) >= deadline


async def evalsha_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_a_sweep_on_one_server_reads_every_shard_in_one_call(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    # A conversation in each of eight shards, every one of them due at once (quiet 0).
    chats: dict[int, str] = {}
    for n in range(200):
        chats.setdefault(shard_of(f"test:{n}"), str(n))
        if len(chats) == 8:
            break
    for chat in chats.values():
        await store.ingest(message(1, chat=chat))
    wanted = {f"test:{chat}" for chat in chats.values()}

    async def all_due() -> bool:
        return set(await store.due()) >= wanted

    await eventually(all_due, within_s=5)
    before = await evalsha_calls(redis)
    assert set(await store.due()) >= wanted
    # One script call for the 64 shards (the GET of the access seq rides in the same pipeline).
    assert await evalsha_calls(redis) - before == 1


# -- acquire -------------------------------------------------------------------------------------


async def test_acquire_is_early_before_the_deadline_then_acquired(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, quiet=500, max_wait=1000)
    k = Keys(CONV)
    await store.ingest(message(1))
    deadline = await int_field(redis, k.window, "deadline")

    before = await server_ms(redis)
    early = await store.acquire(CONV, "too-soon")
    after = await server_ms(redis)
    assert isinstance(early, NotAcquired) and early.status == "early"
    assert early.look_in_ms is not None
    assert deadline - after <= early.look_in_ms <= deadline - before
    assert not await redis.exists(k.lease)
    assert await due_score(redis, CONV) == deadline
    assert await redis.exists(k.window)

    grant = await acquire_when_ready(store, CONV, "on-time")
    assert grant.status == "acquired"
    assert grant.lease == Lease(CONV, "on-time", 1)
    assert grant.lateness_ms >= 0  # taken at or after the deadline, by the server's clock
    assert await hash_of(redis, k.lease) == {"token": "on-time", "fence": "1", "ttl": "1500"}


async def test_fence_rises_on_every_acquisition(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    fences = []
    for n in range(1, 5):
        await store.ingest(message(n))
        grant = await acquire_when_ready(store, CONV, f"holder-{n}")
        fences.append(grant.lease.fence)
        # Alternate endings: a release without reply, or a full commit.
        if n % 2:
            assert (await store.release(grant.lease)).ok
        else:
            assert (await store.presend(grant.lease, grant.version, f"r{n}")).status == "ok"
            assert (await store.commit(grant.lease)).ok
    assert fences == [1, 2, 3, 4]
    assert await int_field(redis, Keys(CONV).state, "fence") == 4


async def test_acquire_is_busy_while_leased(redis: Redis, make_settings: SettingsFactory) -> None:
    store = build(make_settings, redis, ttl=1500)
    k = Keys(CONV)
    await store.ingest(message(1))
    holder = await acquire_when_ready(store, CONV, "holder")
    held = await hash_of(redis, k.lease)

    left_before = await redis.pttl(k.lease)
    before = await server_ms(redis)
    busy = await store.acquire(CONV, "other")
    after = await server_ms(redis)
    left_after = await redis.pttl(k.lease)
    assert isinstance(busy, NotAcquired) and busy.status == "busy"
    assert busy.look_in_ms is not None
    assert left_after <= busy.look_in_ms <= left_before <= 1500
    assert await hash_of(redis, k.lease) == held
    # Looked at again when the lease runs out, in case its holder died.
    score = await due_score(redis, CONV)
    assert score is not None
    # 1 ms of slack: TIME and key expiry read the clock at slightly different moments.
    assert before + left_after - 1 <= score <= after + left_before + 1
    assert (await store.release(holder.lease)).ok


async def test_acquire_is_idle_when_everything_is_answered(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    k = Keys(CONV)
    assert await store.acquire("test:never", "anyone") == NotAcquired("idle")

    await store.ingest(message(1))
    await cycle_once(store, CONV, "done")
    # A stale entry, as a replica that crashed mid-schedule could leave behind.
    await redis.zadd(k.due, {CONV: await server_ms(redis)})
    before = await snapshot(redis, CONV)

    assert await store.acquire(CONV, "stale-wakeup") == NotAcquired("idle")
    assert await due_score(redis, CONV) is None
    assert not await redis.exists(k.lease)
    after = await snapshot(redis, CONV)
    assert {**after, "due": before["due"]} == before
    assert await int_field(redis, k.state, "fence") == 1


async def test_acquire_returns_pending_in_order_and_the_history(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    for n in (1, 2):
        await store.ingest(message(n))
    first = await cycle_once(store, CONV, "first reply")
    assert [m.text for m in first.unanswered] == ["text 1", "text 2"]
    assert first.history == ()

    for n in (3, 4, 5):
        await store.ingest(message(n))
    grant = await acquire_when_ready(store, CONV, "second")
    assert (grant.version, grant.watermark) == (5, 2)
    assert [m.text for m in grant.unanswered] == ["text 3", "text 4", "text 5"]
    assert [m.message_id for m in grant.unanswered] == ["m3", "m4", "m5"]
    assert [(h.role, h.version, h.text) for h in grant.history] == [
        ("user", 1, "text 1"),
        ("user", 2, "text 2"),
        ("assistant", 2, "first reply"),
    ]
    assert grant.resend is None
    await store.release(grant.lease)

    # Only the newest history_cap entries come back.
    short = build(make_settings, redis, history_cap=2)
    trimmed = await acquire_when_ready(short, CONV, "third")
    assert [(h.role, h.text) for h in trimmed.history] == [
        ("user", "text 2"),
        ("assistant", "first reply"),
    ]


async def test_acquire_takes_a_flood_of_unanswered_messages(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    # Past ~8000 values Lua's unpack() fails; a script error after taking the lease would wedge
    # the conversation for good, every retry failing the same way.
    count = 9000
    # A lease that outlives taking 9000 messages in on a loaded machine (1.5 s did not).
    store = build(make_settings, redis, ttl=30_000)
    k = Keys(CONV)
    await store.ingest(message(1))
    # The rest stored exactly as ingest stores them, in one command: 9000 round trips of
    # ingest would only make the test slow.
    await redis.hset(k.pending, mapping={n: message(n).to_json() for n in range(2, count + 1)})
    await redis.hset(k.state, "v", count)

    grant = await store.acquire(CONV, "owner")
    assert grant.status == "acquired"
    assert [m.text for m in grant.unanswered] == [f"text {n}" for n in range(1, count + 1)]
    assert (await store.presend(grant.lease, grant.version, "one reply")).status == "ok"
    assert (await store.commit(grant.lease)).ok
    assert await store.counters(CONV) == (count, count)
    assert not await redis.exists(k.pending)
    history = await store.history(CONV)
    assert len(history) == 200  # the default cap
    assert history[-1].text == "one reply"
    assert history[-2].text == f"text {count}"


# -- the lease -----------------------------------------------------------------------------------


async def test_lease_is_taken_by_compare_and_swap(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    await store.ingest(message(1))
    grants = await asyncio.gather(*(store.acquire(CONV, f"t{i}") for i in range(8)))
    winners = [g for g in grants if g.status == "acquired"]
    assert len(winners) == 1
    assert sorted(g.status for g in grants if g is not winners[0]) == ["busy"] * 7
    token = winners[0].lease.token
    assert await hash_of(redis, Keys(CONV).lease) == {"token": token, "fence": "1", "ttl": "1500"}


async def test_lease_expires_on_its_own(redis: Redis, make_settings: SettingsFactory) -> None:
    ttl = 300
    store = build(make_settings, redis, ttl=ttl)
    await store.ingest(message(1))
    before = await server_ms(redis)
    crashed = await acquire_when_ready(store, CONV, "crashed")
    assert 0 < await redis.pttl(Keys(CONV).lease) <= ttl

    # The holder never renews nor releases: the lease must free itself after the TTL.
    statuses: list[str] = []
    async with asyncio.timeout(3):
        while (grant := await store.acquire(CONV, "next")).status != "acquired":
            statuses.append(grant.status)
            await asyncio.sleep(0.01)
    after = await server_ms(redis)
    assert statuses and set(statuses) == {"busy"}
    assert after - before >= ttl
    assert grant.lease.fence == crashed.lease.fence + 1
    assert grant.version == 1 and [m.text for m in grant.unanswered] == ["text 1"]


async def test_renew_checks_token_and_fence(redis: Redis, make_settings: SettingsFactory) -> None:
    store = build(make_settings, redis, ttl=1500)
    k = Keys(CONV)
    await store.ingest(message(1))
    grant = await acquire_when_ready(store, CONV, "owner")
    lease = grant.lease
    assert lease is not None
    held = await hash_of(redis, k.lease)
    # Shorten the lease so that a renewal is visible in its TTL.
    await redis.pexpire(k.lease, 400)

    assert not await store.renew(Lease(CONV, "intruder", lease.fence))
    assert not await store.renew(Lease(CONV, lease.token, lease.fence + 1))
    assert not await store.renew(Lease(CONV, lease.token, lease.fence - 1))
    assert 0 < await redis.pttl(k.lease) <= 400
    assert await hash_of(redis, k.lease) == held

    before = await server_ms(redis)
    assert await store.renew(lease)
    assert await redis.pttl(k.lease) > 1000
    assert await hash_of(redis, k.lease) == held
    score = await due_score(redis, CONV)
    assert score is not None and score >= before + 1500

    # Once released, renewing fails and does not bring the lease back.
    assert (await store.release(lease)).ok
    assert not await store.renew(lease)
    assert not await redis.exists(k.lease)


async def test_release_by_a_non_owner_changes_nothing(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    k = Keys(CONV)
    await store.ingest(message(1))
    grant = await acquire_when_ready(store, CONV, "owner")
    before = await snapshot(redis, CONV)

    assert await store.release(Lease(CONV, "intruder", grant.lease.fence)) == Ended(False, None)
    assert await snapshot(redis, CONV) == before
    assert await redis.pttl(k.lease) > 0

    # The owner's release frees it and, with a reply still owed, schedules the next look.
    before_ms = await server_ms(redis)
    ended = await store.release(grant.lease)
    assert ended.ok and ended.look_in_ms == 0
    assert not await redis.exists(k.lease)
    score = await due_score(redis, CONV)
    assert score is not None and score >= before_ms
    assert await store.counters(CONV) == (1, 0)


async def test_stale_fence_is_rejected_after_expiry(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    k = Keys(CONV)
    slow = build(make_settings, redis, ttl=300)  # holder A, which stalls past its TTL
    fresh = build(make_settings, redis, ttl=5000)  # holder B, which takes over
    await slow.ingest(message(1))
    a = await acquire_when_ready(slow, CONV, "token-a")
    b = await acquire_when_ready(fresh, CONV, "token-b")
    assert b.lease.fence == a.lease.fence + 1
    held = await hash_of(redis, k.lease)
    assert held == {"token": "token-b", "fence": str(b.lease.fence), "ttl": "5000"}
    before = await snapshot(redis, CONV)

    # A wakes up and carries on with its old token and fence; every step is refused.
    assert not await slow.renew(a.lease)
    assert await slow.presend(a.lease, a.version, "from A") == PreSend("lost")
    assert await slow.commit(a.lease) == Ended(False, None)
    assert await slow.release(a.lease) == Ended(False, None)
    # The fence alone is checked too: B's token with A's fence is not B's lease.
    impostor = Lease(CONV, "token-b", a.lease.fence)
    assert not await slow.renew(impostor)
    assert await slow.presend(impostor, a.version, "from A") == PreSend("lost")
    assert await slow.commit(impostor) == Ended(False, None)

    assert await snapshot(redis, CONV) == before
    assert await hash_of(redis, k.lease) == held
    assert await redis.pttl(k.lease) > 0
    assert not await redis.exists(k.outbox)

    # B's lease is intact and finishes the work.
    assert await fresh.presend(b.lease, b.version, "from B") == PreSend("ok")
    assert (await fresh.commit(b.lease)).ok
    assert await fresh.counters(CONV) == (1, 1)
    assert [h.text for h in await fresh.history(CONV)] == ["text 1", "from B"]


# -- the pre-send check --------------------------------------------------------------------------


async def test_presend_ok_writes_the_outbox(redis: Redis, make_settings: SettingsFactory) -> None:
    store = build(make_settings, redis)
    k = Keys(CONV)
    await store.ingest(message(1))
    await store.ingest(message(2))
    grant = await acquire_when_ready(store, CONV, "owner")
    verdict = await store.presend(
        grant.lease,
        grant.version,
        "the reply",
        changes="[change]",
        tools='now() -> "12:00"',
        turn=grant.watermark + 1,
    )
    assert verdict == PreSend("ok", forced=False)
    assert await hash_of(redis, k.outbox) == {
        "text": "the reply",
        "version": "2",
        "fence": str(grant.lease.fence),
        "reset": "0",  # no /reset among the covered messages
        "token": grant.lease.token,  # with the fence, in the reply parts' idempotency keys
        "replaces": "0",  # not a /retry
        # No /retry message left out; all of the text is the model's (9 bytes).
        "unsaid": '{"message": 0, "said": 9}',
        "changes": "[change]",  # the admin changes it announces, for a resend to apply
        "tools": 'now() -> "12:00"',  # the tool calls it made, for the history
        "turn": str(grant.watermark + 1),  # its turn, which the history keeps for a /retry
    }
    # Nothing is answered until the commit, and the lease is still ours.
    assert await store.counters(CONV) == (2, 0)
    assert await hash_of(redis, k.lease) == {
        "token": "owner",
        "fence": str(grant.lease.fence),
        "ttl": "1500",
    }


async def test_presend_rejects_a_changed_version(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, quiet=300, max_wait=1000)
    k = Keys(CONV)
    await store.ingest(message(1))
    grant = await acquire_when_ready(store, CONV, "owner")
    await store.ingest(message(2))  # arrives during generation: opens a new window
    window = await hash_of(redis, k.window)
    deadline = int(window["deadline"])

    before = await server_ms(redis)
    verdict = await store.presend(grant.lease, grant.version, "stale reply")
    after = await server_ms(redis)
    assert verdict.status == "stale"
    assert not verdict.forced
    assert await store.counters(CONV) == (2, 0)  # W unchanged
    assert not await redis.exists(k.lease)  # released
    assert not await redis.exists(k.outbox)  # the reply is dropped
    assert await hash_of(redis, k.window) == window  # the new window is left alone
    assert sorted(await hash_of(redis, k.pending)) == ["1", "2"]
    assert await int_field(redis, k.state, "discards") == 1
    # Rescheduled at the new message's deadline (or now, had it already passed).
    score = await due_score(redis, CONV)
    assert score is not None and deadline <= score <= max(deadline, after)
    assert verdict.look_in_ms is not None
    assert score - after <= verdict.look_in_ms <= score - before

    # The next cycle covers both messages.
    again = await acquire_when_ready(store, CONV, "next")
    assert [m.text for m in again.unanswered] == ["text 1", "text 2"]


async def test_presend_rejects_a_lost_lease(redis: Redis, make_settings: SettingsFactory) -> None:
    store = build(make_settings, redis, ttl=300)
    k = Keys(CONV)
    await store.ingest(message(1))
    expired = await acquire_when_ready(store, CONV, "expired")

    async def gone() -> bool:
        return not await redis.exists(k.lease)

    await eventually(gone)
    before = await snapshot(redis, CONV)
    assert await store.presend(expired.lease, expired.version, "late") == PreSend("lost")
    assert await snapshot(redis, CONV) == before

    released = await acquire_when_ready(store, CONV, "released")
    assert (await store.release(released.lease)).ok
    assert await store.presend(released.lease, released.version, "late") == PreSend("lost")
    assert not await redis.exists(k.outbox)
    assert await store.counters(CONV) == (1, 0)


@pytest.mark.parametrize("limit", [0, 1, 3])
async def test_starvation_guard_forces_a_reply_after_limit_discards(
    redis: Redis, make_settings: SettingsFactory, limit: int
) -> None:
    store = build(make_settings, redis, starvation_limit=limit)
    k = Keys(CONV)
    n = 1
    await store.ingest(message(n))
    verdicts = []
    for _ in range(limit + 1):
        grant = await acquire_when_ready(store, CONV, f"holder-{n}")
        n += 1
        await store.ingest(message(n))  # the user keeps typing during every generation
        verdicts.append(await store.presend(grant.lease, grant.version, f"reply to {n - 1}"))
    assert [v.status for v in verdicts] == ["stale"] * limit + ["ok"]
    assert [v.forced for v in verdicts] == [False] * limit + [True]
    assert await int_field(redis, k.state, "discards") == limit + 1
    assert await int_field(redis, k.outbox, "version") == n - 1

    # The forced reply commits what it covered; the newest message stays owed.
    ended = await store.commit(grant.lease)
    assert ended.ok and ended.look_in_ms is not None
    assert await store.counters(CONV) == (n, n - 1)
    assert await int_field(redis, k.state, "discards") == 0

    # The count starts over after a commit.
    grant = await acquire_when_ready(store, CONV, "after-commit")
    await store.ingest(message(n + 1))
    verdict = await store.presend(grant.lease, grant.version, "again")
    assert verdict.status == ("stale" if limit else "ok")
    assert verdict.forced == (limit == 0)


async def test_starvation_guard_forces_a_reply_once_the_oldest_message_waited_its_age(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, starvation_limit=100, starvation_age_ms=5_000)
    k = Keys(CONV)
    await store.ingest(message(1))
    first = await int_field(redis, k.state, "since")
    await store.ingest(message(2))
    assert await int_field(redis, k.state, "since") == first  # the oldest one's arrival
    grant = await acquire_when_ready(store, CONV, "young")
    assert 0 <= grant.waited_ms < 5_000
    await store.ingest(message(3))
    # Younger than the age: a stale reply is discarded, however many came before.
    assert (await store.presend(grant.lease, grant.version, "too soon")).status == "stale"

    # The oldest unanswered message has now waited 6 s (its arrival moved back, as time
    # passing would move the server's clock forward).
    await redis.hset(k.state, "since", first - 6_000)
    grant = await acquire_when_ready(store, CONV, "old")
    assert grant.waited_ms >= 6_000
    await store.ingest(message(4))  # arrives after the lease was taken: opens a new window
    opened = await int_field(redis, k.window, "opened")
    verdict = await store.presend(grant.lease, grant.version, "as it is")
    assert verdict == PreSend("ok", forced=True)
    assert (await store.commit(grant.lease)).ok

    # What is still owed (message 4) waits from its own arrival; nothing owed, no clock.
    assert await store.counters(CONV) == (4, 3)
    assert await int_field(redis, k.state, "since") == opened
    await cycle_once(store, CONV, "the last one")
    assert await redis.hget(k.state, "since") is None


# -- the commit ----------------------------------------------------------------------------------


async def test_commit_moves_everything_in_one_step(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, quiet=2000, max_wait=4000)
    quick = build(make_settings, redis)
    k = Keys(CONV)
    for n in (1, 2, 3):
        await quick.ingest(message(n))
    grant = await acquire_when_ready(quick, CONV, "owner")
    assert await quick.presend(grant.lease, grant.version, "reply to three") == PreSend("ok")
    # A message after the pre-send check, with a long window: the commit must leave it be.
    await store.ingest(message(4))
    window = await hash_of(redis, k.window)
    deadline = int(window["deadline"])

    before = await server_ms(redis)
    ended = await store.commit(grant.lease)
    after = await server_ms(redis)
    assert ended.ok and ended.look_in_ms is not None
    assert deadline - after <= ended.look_in_ms <= deadline - before
    assert await store.counters(CONV) == (4, 3)
    assert [(h.role, h.version, h.text) for h in await store.history(CONV)] == [
        ("user", 1, "text 1"),
        ("user", 2, "text 2"),
        ("user", 3, "text 3"),
        ("assistant", 3, "reply to three"),
    ]
    assert sorted(await hash_of(redis, k.pending)) == ["4"]
    assert not await redis.exists(k.outbox)
    assert not await redis.exists(k.lease)
    assert await hash_of(redis, k.window) == window
    assert await due_score(redis, CONV) == deadline
    assert await int_field(redis, k.state, "discards") == 0

    # A history entry keeps the whole normalized message, not just its text.
    oldest = await redis.lindex(k.history, 0)
    assert oldest is not None
    raw = json.loads(oldest)
    assert raw["message"]["message_id"] == "m1"


async def test_commit_caps_the_history(redis: Redis, make_settings: SettingsFactory) -> None:
    store = build(make_settings, redis, history_cap=4)
    for n in (1, 2, 3):
        await store.ingest(message(n))
        await cycle_once(store, CONV, f"reply {n}")
    assert await redis.llen(Keys(CONV).history) == 4
    assert [(h.role, h.text) for h in await store.history(CONV)] == [
        ("user", "text 2"),
        ("assistant", "reply 2"),
        ("user", "text 3"),
        ("assistant", "reply 3"),
    ]


async def test_commit_with_a_wrong_token_changes_nothing(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    k = Keys(CONV)
    await store.ingest(message(1))
    await store.ingest(message(2))
    grant = await acquire_when_ready(store, CONV, "owner")
    assert (await store.presend(grant.lease, grant.version, "reply")).status == "ok"
    before = await snapshot(redis, CONV)
    assert all(before[name] is not None for name in (k.lease, k.outbox, k.pending, k.state))

    for wrong in (
        Lease(CONV, "intruder", grant.lease.fence),
        Lease(CONV, "owner", grant.lease.fence + 1),
        Lease("test:other", "owner", grant.lease.fence),
    ):
        assert await store.commit(wrong) == Ended(False, None)
        assert await snapshot(redis, CONV) == before
    assert await redis.pttl(k.lease) > 0

    assert (await store.commit(grant.lease)).ok
    assert await store.counters(CONV) == (2, 2)


async def test_history_keeps_any_text_intact(redis: Redis, make_settings: SettingsFactory) -> None:
    # The commit splices JSON in Lua: quotes, escapes, slashes and non-ASCII must survive.
    store = build(make_settings, redis)
    tricky = 'He said "hi" \\ back/slash\n\ttab — ünïcödé 🎉 {"json": []} \u0000 end'
    photo = Attachment("photo", "file-1")
    await store.ingest(InboundMessage("test", "1", "u1", "m1", tricky))
    await store.ingest(InboundMessage("test", "1", "u1", "m2", "look", attachments=(photo,)))
    await cycle_once(store, CONV, tricky + " (reply)")
    history = await store.history(CONV)
    assert [(h.role, h.text) for h in history] == [
        ("user", tricky),
        ("user", "[photo] look"),
        ("assistant", tricky + " (reply)"),
    ]
    raw = await redis.lrange(Keys(CONV).history, 0, 1)
    first, second = (json.loads(entry)["message"] for entry in raw)
    assert first["attachments"] == []
    assert second["attachments"] == [asdict(photo)]


# -- NOSCRIPT ------------------------------------------------------------------------------------


async def test_every_call_survives_an_empty_script_cache(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)

    async def flushed() -> None:
        # What a restart or a failover to a fresh replica leaves behind.
        await redis.script_flush()

    await flushed()
    assert (await store.ingest(message(1))).accepted
    await flushed()
    assert CONV in await store.due()
    await flushed()
    grant = await store.acquire(CONV, "owner")
    assert grant.status == "acquired"
    await flushed()
    assert await store.renew(grant.lease)
    await flushed()
    assert (await store.presend(grant.lease, grant.version, "reply")).status == "ok"
    await flushed()
    assert (await store.commit(grant.lease)).ok
    await store.ingest(message(2))
    again = await store.acquire(CONV, "second")
    assert isinstance(again, Acquired), again
    await flushed()
    assert (await store.release(again.lease)).ok
    assert await store.counters(CONV) == (2, 1)


# -- outbox recovery -----------------------------------------------------------------------------


async def test_outbox_left_by_a_crashed_holder_is_resent_not_regenerated(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    crashing = build(make_settings, redis, ttl=300)
    survivor = build(make_settings, redis, ttl=5000)
    k = Keys(CONV)
    await crashing.ingest(message(1))
    await crashing.ingest(message(2))
    first = await acquire_when_ready(crashing, CONV, "crashes")
    assert await crashing.presend(first.lease, first.version, "the draft") == PreSend("ok")
    # The holder dies here, between the pre-send check and the commit.

    grant = await acquire_when_ready(survivor, CONV, "survivor")
    assert grant.lease.fence == first.lease.fence + 1
    assert grant.resend is not None and (grant.resend.text, grant.resend.version) == (
        "the draft",
        2,
    )
    assert grant.unanswered == ()  # nothing to generate

    assert (await survivor.commit(grant.lease)).ok
    assert await survivor.counters(CONV) == (2, 2)
    assert [(h.role, h.text) for h in await survivor.history(CONV)] == [
        ("user", "text 1"),
        ("user", "text 2"),
        ("assistant", "the draft"),
    ]
    assert not await redis.exists(k.outbox)
    assert await survivor.acquire(CONV, "after") == NotAcquired("idle")


async def test_resend_covers_only_its_version_when_more_arrived(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    crashing = build(make_settings, redis, ttl=300)
    survivor = build(make_settings, redis, ttl=5000)
    await crashing.ingest(message(1))
    first = await acquire_when_ready(crashing, CONV, "crashes")
    checked = await crashing.presend(first.lease, first.version, "reply to one", changes="[c]")
    assert checked.status == "ok"
    await crashing.ingest(message(2))  # after the check passed: not covered by that reply

    grant = await acquire_when_ready(survivor, CONV, "survivor")
    assert grant.resend is not None
    assert (grant.resend.text, grant.resend.version, grant.resend.changes) == (
        "reply to one",
        1,
        "[c]",
    )
    assert (await survivor.commit(grant.lease)).ok
    assert await survivor.counters(CONV) == (2, 1)

    follow_up = await acquire_when_ready(survivor, CONV, "follow-up")
    assert follow_up.resend is None
    assert [m.text for m in follow_up.unanswered] == ["text 2"]


async def test_an_access_change_reaches_every_shard_and_an_older_one_never_replaces_it(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    before = await server_ms(redis)
    denied = await store.change_access("u1", "access", "deny", by="admin-1")
    allowed = await store.change_access("u1", "access", "allow", by="admin-2")
    # Never below the server's time in ms, always above the last.
    assert before <= denied.seq < allowed.seq
    assert (allowed.access, allowed.by, allowed.budget) == ("allow", "admin-2", None)
    copies = [await redis.hget(access_key(shard), "u1") for shard in range(SHARDS)]
    assert all(copy is not None and json.loads(copy)["access"] == "allow" for copy in copies)

    # The first change's copy, arriving late (its admin's replica was slow): kept out.
    older = json.dumps({"access": "deny", "by": "admin-1", "at": 0, "seq": denied.seq})
    late = ["0", "0", "u1", older, str(denied.seq)]
    assert await redis.eval(ACCESS_COPY, 1, access_key(7), *late) == 0  # copied none
    assert json.loads(await redis.hget(access_key(7), "u1") or "{}")["access"] == "allow"
    # The user is let in, though the settings' allow-list leaves them out; once denied, not
    # even an allow-list that names them lets them in, but an admin is always let in.
    assert (await store.ingest(message(1), "refused")).accepted
    await store.change_access("u1", "access", "deny", by="admin-1")
    assert (await store.ingest(message(2), "allowed")).refused
    assert (await store.ingest(message(3), "admin")).accepted
    # Clearing a budget leaves the access as it was.
    cleared = await store.change_access("u1", "budget", "", by="admin-1")
    assert (cleared.access, cleared.budget) == ("deny", None)
    assert cleared.seq > allowed.seq
    # Every shard holds every change up to the last: no sweep has anything to mend.
    wholes = {await redis.hget(access_key(shard), "~seq") for shard in range(SHARDS)}
    assert wholes == {str(cleared.seq).encode()}


async def test_a_lost_copy_of_an_access_change_is_mended_at_start(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    assert await store.spread_access() == 0
    first = await store.change_access("u1", "access", "deny", by="admin")
    second = await store.change_access("u2", "budget", "500", by="admin")
    # A failover lost one shard's copies, and left another with an older one of u1's.
    await redis.delete(access_key(3))
    older = json.dumps({"access": "allow", "by": "admin", "at": 0, "seq": 0})
    await redis.hset(access_key(5), "u1", older)
    assert await store.spread_access() == 2
    for shard in (3, 5):
        copies = await redis.hgetall(access_key(shard))
        seqs = {k: json.loads(v)["seq"] for k, v in copies.items() if k != b"~seq"}
        assert seqs == {b"u1": first.seq, b"u2": second.seq}
        assert copies[b"~seq"] == str(second.seq).encode()


# -- the transcript cache, the persona, /forget --------------------------------------------------


async def test_each_cached_transcript_is_indexed_until_it_expires(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    day = 86_400_000
    k = Keys(CONV)
    before = await server_ms(redis)
    await store.keep_transcript(CONV, "voice-1", "first words")
    await store.keep_transcript(CONV, "doc:file-2", "+a document")
    after = await server_ms(redis)
    assert sorted(await redis.zrange(k.heard, 0, -1)) == [b"doc:file-2", b"voice-1"]
    for file_key in ("voice-1", "doc:file-2"):
        expires = await redis.zscore(k.heard, file_key)
        assert expires is not None and before + 30 * day <= expires <= after + 30 * day
    assert await redis.get(k.transcript("doc:file-2")) == b"+a document"
    assert 29 * day < await redis.pttl(k.transcript("voice-1")) <= 30 * day

    # An entry whose time has come leaves the index at the next write, as its key left.
    await redis.zadd(k.heard, {"voice-1": before - 1})
    await redis.delete(k.transcript("voice-1"))
    # A shorter retention configured since: the index still outlives the longer entry.
    shorter = build(make_settings, redis, retention_days=1)
    await shorter.keep_transcript(CONV, "voice-3", "later words")
    assert sorted(await redis.zrange(k.heard, 0, -1)) == [b"doc:file-2", b"voice-3"]
    assert await redis.pttl(k.heard) > 29 * day
    assert 0 < await redis.pttl(k.transcript("voice-3")) <= day


async def test_acquire_brings_the_persona_kept_only_on_a_live_conversation(
    store: Store, redis: Redis
) -> None:
    k = Keys(CONV)
    # Nothing to keep it with: no key is made that would never expire.
    await store.keep_persona(CONV, "Be brief.")
    assert not await redis.exists(k.state)
    await store.ingest(message(1))
    await store.keep_persona(CONV, "Be brief.")
    grant = await acquire_when_ready(store, CONV, "one")
    assert grant.persona == "Be brief."
    assert (await store.release(grant.lease)).ok
    await store.keep_persona(CONV, "")
    assert (await acquire_when_ready(store, CONV, "two")).persona == ""
    assert await redis.hget(k.state, "persona") is None


async def test_forget_erases_what_the_index_names_and_keeps_the_counters(
    store: Store, redis: Redis
) -> None:
    k, other = Keys(CONV), Keys("test:2")
    await store.ingest(message(1))
    await store.ingest(message(1, chat="2"))
    await cycle_once(store, CONV, "a reply")
    await store.pick_model(CONV, "smart")
    await store.keep_persona(CONV, "Be brief.")
    await store.add_usage(CONV, "u1", 10, 5)
    files = [f"voice-{n}" for n in range(150)] + ["doc:file-1"]
    for file_key in files:
        await store.keep_transcript(CONV, file_key, "words")
    await store.keep_transcript("test:2", "voice-1", "another's words")
    assert not await store.forget_asked(CONV)
    await store.ask_forget(CONV)
    assert await store.forget_asked(CONV)
    usage = await redis.hgetall(k.usage)

    await store.forget(CONV)
    assert not await redis.exists(k.history, k.heard, *map(k.transcript, files))
    counters = {"v": "1", "w": "1", "fence": "1", "discards": "0", "last": "m1"}
    state = await hash_of(redis, k.state)
    assert int(state.pop("last_at")) > 0  # when the last message came: a counter, kept
    assert state == counters
    assert await redis.hgetall(k.usage) == usage
    assert await redis.zscore(k.seen, "m1") is not None
    assert not await store.forget_asked(CONV)
    # Another conversation's cache is its own.
    assert await store.transcripts("test:2", ["voice-1"]) == ["another's words"]
    assert await redis.zrange(other.heard, 0, -1) == [b"voice-1"]


# -- the scripts' declared keys and arguments -------------------------------------------------

# A header line: `local name = KEYS[i]` or `local name = tonumber(ARGV[i])`, a comment allowed.
HEADER_LINE = re.compile(r"^local (\w+) = (?:tonumber\()?(KEYS|ARGV)\[(\d+)\]\)?(?: --.*)?$")


def header(source: str) -> tuple[dict[str, list[str]], list[str]]:
    """The names a script's header reads KEYS and ARGV into, in order of index, and every
    other line that reads KEYS or ARGV."""
    found: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}}
    elsewhere = []
    for line in source.splitlines():
        matched = HEADER_LINE.match(line)
        if matched:
            name, table, index = matched.groups()
            assert int(index) not in found[table], f"{table}[{index}] read twice"
            found[table][int(index)] = name
        elif re.search(r"\b(KEYS|ARGV)\b", line.split("--", 1)[0]):
            elsewhere.append(line)
    ordered = {table: [names[i] for i in sorted(names)] for table, names in found.items()}
    for table, names in found.items():
        assert sorted(names) == list(range(1, len(names) + 1)), f"{table} indices have a gap"
    return ordered, elsewhere


@pytest.mark.parametrize("name", sorted(scripts.ALL))
def test_each_script_reads_its_keys_and_arguments_as_declared(name: str) -> None:
    declared = scripts.ALL[name]
    source = (Path(scripts.__file__).parent / f"{name}.lua").read_text()
    names, elsewhere = header(source)
    assert names["KEYS"] == list(declared.keys)
    assert names["ARGV"] == list(declared.args)
    # Past the header only the declared rests of KEYS and ARGV are read, and only by a script
    # that has them.
    for table, rest in (("KEYS", declared.rest_keys), ("ARGV", declared.rest)):
        reading = [line for line in elsewhere if re.search(rf"\b{table}\b", line)]
        if rest:
            assert reading, f"{name}.lua declares a rest of {table} it never reads"
        else:
            assert reading == [], reading


def test_the_prelude_reads_no_keys_or_arguments() -> None:
    prelude = (Path(scripts.__file__).parent / "prelude.lua").read_text()
    assert header(prelude) == ({"KEYS": [], "ARGV": []}, [])


def test_a_call_that_misnames_a_key_or_an_argument_is_refused_before_redis() -> None:
    notice = scripts.NOTICE
    assert notice.ordered_keys({"notice": "k"}) == ["k"]
    assert notice.ordered_args({"period_ms": 5}) == [5]
    with pytest.raises(TypeError, match=r"missing \['period_ms'\], unknown \['period'\]"):
        notice.ordered_args({"period": 5})
    with pytest.raises(TypeError, match=r"missing \[\], unknown \['extra'\]"):
        notice.ordered_keys({"notice": "k", "extra": "x"})
    with pytest.raises(TypeError, match="takes no arguments past"):
        notice.ordered_args({"period_ms": 5}, ["more"])
    assert scripts.HEARTBEAT.ordered_args({"ttl_ms": 1, "started_at": ""}, ["pid", "7"]) == [
        1,
        "",
        "pid",
        "7",
    ]

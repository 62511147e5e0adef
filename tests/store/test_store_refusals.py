"""Refusals a retry outlives, and the access changes' copies, against a real server.

A primary with `min-replicas-to-write 1` and no replica refuses every write with NOREPLICAS,
the way a primary that lost its replicas does: a commit refused so is `StoreUnavailable`, and
the cycle retries it until the refusal is lifted, so the reply already delivered is not sent
again. An access change's seq outnumbers every copy in the shards even after `{lw:access}`
and its counter were lost, and a shard's copies lost behind the store's back are mended by the
sweep.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest
from redis._parsers.base import BaseParser
from redis.asyncio import Redis

from bot.store import Keys, Store, StoreUnavailable, classify
from bot.store.keys import ACCESS_KEY, ACCESS_SEQ_KEY, SHARDS, access_key
from tests.support.builders import message
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.scripts import acquire_when_ready, build
from tests.support.waits import eventually, settled

pytestmark = pytest.mark.timeout(60)

CONV = "test:1"


async def refuse_writes(redis: Redis) -> None:
    """From now on every write is refused with NOREPLICAS: one good replica wanted, none."""
    await redis.config_set("min-replicas-to-write", 1)


async def allow_writes(redis: Redis) -> None:
    await redis.config_set("min-replicas-to-write", 0)


@pytest.mark.parametrize(
    "reply",
    [
        "NOREPLICAS Not enough good replicas to write.",
        # Redis 7 and Valkey: a refusal met inside a script keeps its code.
        "NOREPLICAS Not enough good replicas to write. script: 1f0e, on @user_script:12.",
        # Redis 6 and older: the same, inside a script error.
        "ERR Error running script (call to f_1f0e): @user_script:12: @user_script: 12: "
        "-NOREPLICAS Not enough good replicas to write.",
        "ERR Error running script (call to f_1f0e): @user_script:3: MISCONF Errors writing",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
        "to disk. Commands that may modify the data set are disabled, because this instance is "
        "configured to report errors during writes if RDB snapshotting fails "
        "(stop-writes-on-bgsave-error option). Please check the Redis logs for details about "
        "the RDB error.",
        "UNBLOCKED client unblocked via CLIENT UNBLOCK",
    ],
)
def test_a_refusal_a_retry_outlives_is_transient(reply: str) -> None:
    verdict = classify(BaseParser.parse_error(reply))  # type: ignore[no-untyped-call]
    assert verdict is not None, reply
    assert not verdict.reconnect


@pytest.mark.parametrize(
    "reply",
    [
        # A bug in a script, whichever server: never retried for ever.
        "ERR Error running script (call to f_1f0e): @user_script:3: user_script:3: attempt to "
        "compare nil with number",
        "ERR Error running script (call to f_1f0e): @user_script:3: WRONGTYPE Operation against "
        "a key holding the wrong kind of value",
        "NOPERM this user has no permissions to run the 'evalsha' command",
    ],
)
def test_a_bug_or_a_misconfiguration_is_not_transient(reply: str) -> None:
    assert classify(BaseParser.parse_error(reply)) is None  # type: ignore[no-untyped-call]


async def test_a_commit_refused_for_want_of_replicas_is_transient_and_changes_nothing(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis, ttl=10_000)
    await store.ingest(message(n=1, conversation=CONV))
    grant = await acquire_when_ready(store, CONV, "owner")
    assert (await store.presend(grant.lease, grant.version, "the reply")).status == "ok"
    await refuse_writes(redis)
    try:
        # Refused inside the script, at its first write (reads went through).
        with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
            await store.commit(grant.lease)
        assert await store.counters(CONV) == (1, 0)
        assert await redis.exists(Keys(CONV).outbox)
    finally:
        await allow_writes(redis)
    assert (await store.commit(grant.lease)).ok
    assert await store.counters(CONV) == (1, 1)


@dataclass
class HeldOutbound(RecordingOutbound):
    """A platform whose sends wait until the test lets them through."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        self.arrived.set()
        async with asyncio.timeout(10):
            await self.gate.wait()
        await super().send(conversation, text, idempotency_key)


async def test_a_reply_whose_commit_is_refused_for_want_of_replicas_is_sent_once(
    redis: Redis, runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.core.cycle")
    outbound = HeldOutbound()
    # A lease long enough that the refusal is lifted before it would run out: the cycle
    # cannot renew it while writes are refused.
    runtime, _ = await runtime_factory(outbound=outbound, lease={"ttl_ms": 10_000})
    assert await runtime.ingest(message(n=1, conversation=CONV))
    async with asyncio.timeout(10):
        await outbound.arrived.wait()  # past the pre-send check: the outbox holds the reply
    await refuse_writes(redis)
    try:
        outbound.gate.set()
        await outbound.wait_for(1)

        def refused_commits() -> int:
            return sum(
                "commit of" in r.getMessage() and "Redis answered NOREPLICAS" in r.getMessage()
                for r in caplog.records
            )

        async def retried() -> bool:
            return refused_commits() >= 2

        await eventually(retried, within_s=5, what="two refused commit attempts")
        assert await runtime.store.counters(CONV) == (1, 0)
    finally:
        await allow_writes(redis)
    await settled(runtime, CONV, version=1)
    # Committed: W moved and the outbox is gone, so nothing is left to send again.
    assert not await redis.exists(Keys(CONV).outbox)
    assert outbound.texts(CONV) == ["You said: text 1"]


async def test_a_deny_after_the_access_counter_was_lost_is_applied(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    allowed = await store.change_access("u1", "access", "allow", by="admin")
    # A failover at `fast` lost `{lw:access}` with its counter; the shards' copies survive.
    await redis.delete(ACCESS_KEY, ACCESS_SEQ_KEY)
    denied = await store.change_access("u1", "access", "deny", by="admin")
    assert denied.seq > allowed.seq
    copies = [await redis.hget(access_key(shard), "u1") for shard in range(SHARDS)]
    assert [json.loads(c or "{}").get("access") for c in copies] == ["deny"] * SHARDS
    assert (await store.ingest(message(n=1, conversation=CONV), "allowed")).refused


async def shard_copies(redis: Redis, shard: int) -> dict[str, int]:
    """A shard's copies of the access records: user -> seq."""
    found = await redis.hgetall(access_key(shard))
    return {_text(k): json.loads(v)["seq"] for k, v in found.items() if _text(k) != "~seq"}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_the_sweep_mends_shard_copies_lost_behind_the_stores_back(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    store = build(make_settings, redis)
    first = await store.change_access("u1", "access", "deny", by="admin")
    second = await store.change_access("u2", "budget", "500", by="admin")
    wanted = {"u1": first.seq, "u2": second.seq}
    # A nothing-to-do sweep copies nothing: the shards hold every change already.
    await store.due()
    assert await redis.hget(access_key(0), "~seq") == str(second.seq).encode()
    # A failover lost every copy in some shards.
    lost = list(range(0, SHARDS, 4))
    await redis.delete(*(access_key(shard) for shard in lost))

    # Each sweep mends a bounded number of shards; all are whole again after a few.
    sweeps = 0

    async def mended() -> bool:
        nonlocal sweeps
        await store.due()
        sweeps += 1
        return all([await shard_copies(redis, shard) == wanted for shard in lost])

    await eventually(mended, within_s=5, what="the lost copies mended")
    assert sweeps <= len(lost)  # at least one shard mended by every sweep
    assert await sweeps_copy_nothing_more(store, redis)


async def sweeps_copy_nothing_more(store: Store, redis: Redis) -> bool:
    """Whether a sweep over whole shards leaves every copy as it was."""
    before = [await redis.hgetall(access_key(shard)) for shard in range(SHARDS)]
    await store.due()
    return before == [await redis.hgetall(access_key(shard)) for shard in range(SHARDS)]

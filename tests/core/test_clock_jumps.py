"""A Redis clock that jumps, against a real server and a real runtime.

A real server's clock cannot be moved, so each test writes what a jump leaves behind. After a
failover to a node whose clock is behind, every time the store holds (a window's deadline and
opening, a backoff, a lease's expiry, a due score) lies far ahead of the new clock: the
conversation must be served at once, not when that clock catches up. After a jump forward,
the oldest unanswered message looks as if it had waited for hours: the starvation guard must
not take that for a user typing without pause and force out a stale reply.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from bot.llm.echo import EchoLLM
from bot.store import Keys, NotAcquired
from tests.support.builders import message
from tests.support.factories import RuntimeFactory, SettingsFactory
from tests.support.scripts import acquire_when_ready, build
from tests.support.waits import eventually, server_ms, settled

pytestmark = pytest.mark.timeout(60)

CONV = "test:1"
HOUR_MS = 3_600_000
# Sweeps every 200 ms (conftest): a conversation served "at once" is served within this.
PROMPTLY_S = 3.0


async def move_ahead(redis: Redis, conversation: str, ms: int) -> None:
    """Every time `conversation` holds, `ms` further ahead: what a clock that moved back by
    `ms` leaves behind."""
    k = Keys(conversation)
    for name, at in (await redis.hgetall(k.window)).items():
        await redis.hset(k.window, name, int(at) + ms)
    retry_at = await redis.hget(k.state, "retry_at")
    if retry_at is not None:
        await redis.hset(k.state, "retry_at", int(retry_at) + ms)
    since = await redis.hget(k.state, "since")
    if since is not None:
        await redis.hset(k.state, "since", int(since) + ms)
    held = await redis.pttl(k.lease)
    if held > 0:
        await redis.pexpire(k.lease, held + ms)
    score = await redis.zscore(k.due, conversation)
    if score is not None:
        await redis.zadd(k.due, {conversation: score + ms})


@pytest.mark.parametrize("left_behind", ["window", "backoff", "lease"])
async def test_a_conversation_is_served_promptly_after_the_clock_moved_back(
    redis: Redis,
    make_settings: SettingsFactory,
    runtime_factory: RuntimeFactory,
    left_behind: str,
) -> None:
    settings = make_settings(debounce={"quiet_ms": 300, "max_wait_ms": 1000})
    store = build(make_settings, redis, quiet=300, max_wait=1000)
    assert (await store.ingest(message(n=1, conversation=CONV))).accepted
    if left_behind == "backoff":
        # An attempt failed just before the failover: its backoff is an hour away now.
        grant = await acquire_when_ready(store, CONV, "failed")
        await store.release(grant.lease, failed="failure")
    elif left_behind == "lease":
        # A holder died just before the failover: its lease now expires in an hour.
        grant = await acquire_when_ready(store, CONV, "died")
    await move_ahead(redis, CONV, HOUR_MS)

    # No replica armed a timer for it: only the sweep can find it.
    runtime, outbound = await runtime_factory(settings)
    await outbound.wait_for(1, timeout=PROMPTLY_S)
    await settled(runtime, CONV, version=1)
    assert outbound.texts(CONV) == ["You said: text 1"]


async def test_a_window_opened_in_the_future_is_capped_from_now(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """A message into a window that a clock behind left opened an hour ahead: its hard cap
    counts from now, not from an hour ahead."""
    store = build(make_settings, redis, quiet=300, max_wait=1000)
    k = Keys(CONV)
    await store.ingest(message(n=1, conversation=CONV))
    await move_ahead(redis, CONV, HOUR_MS)
    before = await server_ms(redis)
    ingested = await store.ingest(message(n=2, conversation=CONV))
    after = await server_ms(redis)
    opened = int(await redis.hget(k.window, "opened") or 0)
    deadline = int(await redis.hget(k.window, "deadline") or 0)
    assert before <= opened <= after
    assert deadline <= opened + 1000
    assert ingested.look_in_ms is not None and ingested.look_in_ms <= 1000


async def test_a_stale_reply_is_not_forced_out_by_a_clock_that_moved_forward(
    redis: Redis, runtime_factory: RuntimeFactory
) -> None:
    """The oldest unanswered message seems to have waited an hour, far past the starvation
    age: the guard must not believe it. The newer message interrupts the generation as it
    would without the jump, and one reply covers both."""
    runtime, outbound = await runtime_factory(
        model=EchoLLM(delay_ms=1500),
        starvation_age_ms=2000,
        starvation_limit=100,
        lease={"ttl_ms": 3000},
    )
    k = Keys(CONV)
    assert await runtime.ingest(message(n=1, conversation=CONV))
    await redis.hset(k.state, "since", await server_ms(redis) - HOUR_MS)

    async def generating() -> bool:
        return bool(await redis.exists(k.lease))

    await eventually(generating, what="the first generation to start")
    assert await runtime.ingest(message(n=2, conversation=CONV))
    await settled(runtime, CONV, version=2, within_s=15)
    assert outbound.texts(CONV) == ["You said: text 1 / text 2"]


async def test_the_starvation_guard_restarts_its_clock_past_the_age_it_trusts(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """At the pre-send check: an age beyond the starvation age, a window and a lease TTL is
    the clock's doing, and so is one in the future; either way the guard's clock starts
    again from now, and it still forces a reply once a real age passes."""
    store = build(
        make_settings, redis, quiet=0, ttl=1000, starvation_age_ms=400, starvation_limit=100
    )
    k = Keys(CONV)
    trusted = store.settings.trusted_age_ms
    assert trusted == 400 + 0 + 1000  # the age, max_wait, the lease TTL

    async def stale_presend(since_offset_ms: int | None, worked_ms: int = 0) -> str:
        """A reply made stale by a newer message, with `since` moved by the offset, from a
        cycle that worked `worked_ms` since its acquire."""
        n = int(await redis.hget(k.state, "v") or 0) + 1
        await store.ingest(message(n=n, conversation=CONV))
        grant = await acquire_when_ready(store, CONV, f"holder-{n}")
        if since_offset_ms is not None:
            await redis.hset(k.state, "since", await server_ms(redis) + since_offset_ms)
        await store.ingest(message(n=n + 1, conversation=CONV))
        verdict = await store.presend(grant.lease, grant.version, "stale", worked_ms=worked_ms)
        assert verdict.status == "stale" or verdict.forced
        return "forced" if verdict.forced else verdict.status

    # Far past (a clock that moved forward), and in the future (one that moved back).
    for offset in (-HOUR_MS, -(trusted + 100), HOUR_MS):
        before = await server_ms(redis)
        assert await stale_presend(offset) == "stale", offset
        assert int(await redis.hget(k.state, "since") or 0) >= before  # restarted from now
    # Within the bound the age is believed, and the reply goes out as it is.
    assert await stale_presend(-450) == "forced"
    # A slow generation, which the guard let run at the acquire: the time this cycle worked
    # is added to the bound, so its age is believed and the reply is not thrown away.
    assert await stale_presend(-(trusted + 2000), worked_ms=3000) == "forced"


async def test_a_grant_reports_no_wait_it_does_not_trust(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """The cycle decides from the grant's wait whether to interrupt a generation: an age
    past the bound would make it let a stale reply run to the end."""
    store = build(make_settings, redis, ttl=1000, starvation_age_ms=400)
    k = Keys(CONV)
    await store.ingest(message(n=1, conversation=CONV))
    await redis.hset(k.state, "since", await server_ms(redis) - HOUR_MS)
    before = await server_ms(redis)
    grant = await acquire_when_ready(store, CONV, "holder")
    assert grant.waited_ms == 0
    assert int(await redis.hget(k.state, "since") or 0) >= before  # restarted from now


async def test_a_lease_granted_for_longer_than_the_horizon_is_not_taken_for_a_jump(
    redis: Redis, make_settings: SettingsFactory
) -> None:
    """A replica configured with a longer lease than this one's horizon (a rolling change of
    LASTWORD_LEASE__TTL_MS) holds its lease: the lease's own TTL bounds it, not ours."""
    long = build(make_settings, redis, ttl=120_000)
    assert (await long.ingest(message(n=1, conversation=CONV))).accepted
    await acquire_when_ready(long, CONV, "long-ttl")
    short = build(make_settings, redis, ttl=1500)
    grant = await short.acquire(CONV, "short-ttl")
    assert isinstance(grant, NotAcquired) and grant.status == "busy"
    # The same lease an hour further ahead than it was granted for is a clock's jump.
    await move_ahead(redis, CONV, HOUR_MS)
    assert (await short.acquire(CONV, "short-ttl")).status == "acquired"

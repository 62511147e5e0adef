"""The turn's record of tool calls, step by step on a real server: what makes a tool with side
effects run at most once per call the model asked for.

A step's calls are recorded before any runs; a call is begun (marked started) before it runs
and ended with its result. A later lease of the same burst finds a finished call's result, and
a call with side effects found started but never finished is 'unknown' for good, never run
again; one without side effects runs again. Every write is checked against the lease, and a
call with side effects waits while a speculative lease's window is open. The processes' side
(replicas, kill -9, an interrupt storm, real MCP servers) is in test_tools_e2e.py.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from bot.store import Acquired, Keys, Lease, Store
from bot.tools import ToolCall
from tests.support.builders import message, window_ms
from tests.support.speculation import StoreFactory

pytestmark = pytest.mark.timeout(30)

CONV = "test:1"
QUIET_MS = 300
# The flow's timings of test_speculation's stores, with a shorter window and no speculation.
FLOW = {"quiet_ms": QUIET_MS, "speculate_ms": 0}
CALLS = (ToolCall("call_a", "append", '{"line": "x"}'), ToolCall("call_b", "now", "{}"))


async def granted(store: Store, token: str) -> Acquired:
    """The lease, once the window lets it be taken."""
    async with asyncio.timeout(5):
        while True:
            grant = await store.acquire(CONV, token)
            if isinstance(grant, Acquired):
                return grant
            assert grant.look_in_ms is not None, grant
            await asyncio.sleep(grant.look_in_ms / 1000)


async def first_holder(store: Store, text: str) -> tuple[Lease, int]:
    """A message taken in and its burst leased by "replica-a": the lease and the burst."""
    await store.ingest(message(text, n=1))
    grant = await granted(store, "replica-a")
    return grant.lease, grant.watermark + 1


async def speculative_step(store: Store) -> tuple[Lease, int]:
    """A message taken in, its burst leased while its window is still open (a speculative
    generation), and the calls recorded as its step: the lease and the burst."""
    await store.ingest(message("book it", n=1))
    grant = await granted(store, "replica-a")
    assert window_ms(grant) > 0, "not speculative"
    burst = grant.watermark + 1
    assert await store.record_step(grant.lease, burst, 0, CALLS, grant.version)
    return grant.lease, burst


async def taken_over(store: Store, lease: Lease, token: str) -> Acquired:
    """Another holder's lease of the same burst, as after a crash: the first lease released
    (the TTL would do the same, later)."""
    await store.release(lease)
    return await granted(store, token)


async def test_a_finished_call_is_reused_and_a_started_one_with_side_effects_is_unknown(
    stores: StoreFactory,
) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "do it")
    assert await store.record_step(first, burst, 0, CALLS, 1)
    # Call 0 (side effects) starts and dies with its runner; call 1 (none) finishes.
    assert (
        await store.begin_call(first, burst, 0, 0, side_effects=True, version=1)
    ).status == "run"
    assert (
        await store.begin_call(first, burst, 0, 1, side_effects=False, version=1)
    ).status == "run"
    assert await store.end_call(first, burst, 0, 1, "12:00", error=False)

    second = await taken_over(store, first, "replica-b")
    assert second.watermark + 1 == burst
    record = await store.tool_record(CONV, burst)
    assert record.steps == (CALLS,)
    assert record.calls[0, 0].status == "started"
    assert record.calls[0, 1].status == "done" and record.calls[0, 1].text == "12:00"
    # Never run again blindly: unknown, and unknown for every later holder too.
    assert (
        await store.begin_call(second.lease, burst, 0, 0, side_effects=True, version=1)
    ).status == ("unknown")
    done = await store.begin_call(second.lease, burst, 0, 1, side_effects=False, version=1)
    assert (done.status, done.text, done.error) == ("done", "12:00", False)
    # The first runner's late result does not overwrite what the model was told.
    assert not await store.end_call(first, burst, 0, 0, "appended", error=False)
    third = await taken_over(store, second.lease, "replica-c")
    assert (
        await store.begin_call(third.lease, burst, 0, 0, side_effects=True, version=1)
    ).status == ("unknown")


async def test_a_started_call_without_side_effects_runs_again(stores: StoreFactory) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "what time is it")
    assert await store.record_step(first, burst, 0, CALLS[1:], 1)
    assert (
        await store.begin_call(first, burst, 0, 0, side_effects=False, version=1)
    ).status == "run"
    second = await taken_over(store, first, "replica-b")
    assert (
        await store.begin_call(second.lease, burst, 0, 0, side_effects=False, version=1)
    ).status == "run"
    assert await store.end_call(second.lease, burst, 0, 0, "12:01", error=False)
    # The first runner's result is no longer the record's: the second one's start replaced it.
    assert not await store.end_call(first, burst, 0, 0, "12:00", error=False)
    assert (await store.tool_record(CONV, burst)).calls[0, 0].text == "12:01"


async def test_a_holder_that_lost_its_lease_records_and_starts_nothing(
    stores: StoreFactory,
) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "do it")
    second = await taken_over(store, first, "replica-b")
    assert not await store.record_step(first, burst, 0, CALLS, 1)
    assert await store.record_step(second.lease, burst, 0, CALLS, 1)
    assert (
        await store.begin_call(first, burst, 0, 0, side_effects=True, version=1)
    ).status == "lost"
    assert (await store.tool_record(CONV, burst)).calls == {}


async def test_the_record_keeps_the_newest_turns_and_a_reset_closes_older_ones(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(**FLOW)
    await store.ingest(message("first", n=1))
    grant = await granted(store, "replica-a")
    assert await store.record_step(grant.lease, 1, 0, CALLS, 1)
    assert await store.presend(grant.lease, grant.version, "done", tools="[]", turn=1)
    assert (await store.commit(grant.lease)).ok
    # The reply's calls and its turn went into the history with it.
    history = await store.history(CONV)
    assert [(h.role, h.text, h.tools, h.turn) for h in history] == [
        ("user", "first", "", 0),
        ("assistant", "done", "[]", 1),
    ]
    # A burst that begins with /reset: while it generates, the last reply's turn is still
    # there for a /retry; once it is answered, only its own turn is left.
    await store.ingest(message("/reset", n=2))
    grant = await granted(store, "replica-a")
    assert grant.watermark + 1 == 2
    assert await store.record_step(grant.lease, 2, 0, CALLS[1:], 2)
    assert (await store.tool_record(CONV, 1)).steps == (CALLS,)
    assert await store.presend(grant.lease, grant.version, "reset", reset=2, turn=2)
    assert (await store.commit(grant.lease)).ok
    assert (await store.tool_record(CONV, 1)).steps == ()
    assert (await store.tool_record(CONV, 2)).steps == (CALLS[1:],)
    # Bounded: the newest four turns are kept, and the last sent reply's (a /retry's) too.
    await store.ingest(message("third", n=3))
    grant = await granted(store, "replica-a")
    for turn in range(3, 7):
        assert await store.record_step(grant.lease, turn, 0, CALLS, 3)
    assert (await store.tool_record(CONV, 3)).steps == ()
    assert (await store.tool_record(CONV, 2)).steps == (CALLS[1:],)
    for turn in range(4, 7):
        assert (await store.tool_record(CONV, turn)).steps == (CALLS,)
    # Bounded in time like the rest of the conversation, and erased by /forget.
    assert 0 < await redis.pttl(Keys(CONV).tools) <= store.settings.retention_ms
    await store.forget(CONV)
    assert not await redis.exists(Keys(CONV).tools)


async def test_a_call_with_side_effects_waits_for_a_speculative_window(
    stores: StoreFactory,
) -> None:
    store = stores(quiet_ms=800, speculate_ms=100)
    lease, burst = await speculative_step(store)
    held = await store.begin_call(lease, burst, 0, 0, side_effects=True, version=1)
    assert held.status == "hold" and 0 < held.wait_ms <= 800
    # Without side effects it runs at once, the window open or not.
    assert (
        await store.begin_call(lease, burst, 0, 1, side_effects=False, version=1)
    ).status == "run"
    await asyncio.sleep(held.wait_ms / 1000 + 0.05)
    assert (
        await store.begin_call(lease, burst, 0, 0, side_effects=True, version=1)
    ).status == "run"


async def test_no_call_starts_once_the_user_has_written_since_its_step(
    stores: StoreFactory,
) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "email bob")
    assert await store.record_step(first, burst, 0, CALLS, 1)
    # The look-up finishes before the user writes again; the side effect is still queued.
    assert (await store.begin_call(first, burst, 0, 1, side_effects=False, version=1)).status == (
        "run"
    )
    assert await store.end_call(first, burst, 0, 1, "12:00", error=False)
    await store.ingest(message("wait, DON'T send it", n=2))
    # The generation that asked is stale: the call does not start, whatever its flags.
    moved = await store.begin_call(first, burst, 0, 0, side_effects=True, version=1)
    assert moved.status == "moved"
    # The next generation reads the newer message: the old step's queued call never starts,
    # the finished one is reused, and only a call the model asks for now may run.
    second = await taken_over(store, first, "replica-b")
    assert second.version == 2
    dropped = await store.begin_call(second.lease, burst, 0, 0, side_effects=True, version=2)
    assert dropped.status == "dropped"
    reused = await store.begin_call(second.lease, burst, 0, 1, side_effects=False, version=2)
    assert (reused.status, reused.text) == ("done", "12:00")
    assert await store.record_step(second.lease, burst, 1, CALLS[1:], 2)
    fresh = await store.begin_call(second.lease, burst, 1, 0, side_effects=False, version=2)
    assert fresh.status == "run"
    assert (await store.tool_record(CONV, burst)).calls.get((0, 0)) is None, "it was started"


async def test_a_window_pushed_far_ahead_by_the_clock_holds_no_call(
    stores: StoreFactory, redis: Redis
) -> None:
    store = stores(quiet_ms=800, speculate_ms=100)
    lease, burst = await speculative_step(store)
    # A clock that moved back left a deadline an hour ahead: no window is that long.
    seconds, micros = await redis.time()
    await redis.hset(Keys(CONV).window, "deadline", seconds * 1000 + micros // 1000 + 3_600_000)
    begun = await store.begin_call(lease, burst, 0, 0, side_effects=True, version=1)
    assert begun.status == "run", begun


async def test_a_record_is_born_with_an_id_of_its_own_that_its_steps_keep(
    stores: StoreFactory,
) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "do it")
    born = await store.record_step(first, burst, 0, CALLS, 1)
    assert born and await store.record_step(first, burst, 1, CALLS, 1) == born
    assert (await store.tool_record(CONV, burst)).id == born
    # Another turn's record is another record, with another id.
    other = await store.record_step(first, burst + 1, 0, CALLS, 1)
    assert other and other != born


async def test_a_timed_out_call_with_side_effects_stays_unknown(stores: StoreFactory) -> None:
    store = stores(**FLOW)
    first, burst = await first_holder(store, "do it")
    assert await store.record_step(first, burst, 0, CALLS, 1)
    assert (await store.begin_call(first, burst, 0, 0, side_effects=True, version=1)).status == (
        "run"
    )
    assert await store.end_call(first, burst, 0, 0, "timed out", error=True, unknown=True)
    assert (await store.tool_record(CONV, burst)).calls[0, 0].status == "unknown"
    again = await store.begin_call(first, burst, 0, 0, side_effects=True, version=1)
    assert again.status == "unknown"

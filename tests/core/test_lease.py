"""The lease keeper (`bot.core.lease`), against a real server: it keeps a lease past its TTL, stops
the work it guards once the lease is lost (taken over, or not confirmed in time, however the
renewal fails), tells a deliberate hand-back from a loss, and confirms the lease before a side
effect when it may be stale."""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis

from bot.cancel import cancel_and_wait
from bot.core.lease import LeaseKeeper, LeaseLost
from bot.service.app import make_store
from bot.store import Acquired, Lease, Store, lease_token
from bot.store.embedded import EmbeddedRedis
from tests.support.builders import message
from tests.support.factories import SettingsFactory
from tests.support.roles import Work
from tests.support.waits import eventually

TTL_MS = 600
TTL_S = TTL_MS / 1000
# How late past its due time the keeper may act on a loaded machine.
SLACK_S = 0.5


@dataclass
class Held:
    """A lease we hold, with what renews it and what another holder would do to take it."""

    name: str
    renew: Callable[[], Awaitable[bool]]
    take_over: Callable[[], Awaitable[bool]]
    confirmed_at: float


@dataclass
class Renewals:
    """Wraps a renewal: counts calls and answers, and lets a test hold a call in flight or
    make it raise. Only what the test sets up changes how the real renewal runs."""

    renew: Callable[[], Awaitable[bool]]
    calls: int = 0
    answers: list[bool] = field(default_factory=list)
    failures: int = 0
    raise_first: Exception | None = None
    hold: asyncio.Event | None = None
    in_flight: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self) -> bool:
        self.calls += 1
        self.in_flight.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.raise_first is not None:
            error, self.raise_first = self.raise_first, None
            raise error
        renewed = await self.renew()
        self.answers.append(renewed)
        return renewed

    def failed(self) -> None:
        self.failures += 1

    def keeper(self, held: Held) -> LeaseKeeper:
        return LeaseKeeper(held.name, self, TTL_MS, held.confirmed_at, on_failure=self.failed)


def kept(
    held: Held, *, raise_first: Exception | None = None, hold: asyncio.Event | None = None
) -> tuple[Renewals, LeaseKeeper]:
    """A keeper of `held`, and the `Renewals` it renews through (see there for the options)."""
    renewals = Renewals(held.renew, raise_first=raise_first, hold=hold)
    return renewals, renewals.keeper(held)


@pytest.fixture
async def store(redis: Redis, make_settings: SettingsFactory) -> Store:
    """The store, with conversation leases as short as the roles here."""
    return make_store(make_settings(lease={"ttl_ms": TTL_MS}), redis)


async def hold_role(store: Store) -> Held:
    sent_at = time.monotonic()
    fence = await store.claim_role("r", "us", TTL_MS)
    assert fence is not None

    async def take_over() -> bool:
        return await store.claim_role("r", "thief", TTL_MS) is not None

    renew = functools.partial(store.renew_role, "r", "us", fence, TTL_MS)
    return Held("role r", renew, take_over, sent_at)


async def hold_conversation(store: Store) -> Held:
    await store.ingest(message(n=1))

    async def acquired() -> tuple[float, Lease] | None:
        sent_at = time.monotonic()
        grant = await store.acquire("test:1", lease_token("us"))
        return (sent_at, grant.lease) if isinstance(grant, Acquired) else None

    taken = await eventually(acquired, what="the conversation's lease")
    assert taken is not None
    sent_at, ours = taken

    async def take_over() -> bool:
        return isinstance(await store.acquire("test:1", lease_token("thief")), Acquired)

    return Held("lease on test:1", functools.partial(store.renew, ours), take_over, sent_at)


@pytest.fixture
async def role(store: Store) -> Held:
    return await hold_role(store)


@pytest.fixture(params=[hold_role, hold_conversation], ids=["role", "conversation"])
async def lease(request: pytest.FixtureRequest, store: Store) -> Held:
    """A lease of either kind: the keeper must not care which."""
    held: Held = await request.param(store)
    return held


async def test_renewals_keep_the_lease_past_its_ttl(lease: Held) -> None:
    renewals, keeper = kept(lease)

    async def work() -> str:
        # A job three TTLs long: without renewals the lease would expire twice over.
        await asyncio.sleep(3 * TTL_S)
        return "done"

    assert await keeper.run(work()) == "done"
    assert not keeper.lost
    assert renewals.answers and all(renewals.answers)
    assert not await lease.take_over()


async def test_a_lease_taken_over_cancels_the_work(
    role: Held, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    renewals, keeper = kept(role)
    work = Work()
    runner = asyncio.create_task(keeper.run(work()))
    try:
        await eventually(work.is_running)
        # Another holder has it now, as after an expiry this holder did not notice in time.
        assert await store.release_role("r", "us")
        assert await role.take_over()
        taken_at = time.monotonic()
        with pytest.raises(LeaseLost):
            async with asyncio.timeout(TTL_S / 3 + SLACK_S):
                await runner
    finally:
        await cancel_and_wait(runner)
    assert keeper.lost
    assert work.cancels == 1 and not work.running
    assert work.cancelled_at - taken_at < TTL_S / 3 + SLACK_S
    assert renewals.answers[-1] is False
    assert "role r was taken over; stopping" in caplog.text
    # The new holder's lease is left alone.
    assert await store.renew_role("r", "thief", await _fence(store, "thief"), TTL_MS)


async def _fence(store: Store, token: str) -> int:
    fence = await store.claim_role("r", token, TTL_MS)
    assert fence is not None
    return fence


async def test_a_renewal_that_hangs_is_cut_off_by_the_time_left(
    lease: Held, server: EmbeddedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The server frozen (SIGSTOP): the renewal's socket stays open and nothing answers. The
    test's client has no socket timeout, so only the keeper's own bound ends the call."""
    assert server.process is not None
    renewals, keeper = kept(lease)
    work = Work()
    runner = asyncio.create_task(keeper.run(work()))
    try:
        await eventually(lambda: _renewed(renewals), within_s=TTL_S)
        server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(LeaseLost):
                async with asyncio.timeout(TTL_S + SLACK_S):
                    await runner
        finally:
            server.process.send_signal(signal.SIGCONT)
    finally:
        await cancel_and_wait(runner)
    # Stopped once the lease may have expired, and not before.
    held_for = work.cancelled_at - keeper.confirmed_at
    assert TTL_S <= held_for < TTL_S + SLACK_S
    assert renewals.failures >= 1
    assert "no answer in the time left" in caplog.text
    assert f"{lease.name} can no longer be confirmed; stopping" in caplog.text


async def _renewed(renewals: Renewals) -> bool:
    return bool(renewals.answers)


async def test_a_renewal_that_fails_is_retried_until_the_time_left_runs_out(
    role: Held, server: EmbeddedRedis
) -> None:
    renewals, keeper = kept(role)
    work = Work()
    runner = asyncio.create_task(keeper.run(work()))
    try:
        await eventually(lambda: _renewed(renewals), within_s=TTL_S)
        # Refused connections: each renewal fails at once, not by the time left.
        server.stop()
        calls_before = renewals.calls
        with pytest.raises(LeaseLost):
            async with asyncio.timeout(TTL_S + SLACK_S):
                await runner
    finally:
        await cancel_and_wait(runner)
    assert renewals.calls - calls_before >= 2
    assert renewals.failures == renewals.calls - calls_before
    assert work.cancelled_at - keeper.confirmed_at >= TTL_S


async def test_an_unexpected_renewal_error_is_logged_and_retried(
    role: Held, caplog: pytest.LogCaptureFixture
) -> None:
    renewals, keeper = kept(role, raise_first=RuntimeError("a bug in the renewal"))

    async def work() -> str:
        await asyncio.sleep(2 * TTL_S)
        return "done"

    assert await keeper.run(work()) == "done"
    assert renewals.calls >= 2 and renewals.answers and all(renewals.answers)
    assert renewals.failures == 0  # not an outage: not counted as one
    assert "renewing role r failed unexpectedly" in caplog.text
    assert "RuntimeError: a bug in the renewal" in caplog.text
    assert not await role.take_over()


async def test_a_release_is_not_mistaken_for_a_loss(role: Held, store: Store) -> None:
    renewals, keeper = kept(role, hold=asyncio.Event())
    assert renewals.hold is not None

    async def work() -> str:
        # Hand the lease back while a renewal is in flight: it will be refused.
        await renewals.in_flight.wait()
        assert await store.release_role("r", "us")
        keeper.released()
        assert renewals.hold is not None
        renewals.hold.set()
        await eventually(lambda: _renewed(renewals), within_s=TTL_S)
        # Past the next renewal, had the keeper gone on.
        await asyncio.sleep(TTL_S)
        return "done"

    assert await keeper.run(work()) == "done"
    assert not keeper.lost
    assert renewals.answers == [False]
    assert renewals.calls == 1


async def test_ensure_fresh_confirms_only_a_stale_lease_unless_told_always(role: Held) -> None:
    renewals, keeper = kept(role)
    await keeper.ensure_fresh()
    assert renewals.calls == 0
    await keeper.ensure_fresh(always=True)
    assert renewals.answers == [True]

    # Over half the TTL since the last confirmation: a pause or a slow send.
    keeper.confirmed_at = time.monotonic() - 0.6 * TTL_S
    before = time.monotonic()
    await keeper.ensure_fresh()
    assert renewals.answers == [True, True]
    assert keeper.confirmed_at >= before


async def test_ensure_fresh_raises_once_the_lease_is_someone_elses(
    role: Held, store: Store
) -> None:
    renewals, keeper = kept(role)
    assert await store.release_role("r", "us")
    assert await role.take_over()
    # Fresh by the clock, so not confirmed: that is the point of the TTL/2 margin.
    await keeper.ensure_fresh()
    with pytest.raises(LeaseLost):
        await keeper.ensure_fresh(always=True)
    keeper.confirmed_at = time.monotonic() - 0.6 * TTL_S
    with pytest.raises(LeaseLost):
        await keeper.ensure_fresh()
    assert renewals.answers == [False, False]


async def test_ensure_fresh_raises_when_the_store_cannot_confirm(
    role: Held, server: EmbeddedRedis
) -> None:
    renewals, keeper = kept(role)
    server.stop()
    with pytest.raises(LeaseLost):
        await keeper.ensure_fresh(always=True)
    assert renewals.failures == 1


async def test_ensure_fresh_lets_an_unexpected_error_through(role: Held) -> None:
    # A bug is not a lost lease: the caller fails the attempt (and backs it off) instead.
    _, keeper = kept(role, raise_first=RuntimeError("a bug in the renewal"))
    with pytest.raises(RuntimeError, match="a bug"):
        await keeper.ensure_fresh(always=True)


async def test_ensure_fresh_after_a_release_raises_without_asking(role: Held) -> None:
    renewals, keeper = kept(role)
    keeper.released()
    with pytest.raises(LeaseLost):
        await keeper.ensure_fresh(always=True)
    assert renewals.calls == 0


async def test_cancelling_the_run_gives_the_work_its_wind_down(role: Held) -> None:
    _, keeper = kept(role)
    cancels = 0
    wound_down = asyncio.Event()
    started = asyncio.Event()

    async def work() -> None:
        nonlocal cancels
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancels += 1
            # Storing what it has queued, say: longer than one cancel would allow by default.
            await asyncio.sleep(0.6)
            wound_down.set()
            raise

    runner = asyncio.create_task(keeper.run(work(), wind_down_s=2.0))
    await started.wait()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert wound_down.is_set()
    assert cancels == 1
    assert not keeper.lost

"""Roles: one replica at a time runs a shared job (a platform's single poller), handing it over
within the TTL when its holder dies, and at once when it shuts down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.cancel import cancel_and_wait
from bot.config.settings import ConfigError
from bot.core.roles import run_exclusively
from bot.core.runtime import Runtime
from bot.llm.echo import EchoLLM
from bot.service.app import make_store
from bot.store import Store
from bot.store.embedded import EmbeddedRedis
from bot.store.keys import role_key
from tests.support.factories import SettingsFactory
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.roles import Work
from tests.support.waits import eventually

ROOT = Path(__file__).resolve().parents[2]
TTL_MS = 900


@pytest.fixture
async def other_store(
    server: EmbeddedRedis, make_settings: SettingsFactory
) -> AsyncIterator[Store]:
    """A second replica's store: its own connections to the same server."""
    client = Redis.from_url(server.url)
    yield make_store(make_settings(), client)
    await client.aclose()


async def test_a_held_role_is_exclusive_and_renewed_only_by_its_holder(
    store: Store, redis: Redis
) -> None:
    fence = await store.claim_role("r", "a", 1000)
    assert fence is not None
    assert await store.claim_role("r", "b", 1000) is None
    # Claiming again what we hold renews it, with the same fence.
    assert await store.claim_role("r", "a", 1000) == fence
    assert 0 < await redis.pttl(role_key("r")) <= 1000  # expires on the server
    assert await store.renew_role("r", "a", fence, 1000)
    assert not await store.renew_role("r", "a", fence + 1, 1000)
    assert not await store.renew_role("r", "b", fence, 1000)
    assert not await store.release_role("r", "b")
    assert await redis.exists(role_key("r")) == 1
    assert await store.release_role("r", "a")
    assert await redis.exists(role_key("r")) == 0
    taken = await store.claim_role("r", "b", 1000)
    assert taken is not None and taken > fence
    # Roles are independent of each other.
    assert await store.claim_role("other", "a", 1000) is not None


async def test_an_expired_role_is_taken_over_with_a_higher_fence(store: Store) -> None:
    old = await store.claim_role("r", "a", 300)
    assert old is not None
    taken: list[int] = []

    async def take() -> bool:
        fence = await store.claim_role("r", "b", 5000)
        if fence is not None:
            taken.append(fence)
        return fence is not None

    await eventually(take, within_s=2.0)
    assert taken[0] > old
    # The stale holder can neither renew nor release what is no longer its own.
    assert not await store.renew_role("r", "a", old, 5000)
    assert not await store.release_role("r", "a")
    assert await store.claim_role("r", "a", 5000) is None
    assert await store.renew_role("r", "b", taken[0], 5000)


@contextlib.asynccontextmanager
async def working(store: Store, work: Work) -> AsyncIterator[asyncio.Task[None]]:
    """`work` run exclusively as role "r" (TTL_MS, claims polled every 50 ms), once it has
    started; stopped on the way out."""
    runner = asyncio.create_task(run_exclusively(store, "r", work, TTL_MS, poll_s=0.05))
    try:
        await eventually(work.is_running)
        yield runner
    finally:
        await cancel_and_wait(runner)


async def test_work_is_cancelled_when_the_role_is_lost_then_resumes_when_it_is_back(
    store: Store, redis: Redis
) -> None:
    work = Work()
    async with working(store, work) as runner:
        # Another holder takes over (as after an expiry the holder did not notice in time).
        await redis.delete(role_key("r"))
        thief = await store.claim_role("r", "thief", 10_000)
        assert thief is not None

        async def cancelled() -> bool:
            return work.cancels == 1 and not work.running

        await eventually(cancelled, within_s=TTL_MS / 1000 + 1.0)
        assert work.starts == 1
        assert not runner.done()  # back to waiting for the role
        assert await store.release_role("r", "thief")

        async def restarted() -> bool:
            return work.starts == 2 and work.running

        await eventually(restarted, within_s=2.0)
        assert int(await redis.hget(role_key("r"), "fence") or 0) > thief
    assert work.cancels == 2
    assert await redis.exists(role_key("r")) == 0


async def test_work_is_cancelled_when_the_store_is_unreachable_past_the_ttl(
    store: Store, server: EmbeddedRedis
) -> None:
    work = Work()
    async with working(store, work) as runner:
        stopping_at = time.monotonic()
        server.stop()

        async def cancelled() -> bool:
            return work.cancels == 1

        # Another replica may hold the role once the TTL has passed without a renewal...
        await eventually(cancelled, within_s=TTL_MS / 1000 + 1.5)
        # ...but not before: the last renewal was at most TTL/3 before the outage, so the
        # role is surely ours for 2/3 of the TTL after it, and a failed renewal is retried.
        assert work.cancelled_at - stopping_at >= TTL_MS / 3000
        assert not runner.done()  # still trying to claim, for when the store is back


async def test_the_role_is_released_when_the_work_returns(
    store: Store, other_store: Store, redis: Redis
) -> None:
    work = Work()
    work.finish.set()
    async with asyncio.timeout(2):
        await run_exclusively(store, "r", work, 10_000)
    assert work.starts == 1 and work.cancels == 0
    assert await redis.exists(role_key("r")) == 0
    assert await other_store.claim_role("r", "b", 10_000) is not None


async def test_a_config_error_from_the_work_propagates_and_releases_the_role(
    store: Store, redis: Redis
) -> None:
    work = Work()
    work.error = ConfigError("LASTWORD_X: wrong")
    work.finish.set()
    with pytest.raises(ConfigError, match="wrong"):
        async with asyncio.timeout(2):
            await run_exclusively(store, "r", work, 10_000)
    assert await redis.exists(role_key("r")) == 0


async def test_any_other_error_hands_the_role_back_and_restarts_the_work(
    store: Store, other_store: Store, redis: Redis
) -> None:
    # A 429 the adapter did not expect must not end the process: the role goes back (so
    # another replica may try), and the work starts again after a backoff.
    work = Work()
    work.error = ValueError("boom")
    work.finish.set()
    runner = asyncio.create_task(run_exclusively(store, "r", work, 10_000, poll_s=0.05))
    try:
        await eventually(lambda: _at_least(work, 1))
        await eventually(lambda: _released(redis))
        # Free for another replica during the backoff.
        assert await other_store.claim_role("r", "b", 300) is not None
        await eventually(lambda: _at_least(work, 2), within_s=4)
        assert not runner.done()
    finally:
        await cancel_and_wait(runner)


async def _at_least(work: Work, starts: int) -> bool:
    return work.starts >= starts


async def _released(redis: Redis) -> bool:
    return await redis.exists(role_key("r")) == 0


async def test_shutdown_hands_the_role_over_at_once(
    store: Store, other_store: Store, redis: Redis
) -> None:
    # A TTL far longer than the test: only the release can explain the handover.
    first, second = Work(), Work()
    runner_a = asyncio.create_task(run_exclusively(store, "r", first, 10_000, poll_s=0.05))
    await eventually(first.is_running)
    runner_b = asyncio.create_task(run_exclusively(other_store, "r", second, 10_000, poll_s=0.05))
    try:
        # Several of the second replica's claims go by, and it never runs the work meanwhile.
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            assert not second.running
            await asyncio.sleep(0.02)
        assert second.starts == 0

        handover_started = time.monotonic()
        await cancel_and_wait(runner_a)
        assert first.cancels == 1 and not first.running
        await eventually(second.is_running, within_s=2.0)
        assert time.monotonic() - handover_started < 2.0
    finally:
        await cancel_and_wait(runner_a)
        await cancel_and_wait(runner_b)
    assert await redis.exists(role_key("r")) == 0


async def test_runtime_runs_exclusively_with_the_lease_ttl(
    store: Store, make_settings: SettingsFactory, redis: Redis
) -> None:
    settings = make_settings()
    runtime = Runtime(settings, store, EchoLLM(), RecordingOutbound())
    seen_ttl: list[int] = []

    async def work() -> None:
        seen_ttl.append(await redis.pttl(role_key("telegram:poller")))

    async with asyncio.timeout(3):
        await runtime.run_exclusively("telegram:poller", work)
    assert len(seen_ttl) == 1 and 0 < seen_ttl[0] <= settings.lease.ttl_ms
    assert await redis.exists(role_key("telegram:poller")) == 0


async def test_two_processes_one_works_and_a_kill_hands_over_within_the_ttl(
    server: EmbeddedRedis,
) -> None:
    ttl_ms = 1000
    lines: list[tuple[float, int]] = []  # (when, pid) of each "working" line
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.role_worker",
            server.url,
            "poller",
            str(ttl_ms),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    ready: set[int] = set()

    async def read(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            word, pid = line.decode().split()
            if word == "ready":
                ready.add(int(pid))
            else:
                lines.append((time.monotonic(), int(pid)))

    readers = [asyncio.create_task(read(p)) for p in procs]
    try:

        async def both_up() -> bool:
            return len(ready) == 2 and bool(lines)

        await eventually(both_up, within_s=10.0)
        holder = lines[0][1]
        (survivor,) = {p.pid for p in procs} - {holder}
        # Longer than the TTL: the holder keeps the role by renewing, the other never works.
        end = time.monotonic() + 1.5 * ttl_ms / 1000
        while time.monotonic() < end:
            assert {pid for _, pid in lines} == {holder}
            await asyncio.sleep(0.05)

        os.kill(holder, signal.SIGKILL)
        killed_at = time.monotonic()

        async def taken_over() -> bool:
            return any(pid == survivor for _, pid in lines)

        await eventually(taken_over, within_s=ttl_ms / 1000 + 1.5)
        took_at = next(t for t, pid in lines if pid == survivor)
        # Within the TTL plus one claim interval (TTL/3) and some slack for the pipes.
        assert took_at - killed_at < ttl_ms / 1000 + ttl_ms / 3000 + 0.5
        assert all(pid == holder for t, pid in lines if t < killed_at)
    finally:
        for proc in procs:
            if proc.returncode is None:
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in procs:
            try:
                async with asyncio.timeout(5):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for reader in readers:
            await cancel_and_wait(reader)
    # The survivor released the role when it shut down.
    client = Redis.from_url(server.url)
    try:
        assert await client.exists(role_key("poller")) == 0
    finally:
        await client.aclose()

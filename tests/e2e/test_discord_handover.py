"""Discord gateway hand-overs, end to end: `lastword run` processes with the real adapter and
discord.py against the loopback fake Discord, with a real Redis server. A holder stopped with
SIGTERM stores what it has queued before another takes over; one killed with SIGKILL leaves
its session to the next, which RESUMEs it and so gets every DM sent meanwhile, from anyone;
when Discord refuses the RESUME, a new session catches up from the history; and the catch-up
holds every live DM of a new session from the start, so the gap is stored first."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import (
    USER,
    bot_env,
    counters,
    discord_bots,
    first_and_the_rest,
    settled,
    texts,
    the_holder,
)
from tests.support.fakes.discord_server import FakeDiscord
from tests.support.running import Running
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(30)

# Logged by a holder that is told to stop while it has DMs it has not stored.
STORING_FIRST = "handing the Discord gateway over: storing {} queued DMs first"
# Logged once a new session's catch-up is done.
CAUGHT_UP = "catch-up: "


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as discord:
        yield discord


async def start_with_inbox_cap(env: dict[str, str], cap: int) -> Running:
    """`lastword run`, but with the adapter's inbox capped at `cap` DMs instead of 10,000."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"import adapters.discord; adapters.discord.INBOX_CAP = {cap}\n"
        "from bot.service.cli import main\nraise SystemExit(main(['run']))",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return Running(process)


@contextlib.asynccontextmanager
async def lone_holder(
    server: EmbeddedRedis, fake: FakeDiscord, data_dir: Path, inbox_cap: int | None = None
) -> AsyncIterator[Running]:
    """One `lastword run` (its adapter's inbox capped at `inbox_cap` DMs, if given), once its
    first session is open and its catch-up done: until then, the DMs of a new session wait in
    memory for the catch-up. Stopped on the way out."""
    # Heartbeats every 100 ms tell the fake what the holder has received.
    fake.heartbeat_interval_ms = 100
    # A lease that outlives the store's pauses, so the holder keeps its role throughout.
    env = bot_env(server, fake, data_dir, LASTWORD_LEASE__TTL_MS="4000")
    holder = await (
        Running.start(env) if inbox_cap is None else start_with_inbox_cap(env, inbox_cap)
    )
    try:
        await fake.wait_for_sessions(1, timeout=20)

        async def caught_up() -> bool:
            return holder.said(CAUGHT_UP) == 1

        await eventually(caught_up, within_s=5)
        yield holder
    finally:
        await holder.stop()


@contextlib.contextmanager
def store_frozen(server: EmbeddedRedis) -> Iterator[None]:
    """The store stops answering (SIGSTOP) until the block ends."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


async def hello_from_each(fake: FakeDiscord, users: list[int]) -> None:
    """A DM from each user, all of them received by the holder."""
    for user in users:
        await fake.user_sends(user, f"hello from {user}")
    await fake.wait_for(fake.received_all, timeout=5)


def assert_each_answered_once(fake: FakeDiscord, users: list[int], channels: list[int]) -> None:
    for user, channel in zip(users, channels, strict=True):
        assert texts(fake, channel) == [f"You said: hello from {user}"]


async def test_sigterm_stores_the_queued_dms_before_the_gateway_is_handed_over(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    users = [USER + n for n in range(5)]
    channels = [fake.dm_channel(user) for user in users]
    async with lone_holder(server, fake, short_dir) as holder:
        # The store stops answering: what the gateway delivers now stays queued in the holder.
        with store_frozen(server):
            await hello_from_each(fake, users)
            holder.process.send_signal(signal.SIGTERM)

            async def handing_over() -> bool:
                return holder.said(STORING_FIRST.format(len(users))) == 1

            await eventually(handing_over, within_s=5)
        assert await holder.exited(15) == 0
    # Stored before the role was handed over: no replica has run since.
    for channel in channels:
        assert await counters(redis, channel) == (1, 0)

    # It closed without ending its session (not 1000/1001): the next holder resumes it.
    assert fake.close_codes == [4000]

    async with discord_bots(1, server, fake, short_dir):
        for channel in channels:
            await settled(redis, channel, 1)
        assert (fake.identify_count, fake.resume_count) == (1, 1)
    assert_each_answered_once(fake, users, channels)


async def test_a_new_users_dm_sent_while_no_replica_holds_the_gateway_is_answered_once(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    known = fake.dm_channel(USER)
    newcomer = USER + 100
    async with discord_bots(2, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "hi")
        await settled(redis, known, 1)
        holder = await the_holder(bots)
        await holder.kill()
        await fake.wait_for_sessions(0, timeout=5)

        # Someone who never wrote to the bot: no history a catch-up would read.
        await fake.user_sends(newcomer, "first time here")
        await fake.wait_for_sessions(1, timeout=15)
        channel = fake.dm_channel(newcomer)
        await settled(redis, channel, 1)
        # The replica that took over resumed the dead holder's session, at its resume URL.
        assert (fake.identify_count, fake.resume_count) == (1, 1)
        assert fake.gateway_paths[-1] == "/resume"
    assert texts(fake, channel) == ["You said: first time here"]
    assert texts(fake, known) == ["You said: hi"]


async def test_a_refused_resume_starts_a_new_session_and_catches_up(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(2, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        holder = await the_holder(bots)
        await holder.kill()
        await fake.wait_for_sessions(0, timeout=5)
        for text in ("during", "the", "gap"):
            await fake.user_sends(USER, text)
        # Discord has forgotten the session: the RESUME gets op 9, and a new IDENTIFY follows
        # (after discord.py's 5 s pause between IDENTIFYs).
        await fake.invalidate_sessions()
        await fake.wait_for(lambda: fake.identify_count == 2, timeout=20)
        await settled(redis, channel, 4)
        await fake.wait_for_sessions(1, timeout=5)
        await fake.user_sends(USER, "after")
        await settled(redis, channel, 5)
        assert fake.resume_count == 1
    assert first_and_the_rest(fake, channel) == ("You said: before", "during / the / gap / after")


async def test_a_dm_sent_while_discord_py_waits_for_guilds_waits_for_the_catch_up(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir):
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        # Lost by the gateway: only the history has it.
        await fake.user_sends(USER, "gap", dispatch=False)
        await fake.invalidate_sessions()
        # The new session is open: READY is out, and discord.py now waits for guilds that
        # never come before it counts the session as ready. A DM arrives meanwhile.
        await fake.wait_for(
            lambda: fake.identify_count == 2 and fake.connected_sessions() == 1, timeout=20
        )
        await fake.user_sends(USER, "live")
        await settled(redis, channel, 3)
    # Had the live DM been stored first, the catch-up would have read the history after it
    # and never found "gap".
    assert texts(fake, channel) == ["You said: before", "You said: gap / live"]


async def test_a_holder_stopped_during_its_catch_up_leaves_it_to_the_next(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    fake.heartbeat_interval_ms = 100
    channel = fake.dm_channel(USER)
    async with discord_bots(2, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        holder = await the_holder(bots)
        await fake.user_sends(USER, "gap", dispatch=False)
        # A new session whose catch-up is slow to read the history; a live DM of that
        # conversation waits for it in the holder's memory when the holder is stopped.
        fake.hold_history(True)
        reads = fake.history_reads
        await fake.invalidate_sessions()
        await fake.wait_for(lambda: fake.history_reads > reads, timeout=15)
        await fake.user_sends(USER, "live")
        await fake.wait_for(fake.received_all, timeout=5)
        code, _ = await holder.terminate()
        assert code == 0
        fake.hold_history(False)
        # The next holder resumes the session, catch-up owed and all.
        await settled(redis, channel, 3)
        assert (fake.identify_count, fake.resume_count) == (2, 1)
    assert texts(fake, channel) == ["You said: before", "You said: gap / live"]


async def test_dms_dropped_from_a_full_inbox_come_back_by_a_resume(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    users = [USER + n for n in range(6)]
    channels = [fake.dm_channel(user) for user in users]
    async with lone_holder(server, fake, short_dir, inbox_cap=3) as holder:
        # Six DMs while the store is down: more than the inbox holds.
        with store_frozen(server):
            await hello_from_each(fake, users)
        for channel in channels:
            await settled(redis, channel, 1)
    assert holder.said("dropping newer ones from memory") == 1
    # Those dropped were replayed by a RESUME of the same session.
    assert (fake.identify_count, fake.resume_count) == (1, 1)
    assert_each_answered_once(fake, users, channels)

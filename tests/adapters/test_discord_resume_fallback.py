"""A Discord session that cannot be resumed is given up for a fresh login, end to end:
`lastword run` processes with the real adapter and discord.py against the loopback fake
Discord, with a real Redis server. Whether the resume address is dead (a resume host down, the
gateway moved) for the next holder or for the holder's own reconnect, or Discord refuses the
session, the holder logs in afresh after a bounded number of tries, says so in one line (no
traceback per try, the role never handed back), and the catch-up answers what was sent
meanwhile."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from adapters.discord import RESUME_ATTEMPTS
from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import USER, discord_bots, first_and_the_rest, settled, the_holder
from tests.support.fakes.discord_server import CLOSE_SESSION_TIMED_OUT, FakeDiscord
from tests.support.fakes.loopback import free_port
from tests.support.running import Running

pytestmark = pytest.mark.timeout(40)

# The one line a holder logs when it gives the session up.
FALLING_BACK = "logging in afresh"
# What the role keeper logs when a holder's work fails: a failed resume is not that.
ROLE_FAILED = "role discord:gateway failed"


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as discord:
        yield discord


def dead_resume_url() -> str:
    """A resume address nothing answers at (the connection is refused)."""
    return f"ws://127.0.0.1:{free_port()}/resume"


def assert_quiet(bots: list[Running], fell_back: Running) -> None:
    """`fell_back` said it gave the session up, once; nobody logged a traceback or a failed
    role."""
    assert fell_back.said(FALLING_BACK) == 1, "".join(fell_back.log)
    for bot in bots:
        assert bot.said("Traceback") == 0, "".join(bot.log)
        assert bot.said(ROLE_FAILED) == 0, "".join(bot.log)


async def test_the_next_holder_logs_in_afresh_when_the_resume_address_is_dead(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    # READY names a resume host that is down by the time the next holder resumes there.
    fake.resume_url = dead_resume_url()
    channel = fake.dm_channel(USER)
    async with discord_bots(2, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        holder = await the_holder(bots)
        await holder.kill()
        await fake.wait_for_sessions(0, timeout=5)
        # Sent while no session is open: only the history has it.
        await fake.user_sends(USER, "during")
        await fake.wait_for(lambda: fake.identify_count == 2, timeout=25)
        await settled(redis, channel, 2)
        await fake.user_sends(USER, "after")
        await settled(redis, channel, 3)
        # No RESUME ever reached Discord: every one went to the dead address.
        assert fake.resume_count == 0
        [survivor] = [bot for bot in bots if bot is not holder]
        # One line per try, the last one saying it gives the session up.
        assert survivor.said("cannot resume the Discord session") == RESUME_ATTEMPTS
        assert_quiet(bots, survivor)
    assert first_and_the_rest(fake, channel) == ("You said: before", "during / after")


async def test_a_holder_whose_reconnect_cannot_resume_logs_in_afresh(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    fake.resume_url = dead_resume_url()
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        # Discord drops the connection, leaving the session resumable: discord.py reconnects
        # to resume it, at the address READY named.
        await fake.drop_connections()
        await fake.user_sends(USER, "during")
        await fake.wait_for(lambda: fake.identify_count == 2, timeout=25)
        await settled(redis, channel, 2)
        assert fake.resume_count == 0
        assert_quiet(bots, bots[0])
    assert first_and_the_rest(fake, channel) == ("You said: before", "during")


async def test_a_session_discord_refuses_to_resume_is_given_up_at_once(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(2, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        holder = await the_holder(bots)
        # Discord closes every RESUME with 4009 ("Session timed out": identify afresh).
        fake.resume_close = CLOSE_SESSION_TIMED_OUT
        await holder.kill()
        await fake.wait_for_sessions(0, timeout=5)
        await fake.user_sends(USER, "during")
        await fake.wait_for(lambda: fake.identify_count == 2, timeout=25)
        await settled(redis, channel, 2)
        # One RESUME, refused: the close code says no other try would take.
        assert fake.resume_count == 1
        [survivor] = [bot for bot in bots if bot is not holder]
        assert_quiet(bots, survivor)
    assert first_and_the_rest(fake, channel) == ("You said: before", "during")

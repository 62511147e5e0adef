"""Discord end to end: `lastword run` with the real adapter and discord.py, against the loopback
fake Discord (REST and gateway), with the real store. Each bot is a separate process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.commands import HELP, REFUSAL
from bot.store.embedded import EmbeddedRedis
from tests.support.discord_runs import (
    HOLDS_GATEWAY,
    USER,
    bot_env,
    counters,
    discord_bots,
    first_and_the_rest,
    settled,
    texts,
    the_holder,
)
from tests.support.fakes.discord_server import FakeDiscord, ScriptedError
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.running import Running, clean_environ
from tests.support.waits import eventually

pytestmark = pytest.mark.timeout(60)

# The gateway intents for DMs and their content, and nothing else.
DIRECT_MESSAGES = 1 << 12
DIRECT_MESSAGE_TYPING = 1 << 14
MESSAGE_CONTENT = 1 << 15


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as discord:
        yield discord


async def test_a_burst_of_three_dms_gets_one_reply(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir):
        for text in ("one", "two", "three"):
            await fake.user_sends(USER, text)
        await fake.wait_for_bot_messages(channel, 1, timeout=10)
        await settled(redis, channel, 3)
        assert texts(fake, channel) == ["You said: one / two / three"]
        # The gateway asked for DMs, their content and their typing, nothing more.
        wanted = DIRECT_MESSAGES | MESSAGE_CONTENT | DIRECT_MESSAGE_TYPING
        assert [i["intents"] for i in fake.identifies] == [wanted]
        # Sent with a short nonce Discord enforces, and typing shown before the reply.
        [post] = fake.posts
        assert post.enforce_nonce and post.nonce and len(post.nonce) <= 25
        typing = [at for ch, at in fake.typing_calls if ch == channel]
        assert typing and typing[0] < post.at


async def test_a_replayed_message_create_gets_no_second_reply(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir):
        await fake.user_sends(USER, "first")
        await fake.wait_for_bot_messages(channel, 1, timeout=10)
        await settled(redis, channel, 1)

        # Discord resends every event of the session on RESUME, "first" included.
        fake.replay_from_start_on_resume = True
        resumed = fake.resume_count
        await fake.request_reconnect()
        await fake.wait_for(lambda: fake.resume_count > resumed, timeout=10)
        await fake.user_sends(USER, "second")
        await fake.wait_for_bot_messages(channel, 2, timeout=10)
        await settled(redis, channel, 2)
        assert texts(fake, channel) == ["You said: first", "You said: second"]
        assert fake.identify_count == 1  # resumed, not a new session


async def test_one_gateway_among_three_replicas_and_kill_9_hands_it_over(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(3, server, fake, short_dir) as bots:
        await fake.user_sends(USER, "before")
        await fake.wait_for_bot_messages(channel, 1, timeout=10)
        await settled(redis, channel, 1)

        holder = await the_holder(bots)
        assert fake.connected_sessions() == 1
        await holder.kill()
        await fake.wait_for(lambda: fake.connected_sessions() == 0, timeout=5)

        # Sent while no replica holds the gateway: Discord delivers them once the next holder
        # resumes the dead one's session.
        for text in ("during", "the", "switch"):
            await fake.user_sends(USER, text)
        await fake.wait_for_sessions(1, timeout=15)
        await settled(redis, channel, 4)
        await fake.user_sends(USER, "after")
        await settled(redis, channel, 5)

        survivors = [bot for bot in bots if bot is not holder]
        assert sum(bot.said(HOLDS_GATEWAY) > 0 for bot in survivors) == 1
        assert fake.connected_sessions() == 1
        assert (fake.identify_count, fake.resume_count) == (1, 1)
        assert first_and_the_rest(fake, channel) == (
            "You said: before",
            "during / the / switch / after",
        )


async def test_live_messages_wait_for_the_catch_up_so_the_gap_is_stored_first(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    # Heartbeats report what the bot has received: often, so the test learns it soon.
    fake.heartbeat_interval_ms = 100
    async with discord_bots(1, server, fake, short_dir):
        await fake.user_sends(USER, "before")
        await settled(redis, channel, 1)
        # Two messages the gateway lost, then a new session whose catch-up is slow to read
        # the history: a live message arrives while it reads.
        for text in ("gap one", "gap two"):
            await fake.user_sends(USER, text, dispatch=False)
        fake.hold_history(True)
        reads = fake.history_reads
        await fake.invalidate_sessions()
        await fake.wait_for(lambda: fake.history_reads > reads, timeout=15)
        await fake.wait_for_sessions(1, timeout=5)
        await fake.user_sends(USER, "live")
        # The bot has the live message once a heartbeat reports its sequence number (the
        # adapter sorts a message as it is received). Nothing it does shows that it holds the
        # message back, so it gets one more heartbeat interval, far longer than storing takes,
        # in which a bot without the hold would have stored it.
        await fake.wait_for(fake.received_all, timeout=5)
        beats = fake.heartbeat_acks
        await fake.wait_for(lambda: fake.heartbeat_acks > beats + 1, timeout=5)
        assert await counters(redis, channel) == (1, 1), "the live message was stored early"
        fake.hold_history(False)
        await settled(redis, channel, 4)
    # One reply for the three, in the order they were sent.
    assert texts(fake, channel) == ["You said: before", "You said: gap one / gap two / live"]


async def test_a_crash_after_the_post_and_before_the_commit_posts_nothing_twice(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    env = bot_env(server, fake, short_dir)
    first = await Running.start(env)
    try:
        await fake.wait_for_sessions(1, timeout=20)
        fake.hold_posts(True)
        await fake.user_sends(USER, "hello")
        # Discord has created the message; the bot dies before it hears so, or commits.
        await fake.wait_for(lambda: len(fake.posts) == 1, timeout=10)
        await first.kill()
        fake.hold_posts(False)
        assert await counters(redis, channel) == (1, 0)
    finally:
        await first.stop()

    second = await Running.start(env)
    try:
        # The outbox is re-sent with the same nonce once the dead holder's lease expires.
        await settled(redis, channel, 1)
        assert texts(fake, channel) == ["You said: hello"]
        assert len(fake.posts) == 2
        assert fake.posts[1].nonce == fake.posts[0].nonce
        assert fake.posts[1].deduplicated
    finally:
        await second.stop()


def paragraph(word: str, length: int) -> str:
    sentence = f"{word} " * 20
    return "\n\n".join(sentence.strip() for _ in range(length // len(sentence)))


async def test_a_long_reply_comes_in_ordered_parts_of_at_most_2000(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    burst = [paragraph(word, 1900) for word in ("alpha", "bravo", "charlie")]
    async with discord_bots(1, server, fake, short_dir):
        for text in burst:
            await fake.user_sends(USER, text)
        await settled(redis, channel, 3)
        parts = texts(fake, channel)
        expected = "You said: " + " / ".join(burst)
        assert len(expected) > 5000
        assert len(parts) == 3
        assert all(len(part) <= 2000 for part in parts)
        # In order, and nothing lost but the whitespace at the cuts.
        assert " ".join(parts).split() == expected.split()
        assert parts[0].startswith("You said: alpha")
        assert parts[-1].endswith("charlie")


async def test_guild_and_bot_messages_are_ignored(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    guild_channel = 880001
    async with discord_bots(1, server, fake, short_dir):
        await fake.user_sends(USER, "in a server", guild_id=99001, channel_id=guild_channel)
        await fake.user_sends(USER + 1, "from another bot", bot=True)
        await fake.user_sends(USER, "in a DM")
        await fake.wait_for_bot_messages(channel, 1, timeout=10)
        await settled(redis, channel, 1)
        assert texts(fake, channel) == ["You said: in a DM"]
        assert fake.bot_messages(guild_channel) == []
        assert fake.bot_messages(fake.dm_channel(USER + 1)) == []
        assert await counters(redis, guild_channel) == (0, 0)
        assert await counters(redis, fake.dm_channel(USER + 1)) == (0, 0)


async def test_attachments_and_edits_become_input(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir):
        image = fake.attachment("cat.png", "image/png", 1024)
        sent = await fake.user_sends(USER, "look", attachments=[image])
        await settled(redis, channel, 1)
        await fake.user_edits(int(sent["id"]), "look at this")
        await settled(redis, channel, 2)
        replies = texts(fake, channel)
        assert replies[0].startswith("You said: look [photo: cat.png]")
        assert replies[1] == "You said: (edited) look at this [photo: cat.png]"


async def test_a_429_delays_a_part_and_loses_nothing(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    burst = [paragraph(word, 1600) for word in ("delta", "echo")]
    # Longer than the lease TTL (1.5 s): the lease must stay renewed through the wait.
    retry_after = 2.0
    async with discord_bots(1, server, fake, short_dir):
        fake.fail_next_post(channel, None, FakeDiscord.rate_limited(retry_after))
        for text in burst:
            await fake.user_sends(USER, text)
        await settled(redis, channel, 2)
        parts = texts(fake, channel)
        assert len(parts) == 2
        assert " ".join(parts).split() == ("You said: " + " / ".join(burst)).split()
        statuses = [post.status for post in fake.posts]
        assert statuses == [200, 429, 200]
        # The second part waited as told; no part was posted twice (a lost lease would
        # have restarted the cycle and re-sent the first part under its nonce).
        assert fake.posts[2].at - fake.posts[1].at >= retry_after - 0.05
        assert not any(post.deduplicated for post in fake.posts)


async def test_a_user_with_dms_closed_is_logged_once_and_the_conversation_moves_on(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir) as [bot]:
        fake.fail_next_post(channel, FakeDiscord.cannot_dm())
        await fake.user_sends(USER, "hi")
        await settled(redis, channel, 1)
        assert texts(fake, channel) == []
        # Unreachable: counted as answered at once, never tried again. The log line comes
        # through the bot's stderr, which may be read after the store has settled.

        async def logged() -> bool:
            return bot.said("does not accept DMs") >= 1

        await eventually(logged, within_s=5)
        assert [post.status for post in fake.posts] == [403]

        # Writing again shows the DMs are open: answered as usual.
        await fake.user_sends(USER, "again")
        await fake.wait_for_bot_messages(channel, 1, timeout=10)
        await settled(redis, channel, 2)
        assert texts(fake, channel) == ["You said: again"]
        assert bot.said("does not accept DMs") == 1


@pytest.mark.parametrize(
    ("error", "statuses"),
    [
        (ScriptedError(404, {"message": "Unknown Channel", "code": 10003}), [404]),
        (ScriptedError(403, {"message": "Missing Access", "code": 50001}), [403]),
        (ScriptedError(400, {"message": "Invalid Form Body", "code": 50035}), [400]),
        (FakeDiscord.server_error(503), [503, 200]),
        # Waited out (by discord.py, and by every replica: tests/e2e/test_outbound_budget.py).
        (FakeDiscord.rate_limited(1.5, global_=True), [429, 200]),
    ],
    ids=["unknown-channel", "missing-access", "bad-request", "5xx", "429"],
)
async def test_a_refused_reply_is_given_up_or_tried_again_as_the_error_says(
    server: EmbeddedRedis,
    redis: Redis,
    fake: FakeDiscord,
    short_dir: Path,
    error: ScriptedError,
    statuses: list[int],
) -> None:
    channel = fake.dm_channel(USER)
    retried = len(statuses) > 1
    async with discord_bots(1, server, fake, short_dir) as [bot]:
        fake.fail_next_post(channel, error)
        await fake.user_sends(USER, "hi")
        await settled(redis, channel, 1)
        assert [post.status for post in fake.posts] == statuses
        assert texts(fake, channel) == (["You said: hi"] if retried else [])
        if not retried:
            # Logged through the bot's stderr, which may be read after the store settled.

            async def gave_up() -> bool:
                return bot.said("gave up the reply") >= 1

            await eventually(gave_up, within_s=5)
        assert bot.said("gave up the reply") == (0 if retried else 1)


async def test_commands_and_the_allow_list_hold_on_discord(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    stranger = USER + 50
    channel = fake.dm_channel(USER)
    async with discord_bots(1, server, fake, short_dir, LASTWORD_ACCESS__ALLOWED_USERS=str(USER)):
        await fake.user_sends(USER, "/help")
        await fake.user_sends(stranger, "let me in")
        await settled(redis, channel, 1)
        assert texts(fake, channel) == [HELP]
        await fake.wait_for_bot_messages(fake.dm_channel(stranger), 1, timeout=10)
        assert texts(fake, fake.dm_channel(stranger)) == [REFUSAL]
        assert await counters(redis, fake.dm_channel(stranger)) == (0, 0)


async def test_a_wrong_token_is_one_clear_line(
    server: EmbeddedRedis, fake: FakeDiscord, short_dir: Path
) -> None:
    env = bot_env(server, fake, short_dir, LASTWORD_DISCORD__TOKEN="not-the-token")
    bot = await Running.start(env)
    code = await bot.exited(20)
    assert code == 2
    errors = [line for line in bot.log if "LASTWORD_DISCORD__TOKEN" in line]
    assert len(errors) == 1
    assert errors[0].startswith(
        "lastword: configuration error: LASTWORD_DISCORD__TOKEN: Discord refused the bot token "
    )
    assert "Developer Portal" in errors[0]
    assert not any("Traceback" in line for line in bot.log)
    assert not any("not-the-token" in line for line in bot.log)


async def test_switching_from_telegram_to_discord_is_one_setting(
    server: EmbeddedRedis, redis: Redis, fake: FakeDiscord, short_dir: Path
) -> None:
    """The same deployment (config file, store, data dir) moves to Discord by changing
    `platform` alone: both platforms' sections can sit in the file side by side."""
    async with FakeTelegram() as telegram:
        config = short_dir / "lastword.toml"
        body = (
            f'platform = "telegram"\n'
            f'redis_url = "{server.url}"\n'
            f'data_dir = "{short_dir / "data"}"\n'
            "[debounce]\nquiet_ms = 300\nmax_wait_ms = 1500\n"
            "[lease]\nttl_ms = 1500\n"
            '[llm]\nprovider = "echo"\n'
            f'[telegram]\ntoken = "{telegram.token}"\napi_url = "{telegram.api_url}"\n'
            f'[discord]\ntoken = "{fake.token}"\napi_url = "{fake.api_url}"\n'
            f'gateway_url = "{fake.gateway_url}"\n'
        )
        config.write_text(body)
        env = clean_environ() | {"LASTWORD_CONFIG": str(config)}

        on_telegram = await Running.start(env)
        try:
            telegram.push_update(telegram.private_text_update(USER, USER, "on telegram"))
            await telegram.wait_for_sent(1, timeout=15)
        finally:
            await on_telegram.stop()
        assert [m.text for m in telegram.sent_messages] == ["You said: on telegram"]

        config.write_text(body.replace('platform = "telegram"', 'platform = "discord"', 1))
        on_discord = await Running.start(env)
        try:
            channel = fake.dm_channel(USER)
            await fake.wait_for_sessions(1, timeout=20)
            await fake.user_sends(USER, "on discord")
            await settled(redis, channel, 1)
            assert texts(fake, channel) == ["You said: on discord"]
        finally:
            await on_discord.stop()

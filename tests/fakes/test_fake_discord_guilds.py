"""The fake Discord's servers, as the real ``discord.py`` client sees them: guilds lazy-loaded
after READY (GUILD_CREATE, for a session with the GUILDS intent), text channels and public
threads resolved to ``TextChannel`` and ``Thread``, members with their nicknames, other bots,
mentions, replies both ways (a user's to the bot, the bot's with ``reference`` and
``allowed_mentions``), and typing in a thread. What a group-chat bot relies on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from typing import Any

import aiohttp
import discord
import discord.gateway
import discord.http
import pytest

from tests.support.discord_client import connected as connected_client
from tests.support.fakes.discord_server import (
    CHANNEL_PUBLIC_THREAD,
    INTENT_GUILD_MEMBERS,
    MESSAGE_TYPE_REPLY,
    FakeDiscord,
)

pytestmark = pytest.mark.timeout(30)

# What a bot reading group chats asks for: guilds (the cache of guilds, channels and threads),
# their messages and their text.
GROUP_INTENTS = discord.Intents(
    guilds=True, guild_messages=True, dm_messages=True, message_content=True
)
GUILD = 555000000000000001
OTHER_GUILD = 555000000000000002
USER = 310000000000000001
OTHER_USER = 310000000000000002
PEER_BOT = 310000000000000003
WAIT_S = 5.0


class GroupClient(discord.Client):
    """A discord.py client that hands messages to a queue and notes the guild events."""

    def __init__(self, intents: discord.Intents = GROUP_INTENTS) -> None:
        super().__init__(intents=intents, guild_ready_timeout=0.2)
        self.inbox: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.joined: list[int] = []
        self.channels_created: list[int] = []
        self.threads_created: list[int] = []
        self.resumed = asyncio.Event()

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # discord.py's default sleeps 5 s before every IDENTIFY but the first.
        pass

    async def on_message(self, message: discord.Message) -> None:
        self.inbox.put_nowait(message)

    async def on_guild_join(self, guild: discord.Guild) -> None:
        self.joined.append(guild.id)

    async def on_guild_channel_create(self, channel: discord.abc.GuildChannel) -> None:
        self.channels_created.append(channel.id)

    async def on_thread_create(self, thread: discord.Thread) -> None:
        self.threads_created.append(thread.id)

    async def on_resumed(self) -> None:
        self.resumed.set()

    async def next_user_message(self) -> discord.Message:
        """The next message not authored by this bot (Discord echoes the bot's own)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                message = await self.inbox.get()
                if self.user is None or message.author.id != self.user.id:
                    return message

    async def next_own_message(self) -> discord.Message:
        """The next echo of a message this bot sent."""
        async with asyncio.timeout(WAIT_S):
            while True:
                message = await self.inbox.get()
                if self.user is not None and message.author.id == self.user.id:
                    return message


def connected(
    fake: FakeDiscord, intents: discord.Intents = GROUP_INTENTS
) -> contextlib.AbstractAsyncContextManager[GroupClient]:
    """A client logged in and connected, its guilds loaded and on_ready dispatched."""
    return connected_client(fake, GroupClient(intents))


def thread_of(message: discord.Message) -> discord.Thread:
    assert isinstance(message.channel, discord.Thread), type(message.channel)
    return message.channel


# -- guilds, channels and threads -------------------------------------------------------------


async def test_guild_and_thread_messages_resolve_to_their_channels(fake: FakeDiscord) -> None:
    fake.guild(GUILD, name="the server")
    channel_id = fake.guild_channel(GUILD, name="general")
    thread_id = fake.thread(GUILD, channel_id, name="a topic", owner_id=USER)
    async with connected(fake) as client:
        # READY listed the guild as unavailable; its GUILD_CREATE filled the cache.
        guild = client.get_guild(GUILD)
        assert guild is not None and not guild.unavailable
        assert guild.name == "the server"
        assert client.joined == []  # lazy-loaded, not joined
        general = guild.get_channel(channel_id)
        assert isinstance(general, discord.TextChannel) and general.name == "general"
        cached_thread = guild.get_thread(thread_id)
        assert cached_thread is not None and cached_thread.parent_id == channel_id
        assert cached_thread.owner_id == USER and cached_thread.name == "a topic"
        assert guild.me is not None and guild.me.id == fake.bot_id

        sent = await fake.user_sends(USER, "hello all", guild_id=GUILD, nick="Ally")
        in_channel = await client.next_user_message()
        assert sent["channel_id"] == str(channel_id) and sent["guild_id"] == str(GUILD)
        assert in_channel.guild is guild
        assert isinstance(in_channel.channel, discord.TextChannel)
        assert in_channel.channel.id == channel_id
        assert isinstance(in_channel.author, discord.Member)
        assert in_channel.author.nick == "Ally" and in_channel.author.display_name == "Ally"

        sent = await fake.user_sends(USER, "in the thread", guild_id=GUILD, channel_id=thread_id)
        in_thread = await client.next_user_message()
        assert (sent["guild_id"], sent["channel_id"]) == (str(GUILD), str(thread_id))
        assert in_thread.guild is not None and in_thread.guild.id == GUILD
        thread = thread_of(in_thread)
        assert thread.id == thread_id and thread.parent_id == channel_id
        assert thread.parent is general
        assert thread.type is discord.ChannelType.public_thread
        assert in_thread.content == "in the thread"

        # Over REST the thread is a type 11 channel naming its parent and guild.
        fetched = await client.fetch_channel(thread_id)
        assert isinstance(fetched, discord.Thread)
        assert (fetched.parent_id, fetched.guild.id) == (channel_id, GUILD)
        async with aiohttp.ClientSession() as session:
            url = f"{fake.api_url}/channels/{thread_id}"
            headers = {"Authorization": f"Bot {fake.token}"}
            async with session.get(url, headers=headers) as response:
                raw = await response.json()
        assert raw["type"] == CHANNEL_PUBLIC_THREAD == 11
        assert (raw["parent_id"], raw["guild_id"]) == (str(channel_id), str(GUILD))
        assert raw["message_count"] == 1
        assert raw["last_message_id"] == sent["id"]


async def test_guilds_channels_and_threads_made_while_connected_are_announced(
    fake: FakeDiscord,
) -> None:
    async with connected(fake) as client:
        assert list(client.guilds) == []
        # A new guild (GUILD_CREATE, a join), then a channel in it (CHANNEL_CREATE), then a
        # thread (THREAD_CREATE): each is known before the first message in it arrives.
        await fake.user_sends(USER, "first", guild_id=OTHER_GUILD)
        first = await client.next_user_message()
        assert first.guild is not None and first.guild.id == OTHER_GUILD
        assert isinstance(first.channel, discord.TextChannel)
        assert client.joined == [OTHER_GUILD]

        side = fake.guild_channel(OTHER_GUILD, 880002, name="side")
        thread_id = fake.thread(OTHER_GUILD, side)
        await fake.user_sends(OTHER_USER, "in a new thread", guild_id=OTHER_GUILD, channel_id=side)
        await fake.user_sends(OTHER_USER, "deeper", guild_id=OTHER_GUILD, channel_id=thread_id)
        in_side = await client.next_user_message()
        assert isinstance(in_side.channel, discord.TextChannel) and in_side.channel.id == side
        in_thread = await client.next_user_message()
        assert thread_of(in_thread).parent_id == side
        assert client.channels_created == [side]
        assert client.threads_created == [thread_id]

        # Announced without any later message too: by a task of the fake's own.
        # (The listener is in place before the event can arrive: the fake sends it from a
        # task, which runs only once this test awaits.)
        lone = fake.thread(OTHER_GUILD, side, name="quiet")
        quiet = await client.wait_for("thread_create", timeout=WAIT_S)
        assert isinstance(quiet, discord.Thread)
        assert (quiet.id, quiet.name, quiet.parent_id) == (lone, "quiet", side)
        guild = client.get_guild(OTHER_GUILD)
        assert guild is not None and guild.get_thread(lone) is quiet


async def test_guild_events_missed_while_away_come_with_the_resume(fake: FakeDiscord) -> None:
    channel_id = fake.guild_channel(GUILD)
    async with connected(fake) as client:
        await fake.drop_connections(4000)
        thread_id = fake.thread(GUILD, channel_id)
        await fake.user_sends(USER, "while away", guild_id=GUILD, channel_id=thread_id)
        async with asyncio.timeout(WAIT_S):
            await client.resumed.wait()
        message = await client.next_user_message()
        assert thread_of(message).id == thread_id
        assert client.threads_created == [thread_id]
        assert fake.resume_count == 1 and fake.identify_count == 1


async def test_without_the_guilds_intent_nothing_is_cached(fake: FakeDiscord) -> None:
    """READY still lists the guild (unavailable), but no GUILD_CREATE follows: discord.py
    knows the guild only as unavailable, the channel only as a partial one."""
    channel_id = fake.guild_channel(GUILD)
    thread_id = fake.thread(GUILD, channel_id)
    intents = discord.Intents(guild_messages=True, dm_messages=True, message_content=True)
    async with connected(fake, intents) as client:
        await fake.user_sends(USER, "hi", guild_id=GUILD, channel_id=thread_id)
        message = await client.next_user_message()
        assert isinstance(message.channel, discord.PartialMessageable)
        assert message.channel.guild_id == GUILD
        # Not None: an unavailable guild from READY. "Is a DM" is the channel's type.
        assert message.guild is not None and message.guild.unavailable
        assert message.channel.type is not discord.ChannelType.private
        assert client.threads_created == []


async def test_ready_and_guild_create_on_the_wire(fake: FakeDiscord) -> None:
    channel_id = fake.guild_channel(GUILD, name="general")
    thread_id = fake.thread(GUILD, channel_id)
    await fake.user_sends(USER, "before", guild_id=GUILD, nick="Ally")
    identify = {"op": 2, "d": {"token": fake.token, "intents": GROUP_INTENTS.value}}
    inflater = zlib.decompressobj()
    frames: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(fake.gateway_url + "?v=10&encoding=json&compress=zlib-stream") as ws,
    ):
        async with asyncio.timeout(WAIT_S):
            while len(frames) < 3:
                frames.append(json.loads(inflater.decompress((await ws.receive()).data)))
                if len(frames) == 1:
                    await ws.send_str(json.dumps(identify))
    _, ready, guild_create = frames
    assert ready["t"] == "READY"
    assert ready["d"]["guilds"] == [{"id": str(GUILD), "unavailable": True}]
    assert (guild_create["t"], guild_create["s"]) == ("GUILD_CREATE", 2)
    guild = guild_create["d"]
    assert guild["id"] == str(GUILD) and guild["unavailable"] is False
    assert [c["id"] for c in guild["channels"]] == [str(channel_id)]
    assert [(t["id"], t["type"], t["parent_id"]) for t in guild["threads"]] == [
        (str(thread_id), 11, str(channel_id))
    ]
    # Without the presences intent Discord lists the bot alone; the count is everyone's
    # (the bot, the guild's owner, USER).
    assert [m["user"]["id"] for m in guild["members"]] == [str(fake.bot_id)]
    assert guild["member_count"] == 3
    assert guild["roles"][0]["id"] == str(GUILD)  # @everyone


async def test_member_chunks_answer_a_client_with_the_members_intent(fake: FakeDiscord) -> None:
    fake.enabled_privileged_intents |= INTENT_GUILD_MEMBERS
    await fake.user_sends(USER, "hello", guild_id=GUILD, nick="Ally")
    intents = GROUP_INTENTS | discord.Intents(members=True)
    async with connected(fake, intents) as client:
        # GUILD_CREATE brought the bot alone; discord.py asked for the rest (op 8).
        guild = client.get_guild(GUILD)
        assert guild is not None and guild.chunked and guild.member_count == 3
        member = guild.get_member(USER)
        assert member is not None and member.nick == "Ally"


# -- authors, mentions and replies -----------------------------------------------------------


async def test_other_bots_names_and_mentions(fake: FakeDiscord) -> None:
    channel_id = fake.guild_channel(GUILD)
    async with connected(fake) as client:
        assert client.user is not None
        await fake.user_sends(PEER_BOT, "beep", guild_id=GUILD, bot=True, name="Peer Bot")
        peer = await client.next_user_message()
        assert peer.author.bot and peer.author.id == PEER_BOT
        assert peer.author.display_name == "Peer Bot"
        assert peer.channel.id == channel_id

        await fake.user_sends(USER, "hey", guild_id=GUILD, name="Alice")
        human = await client.next_user_message()
        assert not human.author.bot and human.author.display_name == "Alice"
        assert human.mentions == []

        # Both mention forms name the bot (and a known user), as client.user.mentioned_in sees.
        for text in (f"<@{fake.bot_id}> hi", f"<@!{fake.bot_id}> hi <@{PEER_BOT}>"):
            await fake.user_sends(USER, text, guild_id=GUILD)
            mentioning = await client.next_user_message()
            assert client.user.mentioned_in(mentioning)
            assert fake.bot_id in {m.id for m in mentioning.mentions}
        assert {m.id for m in mentioning.mentions} == {fake.bot_id, PEER_BOT}
        assert all(isinstance(m, discord.Member) for m in mentioning.mentions)


async def test_a_reply_to_the_bot_reaches_the_client_resolved(fake: FakeDiscord) -> None:
    channel_id = fake.guild_channel(GUILD)
    thread_id = fake.thread(GUILD, channel_id)
    async with connected(fake) as client:
        assert client.user is not None
        thread = client.get_channel(thread_id)
        assert isinstance(thread, discord.Thread)
        mine = await thread.send("I am the bot")
        await client.next_own_message()

        sent = await fake.user_sends(
            USER, "you said that?", guild_id=GUILD, channel_id=thread_id, reply_to=mine.id
        )
        assert sent["type"] == MESSAGE_TYPE_REPLY == 19
        assert sent["message_reference"] == {
            "type": 0,
            "message_id": str(mine.id),
            "channel_id": str(thread_id),
            "guild_id": str(GUILD),
        }
        reply = await client.next_user_message()
        assert reply.type is discord.MessageType.reply
        assert reply.reference is not None and reply.reference.message_id == mine.id
        assert reply.reference.channel_id == thread_id
        resolved = reply.reference.resolved
        assert isinstance(resolved, discord.Message)
        assert resolved.author.id == fake.bot_id and resolved.content == "I am the bot"
        # Discord's clients ping the replied-to author unless told not to.
        assert client.user.mentioned_in(reply)

        await fake.user_sends(
            USER,
            "quietly",
            guild_id=GUILD,
            channel_id=thread_id,
            reply_to=mine.id,
            mention_author=False,
        )
        quiet = await client.next_user_message()
        assert quiet.reference is not None and quiet.reference.message_id == mine.id
        assert not client.user.mentioned_in(quiet)

        # A reply to another user's message, and one to a message not in that channel.
        other = await fake.user_sends(OTHER_USER, "mine", guild_id=GUILD, channel_id=thread_id)
        await fake.user_sends(
            USER, "agreed", guild_id=GUILD, channel_id=thread_id, reply_to=int(other["id"])
        )
        await client.next_user_message()
        to_user = await client.next_user_message()
        assert to_user.reference is not None
        assert isinstance(to_user.reference.resolved, discord.Message)
        assert to_user.reference.resolved.author.id == OTHER_USER
        assert [m.id for m in to_user.mentions] == [OTHER_USER]
        with pytest.raises(ValueError):
            await fake.user_sends(USER, "lost", guild_id=GUILD, reply_to=mine.id)


async def test_without_message_content_only_what_names_the_bot_keeps_its_text(
    fake: FakeDiscord,
) -> None:
    channel_id = fake.guild_channel(GUILD)
    intents = discord.Intents(guilds=True, guild_messages=True)
    async with connected(fake, intents) as client:
        channel = client.get_channel(channel_id)
        assert isinstance(channel, discord.TextChannel)
        mine = await channel.send("from the bot")
        assert (await client.next_own_message()).content == "from the bot"

        await fake.user_sends(USER, "chatter", guild_id=GUILD)
        assert (await client.next_user_message()).content == ""
        await fake.user_sends(USER, f"<@!{fake.bot_id}> you there?", guild_id=GUILD)
        assert (await client.next_user_message()).content == f"<@!{fake.bot_id}> you there?"
        await fake.user_sends(USER, "pinged reply", guild_id=GUILD, reply_to=mine.id)
        pinged = await client.next_user_message()
        assert pinged.content == "pinged reply"
        assert pinged.reference is not None
        assert isinstance(pinged.reference.resolved, discord.Message)
        assert pinged.reference.resolved.content == "from the bot"
        await fake.user_sends(
            USER, "silent reply", guild_id=GUILD, reply_to=mine.id, mention_author=False
        )
        assert (await client.next_user_message()).content == ""


async def test_the_bots_reply_is_recorded_with_its_reference_and_allowed_mentions(
    fake: FakeDiscord,
) -> None:
    channel_id = fake.guild_channel(GUILD)
    thread_id = fake.thread(GUILD, channel_id)
    async with connected(fake) as client:
        await fake.user_sends(OTHER_USER, "here", guild_id=GUILD, channel_id=thread_id)
        await client.next_user_message()
        await fake.user_sends(USER, "question?", guild_id=GUILD, channel_id=thread_id)
        question = await client.next_user_message()

        allowed = discord.AllowedMentions(
            everyone=False, users=False, roles=False, replied_user=True
        )
        answer = await question.channel.send(
            f"answer (cc <@{OTHER_USER}>)", reference=question, allowed_mentions=allowed
        )
        post = fake.posts[-1]
        assert (post.status, post.channel_id, post.reply_to) == (200, thread_id, question.id)
        assert post.allowed_mentions == {"parse": [], "replied_user": True}
        assert post.message_reference is not None
        assert post.message_reference["guild_id"] == GUILD

        [stored] = fake.bot_messages(thread_id)
        assert stored["id"] == str(answer.id) and stored["type"] == MESSAGE_TYPE_REPLY
        assert stored["message_reference"]["message_id"] == str(question.id)
        assert stored["referenced_message"]["id"] == str(question.id)
        assert stored["referenced_message"]["author"]["id"] == str(USER)
        # Only the replied-to user is pinged: users=False kept OTHER_USER out.
        assert [m["id"] for m in stored["mentions"]] == [str(USER)]
        assert answer.type is discord.MessageType.reply
        assert answer.reference is not None and answer.reference.message_id == question.id
        echoed = await client.next_own_message()
        assert echoed.id == answer.id and echoed.reference is not None
        assert thread_of(echoed).id == thread_id

        # mention_author=False: a reply that pings no one.
        await question.reply("noted", mention_author=False)
        assert fake.posts[-1].allowed_mentions == {
            "parse": ["everyone", "users", "roles"],
            "replied_user": False,
        }
        assert fake.bot_messages(thread_id)[-1]["mentions"] == []
        # No allowed_mentions at all: Discord's default pings the replied-to author.
        await question.reply("default")
        assert fake.posts[-1].allowed_mentions is None
        assert [m["id"] for m in fake.bot_messages(thread_id)[-1]["mentions"]] == [str(USER)]

        # messages(): users' and the bot's, in the order they were written.
        assert [m["content"] for m in fake.messages(thread_id)] == [
            "here",
            "question?",
            f"answer (cc <@{OTHER_USER}>)",
            "noted",
            "default",
        ]
        history = [m.content async for m in question.channel.history(limit=None)]
        assert history == [m["content"] for m in reversed(fake.messages(thread_id))]


async def test_a_reply_to_an_unknown_message_is_refused_unless_told_not_to_fail(
    fake: FakeDiscord,
) -> None:
    channel_id = fake.guild_channel(GUILD)
    elsewhere = fake.guild_channel(GUILD, 880001)
    async with connected(fake) as client:
        channel = client.get_channel(channel_id)
        assert isinstance(channel, discord.TextChannel)
        stranger = await fake.user_sends(USER, "elsewhere", guild_id=GUILD, channel_id=elsewhere)
        missing = discord.MessageReference(
            message_id=123456789, channel_id=channel_id, fail_if_not_exists=True
        )
        across = discord.MessageReference(
            message_id=int(stranger["id"]), channel_id=channel_id, fail_if_not_exists=True
        )
        for reference in (missing, across):
            with pytest.raises(discord.HTTPException) as refused:
                await channel.send("to nothing", reference=reference)
            assert (refused.value.status, refused.value.code) == (400, 50035)
            assert refused.value.text == "Invalid Form Body\nIn message_reference: Unknown message"
        assert [(p.status, p.message_id) for p in fake.posts] == [(400, None), (400, None)]
        assert fake.posts[0].reply_to == 123456789
        assert fake.bot_messages(channel_id) == []

        missing.fail_if_not_exists = False
        sent = await channel.send("sent anyway", reference=missing)
        assert sent.reference is None and sent.type is discord.MessageType.default
        [stored] = fake.bot_messages(channel_id)
        assert stored["type"] == 0 and "message_reference" not in stored
        assert fake.posts[-1].status == 200 and fake.posts[-1].reply_to == 123456789


async def test_typing_in_a_thread_and_a_channel_is_recorded(fake: FakeDiscord) -> None:
    channel_id = fake.guild_channel(GUILD)
    thread_id = fake.thread(GUILD, channel_id)
    async with connected(fake) as client:
        thread = client.get_channel(thread_id)
        channel = client.get_channel(channel_id)
        assert isinstance(thread, discord.Thread) and isinstance(channel, discord.TextChannel)
        await thread.typing()
        await channel.typing()
        assert [c for c, _ in fake.typing_calls] == [thread_id, channel_id]
        await thread.send("typed")
        assert [m["content"] for m in fake.bot_messages(thread_id)] == ["typed"]
        assert fake.bot_messages(channel_id) == []

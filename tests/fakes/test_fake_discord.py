"""The fake Discord must look, to the real ``discord.py`` client, like Discord in every way the
Discord adapter relies on: REST login, sends with ``nonce``/``enforce_nonce``, rate limits and
errors, history paging, and the gateway (zlib-stream, HELLO/IDENTIFY/READY, heartbeats,
dispatches, RESUME with replay). These tests pin that down."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import discord
import discord.gateway
import discord.http
import pytest
import yarl

from tests.support.discord_client import WAIT_S, connected
from tests.support.fakes.discord_server import (
    CDN_GONE,
    DISCORD_EPOCH_MS,
    MESSAGE_FLAG_IS_VOICE_MESSAGE,
    FakeDiscord,
    snowflake_time_ms,
)

pytestmark = pytest.mark.timeout(30)

INTENTS = discord.Intents(dm_messages=True, message_content=True)
USER = 310000000000000001


class Recorder(discord.Client):
    """A discord.py client that hands the events the tests look at to queues."""

    def __init__(self, intents: discord.Intents = INTENTS) -> None:
        super().__init__(intents=intents, guild_ready_timeout=0.2)
        self.inbox: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.edits: asyncio.Queue[discord.RawMessageUpdateEvent] = asyncio.Queue()
        self.resumed = asyncio.Event()
        self.identify_hooks = 0

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # discord.py's default sleeps 5 s before every IDENTIFY but the first (Discord's
        # identify rate limit); a public hook, skipped here to keep the tests fast.
        self.identify_hooks += 1

    async def on_message(self, message: discord.Message) -> None:
        self.inbox.put_nowait(message)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        self.edits.put_nowait(payload)

    async def on_resumed(self) -> None:
        self.resumed.set()

    async def next_message(self) -> discord.Message:
        async with asyncio.timeout(WAIT_S):
            return await self.inbox.get()

    async def next_user_message(self) -> discord.Message:
        """The next message not authored by this bot (Discord echoes the bot's own)."""
        while True:
            message = await self.next_message()
            if self.user is None or message.author.id != self.user.id:
                return message


@contextlib.asynccontextmanager
async def rest_client(fake: FakeDiscord) -> AsyncIterator[Recorder]:
    client = Recorder()
    try:
        await client.login(fake.token)
        yield client
    finally:
        await client.close()


def gateway_client(fake: FakeDiscord) -> contextlib.AbstractAsyncContextManager[Recorder]:
    return connected(fake, Recorder())


# -- REST ------------------------------------------------------------------------------------


async def test_login_over_rest(fake: FakeDiscord) -> None:
    async with rest_client(fake) as client:
        assert client.user is not None
        assert client.user.id == fake.bot_id
        assert client.user.bot
        assert client.application_id == fake.application_id
        # A snowflake's top bits are milliseconds since the Discord epoch: about now.
        assert abs(snowflake_time_ms(fake.bot_id) - time.time() * 1000) < 60_000
        assert snowflake_time_ms(fake.bot_id) > DISCORD_EPOCH_MS


async def test_wrong_token_fails_login(fake: FakeDiscord) -> None:
    client = Recorder()
    try:
        with pytest.raises(discord.LoginFailure):
            await client.login("not-the-token")
    finally:
        await client.close()


async def test_unknown_route_and_missing_auth(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bot {fake.token}"}
        async with session.get(f"{fake.api_url}/no/such/route", headers=headers) as response:
            assert response.status == 404
            assert await response.json() == {"message": "404: Not Found", "code": 0}
        async with session.get(f"{fake.api_url}/users/@me") as response:
            assert response.status == 401
            assert await response.json() == {"message": "401: Unauthorized", "code": 0}
        async with session.get(f"{fake.api_url}/gateway/bot", headers=headers) as response:
            body = await response.json()
            assert body["url"] == fake.gateway_url
            assert body["shards"] == 1
            assert body["session_start_limit"]["max_concurrency"] == 1


async def test_nonce_with_enforce_nonce_sends_once(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    async with rest_client(fake) as client:
        channel = client.get_partial_messageable(channel_id)
        first = await channel.send("hi", nonce="abc")
        again = await channel.send("hi, resent", nonce="abc")

        assert again.id == first.id
        assert again.content == "hi"
        [visible] = fake.bot_messages(channel_id)
        assert visible["id"] == str(first.id)
        assert visible["nonce"] == "abc"
        assert visible["author"]["id"] == str(fake.bot_id)
        assert [(p.nonce, p.enforce_nonce, p.deduplicated, p.status) for p in fake.posts] == [
            ("abc", True, False, 200),
            ("abc", True, True, 200),
        ]

        # discord.py always sets enforce_nonce with a nonce; go one level down to clear it.
        route = discord.http.Route("POST", "/channels/{channel_id}/messages", channel_id=channel_id)
        payload = {"content": "twice", "nonce": "xyz", "enforce_nonce": False}
        one = await client.http.request(route, json=payload)
        route = discord.http.Route("POST", "/channels/{channel_id}/messages", channel_id=channel_id)
        two = await client.http.request(route, json=payload)
        assert one["id"] != two["id"]
        assert [m["content"] for m in fake.bot_messages(channel_id)] == ["hi", "twice", "twice"]


class Watcher(Recorder):
    """A client with the direct message typing intent, keeping the typing events it gets."""

    def __init__(self, typing: bool) -> None:
        super().__init__(discord.Intents(**(dict(INTENTS) | {"dm_typing": typing})))
        self.typing: asyncio.Queue[discord.RawTypingEvent] = asyncio.Queue()

    async def on_raw_typing(self, payload: discord.RawTypingEvent) -> None:
        self.typing.put_nowait(payload)


async def test_typing_in_a_dm_reaches_a_session_with_the_typing_intent_only(
    fake: FakeDiscord,
) -> None:
    async with (
        connected(fake, Watcher(typing=True)) as watcher,
        connected(fake, Watcher(typing=False)) as blind,
    ):
        assert await fake.user_types(USER) == 1
        async with asyncio.timeout(WAIT_S):
            event = await watcher.typing.get()
        assert event.user_id == USER and event.channel_id == fake.dm_channel(USER)
        assert event.guild_id is None
        # Sent before the message: had the blind session got the typing, it would be first.
        await fake.user_sends(USER, "hello")
        assert (await blind.next_user_message()).content == "hello"
        assert blind.typing.empty()
    assert fake.typing_events == [(USER, fake.dm_channel(USER), 1)]


async def test_send_validation_and_typing(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    async with rest_client(fake) as client:
        channel = client.get_partial_messageable(channel_id)

        with pytest.raises(discord.HTTPException) as too_long:
            await channel.send("x" * 2001)
        assert (too_long.value.status, too_long.value.code) == (400, 50035)

        with pytest.raises(discord.HTTPException) as long_nonce:
            await channel.send("ok", nonce="n" * 26)
        assert (long_nonce.value.status, long_nonce.value.code) == (400, 50035)

        with pytest.raises(discord.NotFound) as unknown:
            await client.get_partial_messageable(12345).send("lost")
        assert unknown.value.code == 10003

        exact = await channel.send("y" * 2000)
        assert len(exact.content) == 2000
        assert len(fake.bot_messages(channel_id)) == 1

        await channel.typing()
        assert [c for c, _ in fake.typing_calls] == [channel_id]

        # A file makes discord.py switch to multipart with payload_json.
        with_file = await channel.send("a file", file=discord.File(io.BytesIO(b"abcd"), "a.txt"))
        assert with_file.content == "a file"
        assert [(a.filename, a.size) for a in with_file.attachments] == [("a.txt", 4)]
        assert len(fake.bot_messages(channel_id)) == 2


async def test_rate_limit_is_waited_out_and_retried(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    fake.fail_next_post(channel_id, FakeDiscord.rate_limited(0.3))
    async with rest_client(fake) as client:
        started = time.monotonic()
        message = await client.get_partial_messageable(channel_id).send("after the wait")
        elapsed = time.monotonic() - started

    assert elapsed >= 0.3
    assert [p.status for p in fake.posts] == [429, 200]
    assert fake.posts[1].at - fake.posts[0].at >= 0.3
    [visible] = fake.bot_messages(channel_id)
    assert visible["id"] == str(message.id)


async def test_cannot_dm_raises_forbidden(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    fake.fail_next_post(None, FakeDiscord.cannot_dm())
    async with rest_client(fake) as client:
        with pytest.raises(discord.Forbidden) as denied:
            await client.get_partial_messageable(channel_id).send("hello?")
    assert denied.value.code == 50007
    assert denied.value.status == 403
    assert fake.bot_messages(channel_id) == []
    assert [p.status for p in fake.posts] == [403]


async def test_held_post_is_visible_before_its_answer(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    async with rest_client(fake) as client:
        channel = client.get_partial_messageable(channel_id)
        fake.hold_posts(True)
        send = asyncio.create_task(channel.send("held", nonce="h1"))
        [message] = await fake.wait_for_bot_messages(channel_id, 1, WAIT_S)
        assert not send.done()
        assert fake.posts[0].status is None

        # The client gives up (as a killed process would): the fake sees the hang-up.
        send.cancel()
        await fake.wait_for(lambda: fake.posts[0].cancelled, WAIT_S)

        fake.hold_posts(False)
        resent = await channel.send("held", nonce="h1")
        assert resent.id == int(message["id"])
        assert len(fake.bot_messages(channel_id)) == 1
        assert fake.posts[1].deduplicated


async def test_history_is_ordered_like_discord(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    ids: list[int] = []
    async with rest_client(fake) as client:
        channel = client.get_partial_messageable(channel_id)
        for i in range(130):
            if i % 10 == 9:
                ids.append((await channel.send(f"bot {i}")).id)
            else:
                ids.append(int((await fake.user_sends(USER, f"user {i}"))["id"]))
        assert ids == sorted(ids)

        after = [m.id async for m in channel.history(after=discord.Object(ids[4]), limit=None)]
        assert after == ids[5:]  # oldest first, across two pages of 100
        newest = [m.id async for m in channel.history(limit=None)]
        assert newest == ids[::-1]
        around = [m.id async for m in channel.history(around=discord.Object(ids[50]), limit=5)]
        assert around == ids[48:53][::-1]
        authors = {m.author.id async for m in channel.history(limit=20)}
        assert authors == {USER, fake.bot_id}

    async with aiohttp.ClientSession() as session:
        url = f"{fake.api_url}/channels/{channel_id}/messages"
        headers = {"Authorization": f"Bot {fake.token}"}
        async with session.get(url, headers=headers) as response:
            page = await response.json()
        assert [int(m["id"]) for m in page] == ids[::-1][:50]  # default limit 50
        async with session.get(url, headers=headers, params={"limit": "101"}) as response:
            assert response.status == 400
            assert (await response.json())["code"] == 50035


# -- gateway ---------------------------------------------------------------------------------


async def test_gateway_ready_identify_and_zlib_stream(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        assert fake.connected_sessions() == 1
        assert fake.identify_count == 1
        [identify] = fake.identifies
        assert identify["intents"] == INTENTS.value == (1 << 12) | (1 << 15)
        [connection] = fake.gateway_connections
        assert connection == {"v": "10", "encoding": "json", "compress": "zlib-stream"}
        assert client.user is not None and client.user.id == fake.bot_id
        assert client.ws is not None and client.ws.session_id is not None
        # READY went out compressed and was understood: discord.py took the fake's URL for
        # RESUMEs from it.
        assert str(client.ws.gateway) == fake.resume_gateway_url
    await fake.wait_for_sessions(0, WAIT_S)


async def test_dm_and_edit_reach_the_client(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        photo = fake.attachment("cat.png", "image/png", 1234)
        sent = await fake.user_sends(USER, "look at this", attachments=[photo])

        message = await client.next_user_message()
        assert message.id == int(sent["id"])
        assert message.guild is None
        assert isinstance(message.channel, discord.DMChannel)
        assert message.channel.id == fake.dm_channel(USER)
        assert message.content == "look at this"
        assert message.author.id == USER
        assert not message.author.bot
        assert [(a.filename, a.content_type, a.size) for a in message.attachments] == [
            ("cat.png", "image/png", 1234)
        ]

        await fake.user_edits(message.id, "look at this cat")
        async with asyncio.timeout(WAIT_S):
            edit = await client.edits.get()
        assert edit.message_id == message.id
        assert edit.data["content"] == "look at this cat"
        assert edit.data["edited_timestamp"] is not None
        assert edit.message.content == "look at this cat"

        # Discord echoes the bot's own messages on the gateway.
        reply = await client.get_partial_messageable(message.channel.id).send("nice cat")
        echoed = await client.next_message()
        assert echoed.id == reply.id
        assert client.user is not None and echoed.author.id == client.user.id


async def test_guild_message_is_dispatched_with_its_guild(fake: FakeDiscord) -> None:
    guild_id = 555000000000000001
    async with gateway_client(fake) as client:
        await fake.user_sends(USER, "in a server", guild_id=guild_id)
        message = await client.next_user_message()
        # Without the GUILDS intent discord.py has no guild cached: message.guild is None even
        # here, so "is a DM" must be told from the channel, not from message.guild.
        assert message.guild is None
        assert not isinstance(message.channel, discord.DMChannel)
        assert isinstance(message.channel, discord.PartialMessageable)
        assert message.channel.guild_id == guild_id


async def test_heartbeats_are_acknowledged(fake: FakeDiscord) -> None:
    fake.heartbeat_interval_ms = 200
    async with gateway_client(fake) as client:
        await fake.wait_for(lambda: fake.heartbeat_acks >= 3, WAIT_S)
        assert client.latency < 1.0


async def test_heartbeats_tell_what_the_client_received(fake: FakeDiscord) -> None:
    fake.heartbeat_interval_ms = 100
    async with gateway_client(fake) as client:
        await fake.wait_for(fake.received_all, WAIT_S)
        await fake.user_sends(USER, "one")
        await fake.user_sends(USER, "two")
        assert not fake.received_all()
        await fake.wait_for(fake.received_all, WAIT_S)
        assert (await client.next_user_message()).content == "one"


@pytest.mark.parametrize("gap", ["reconnect", "drop"])
async def test_resume_replays_missed_events(fake: FakeDiscord, gap: str) -> None:
    async with gateway_client(fake) as client:
        await fake.user_sends(USER, "before")
        assert (await client.next_user_message()).content == "before"

        if gap == "reconnect":
            await fake.request_reconnect()
        else:
            await fake.drop_connections(4000)
        assert fake.connected_sessions() == 0
        missed = await fake.user_sends(USER, "while away")

        async with asyncio.timeout(WAIT_S):
            await client.resumed.wait()
        message = await client.next_user_message()
        assert message.id == int(missed["id"])
        assert message.content == "while away"
        assert client.inbox.empty()  # "before" was not replayed
        assert (fake.identify_count, fake.resume_count) == (1, 1)
        assert fake.connected_sessions() == 1
        # The RESUME went to resume_gateway_url, with the same transport.
        assert [c["compress"] for c in fake.gateway_connections] == ["zlib-stream"] * 2
        assert fake.gateway_paths == ["/gateway", "/resume"]


async def test_replay_from_start_redelivers_seen_events(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        sent = await fake.user_sends(USER, "once")
        first = await client.next_user_message()
        fake.replay_from_start_on_resume = True
        await fake.request_reconnect()
        async with asyncio.timeout(WAIT_S):
            await client.resumed.wait()
        duplicate = await client.next_user_message()
        assert duplicate.id == first.id == int(sent["id"])


async def test_invalidated_session_identifies_again(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        await fake.invalidate_sessions()
        await fake.wait_for(
            lambda: fake.identify_count == 2 and fake.connected_sessions() == 1, WAIT_S
        )
        sent = await fake.user_sends(USER, "fresh session")
        assert (await client.next_user_message()).id == int(sent["id"])
        assert fake.resume_count == 0
        assert client.identify_hooks == 2


async def test_close_code_decides_whether_a_session_resumes(fake: FakeDiscord) -> None:
    identify = {"op": 2, "d": {"token": fake.token, "intents": INTENTS.value, "properties": {}}}

    async def session_closed_with(code: int) -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(fake.gateway_url + "?v=10&encoding=json") as ws,
        ):
            async with asyncio.timeout(WAIT_S):
                await ws.receive()  # HELLO
                await ws.send_str(json.dumps(identify))
                ready = json.loads((await ws.receive()).data)
                await ws.close(code=code)
        await fake.wait_for_sessions(0, WAIT_S)
        return str(ready["d"]["session_id"])

    def resume(session_id: str) -> dict[str, Any]:
        return {"op": 6, "d": {"token": fake.token, "session_id": session_id, "seq": 1}}

    # 1000 ends the session, as on Discord: RESUME is refused with op 9 false.
    ended = await session_closed_with(1000)
    refused = await raw_gateway(fake, [resume(ended)], expect=2, compress=False)
    assert refused[1] == {"op": 9, "d": False, "s": None, "t": None}
    # Any other close (discord.py's own close() sends 4000) leaves it resumable.
    kept = await session_closed_with(4000)
    resumed = await raw_gateway(fake, [resume(kept)], expect=2, compress=False)
    assert (resumed[1]["t"], resumed[1]["s"]) == ("RESUMED", 2)
    # Per socket: the first session, the refused RESUME, the second session.
    assert fake.close_codes[:3] == [1000, 1000, 4000]


async def test_another_connection_resumes_a_session_from_the_sequence_it_sends(
    fake: FakeDiscord,
) -> None:
    """What a new gateway holder does: RESUME the session a dead process left, on a socket of
    its own, and get every event after the sequence number it names."""
    async with gateway_client(fake) as client:
        await fake.user_sends(USER, "first")
        await fake.user_sends(USER, "second")
        assert [(await client.next_user_message()).content for _ in range(2)] == [
            "first",
            "second",
        ]
        assert client.ws.session_id is not None
        session_id = client.ws.session_id
        # The dispatches so far: READY (1), "first" (2), "second" (3).
        assert client.ws.sequence == 3
        await client.ws.close(code=4000)
        await fake.wait_for_sessions(0, WAIT_S)
        await client.close()
    await fake.user_sends(USER, "third")

    resume = {"op": 6, "d": {"token": fake.token, "session_id": session_id, "seq": 1}}
    frames = await raw_gateway(fake, [resume], expect=5)
    replayed = [(f["s"], f["t"], f["d"].get("content")) for f in frames[1:]]
    assert replayed == [
        (2, "MESSAGE_CREATE", "first"),
        (3, "MESSAGE_CREATE", "second"),
        (4, "MESSAGE_CREATE", "third"),
        (5, "RESUMED", None),
    ]


# -- attachments and the CDN ----------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
OGG = b"OggS\x00\x02" + bytes(range(200)) * 3


async def test_image_attachment_is_parsed_and_downloaded_by_discord_py(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        photo = fake.add_attachment(PNG, "cat photo.png", "image/png")
        await fake.user_sends(USER, "look", attachments=[photo])
        message = await client.next_user_message()

        [attachment] = message.attachments
        assert attachment.id == int(photo["id"])
        assert (attachment.filename, attachment.size, attachment.content_type) == (
            "cat photo.png",
            len(PNG),
            "image/png",
        )
        assert not attachment.is_voice_message()
        assert not message.flags.voice
        # Sent before it named a channel: its URL now names the DM, as Discord's would.
        assert attachment.url == photo["url"]
        url = yarl.URL(attachment.url)
        channel_id = fake.dm_channel(USER)
        assert url.path == f"/attachments/{channel_id}/{attachment.id}/cat photo.png"
        assert set(url.query) == {"ex", "is", "hm"}
        assert int(url.query["ex"], 16) > time.time() > int(url.query["is"], 16) - 5

        # What the adapter calls, then discord.py's own Attachment.read (url, then proxy_url).
        assert await client.http.get_from_cdn(attachment.url) == PNG
        assert await attachment.read() == PNG
        assert await attachment.read(use_cached=True) == PNG
        downloads = fake.downloads_of(attachment.id)
        assert [(d.status, d.path.startswith("/media/")) for d in downloads] == [
            (200, False),
            (200, False),
            (200, True),
        ]
        assert downloads[0].query["hm"] == url.query["hm"]
        assert fake.downloads == downloads


async def test_voice_message_is_a_voice_message_to_discord_py(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        sent = await fake.user_sends_voice(USER, OGG, duration_secs=3.5)
        message = await client.next_user_message()

        assert sent["flags"] == MESSAGE_FLAG_IS_VOICE_MESSAGE
        assert message.flags.voice
        assert message.content == ""
        [voice] = message.attachments
        assert voice.is_voice_message()
        assert (voice.filename, voice.content_type, voice.duration) == (
            "voice-message.ogg",
            "audio/ogg",
            3.5,
        )
        assert voice.waveform is not None and 0 < len(voice.waveform) <= 256
        assert await client.http.get_from_cdn(voice.url) == OGG


async def test_stickers_and_declared_size_reach_discord_py(fake: FakeDiscord) -> None:
    async with gateway_client(fake) as client:
        wave = fake.sticker("wave", format_type=4)
        huge = fake.add_attachment(b"tiny", "film.mp4", "video/mp4", declared_size=60_000_000)
        untyped = fake.add_attachment(b"\x00\x01", "blob", None)
        await fake.user_sends(USER, "", sticker_items=[wave], attachments=[huge, untyped])
        message = await client.next_user_message()

        [sticker] = message.stickers
        assert (sticker.id, sticker.name) == (int(wave["id"]), "wave")
        assert sticker.format is discord.StickerFormatType.gif
        assert [(a.size, a.content_type) for a in message.attachments] == [
            (60_000_000, "video/mp4"),
            (2, None),
        ]
        # The size is what the message says; the CDN serves what there is.
        assert await client.http.get_from_cdn(message.attachments[0].url) == b"tiny"


async def test_expired_or_tampered_urls_are_gone_from_the_cdn(fake: FakeDiscord) -> None:
    channel_id = fake.dm_channel(USER)
    stale = fake.add_attachment(PNG, "old.png", "image/png", channel_id=channel_id, expired=True)
    fresh = fake.add_attachment(PNG, "new.png", "image/png", channel_id=channel_id)
    async with rest_client(fake) as client:
        assert int(yarl.URL(stale["url"]).query["ex"], 16) < time.time()
        with pytest.raises(discord.NotFound):
            await client.http.get_from_cdn(stale["url"])

        assert await client.http.get_from_cdn(fresh["url"]) == PNG
        fake.expire(int(fresh["id"]))
        with pytest.raises(discord.NotFound):
            await client.http.get_from_cdn(fresh["url"])

    lively = fake.add_attachment(PNG, "a.png", "image/png", channel_id=channel_id)
    signed = yarl.URL(lively["url"])
    tampered = [
        signed.with_query(None),  # unsigned, as a URL trimmed of its query
        signed.update_query(hm="0" * 64),
        signed.update_query(ex=f"{int(time.time()) + 7 * 86400:x}"),  # extended by hand
        yarl.URL(lively["url"].replace(f"/{channel_id}/", "/1/")),  # another channel's
    ]
    async with aiohttp.ClientSession() as session:
        for url in tampered:
            async with session.get(url) as response:
                assert response.status == 404
                assert await response.text() == CDN_GONE
        async with session.get(signed) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "image/png"
            assert await response.read() == PNG
    statuses = [(d.attachment_id, d.status) for d in fake.downloads]
    assert statuses == [
        (int(stale["id"]), 404),
        (int(fresh["id"]), 200),
        (int(fresh["id"]), 404),
        *[(int(lively["id"]), 404)] * 4,
        (int(lively["id"]), 200),
    ]


# -- the wire, without discord.py ------------------------------------------------------------


async def raw_gateway(
    fake: FakeDiscord, sends: list[dict[str, Any]], expect: int, compress: bool = True
) -> list[dict[str, Any]]:
    """Connect, send ``sends`` after HELLO, return the first ``expect`` frames decoded."""
    query = "?v=10&encoding=json" + ("&compress=zlib-stream" if compress else "")
    inflater = zlib.decompressobj()
    frames: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(fake.gateway_url + query) as ws,
    ):
        async with asyncio.timeout(WAIT_S):
            while len(frames) < expect:
                msg = await ws.receive()
                if compress:
                    assert msg.type is aiohttp.WSMsgType.BINARY
                    assert msg.data[-4:] == b"\x00\x00\xff\xff"
                    frames.append(json.loads(inflater.decompress(msg.data)))
                else:
                    assert msg.type is aiohttp.WSMsgType.TEXT
                    frames.append(json.loads(msg.data))
                if len(frames) == 1:
                    for payload in sends:
                        await ws.send_str(json.dumps(payload))
    return frames


async def test_zlib_stream_frames_share_one_context(fake: FakeDiscord) -> None:
    identify = {"op": 2, "d": {"token": fake.token, "intents": INTENTS.value, "properties": {}}}
    hello, ack, ready = await raw_gateway(fake, [{"op": 1, "d": None}, identify], expect=3)
    assert hello == {"op": 10, "d": {"heartbeat_interval": 41250}, "s": None, "t": None}
    assert ack["op"] == 11
    assert (ready["op"], ready["t"], ready["s"]) == (0, "READY", 1)
    assert ready["d"]["v"] == 10
    assert ready["d"]["resume_gateway_url"] == fake.resume_gateway_url
    assert ready["d"]["application"]["id"] == str(fake.application_id)

    plain = await raw_gateway(fake, [], expect=1, compress=False)
    assert plain[0]["op"] == 10


async def test_gateway_rejects_a_wrong_token(fake: FakeDiscord) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(fake.gateway_url + "?v=10&encoding=json") as ws,
    ):
        async with asyncio.timeout(WAIT_S):
            await ws.receive()  # HELLO
            await ws.send_str(json.dumps({"op": 2, "d": {"token": "wrong", "intents": 0}}))
            closing = await ws.receive()
        assert closing.type is aiohttp.WSMsgType.CLOSE
        assert ws.close_code == 4004 or closing.data == 4004
    assert fake.identify_count == 0


# -- application commands and interactions ---------------------------------------------------


class Interactions(Recorder):
    """A client that hands the interactions it receives to a queue."""

    def __init__(self) -> None:
        super().__init__()
        self.interactions: asyncio.Queue[discord.Interaction] = asyncio.Queue()

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        self.interactions.put_nowait(interaction)


async def test_slash_commands_are_registered_used_in_a_dm_and_answered_once(
    fake: FakeDiscord,
) -> None:
    async with connected(fake, Interactions()) as client:
        assert client.application_id is not None
        commands: list[Any] = [
            {"name": "help", "description": "this list", "contexts": [1]},
            {
                "name": "persona",
                "description": "your instructions",
                "contexts": [1],
                "options": [{"type": 3, "name": "arguments", "description": "<text>"}],
            },
        ]
        await client.http.bulk_upsert_global_commands(client.application_id, commands)
        listed = await client.http.get_global_commands(client.application_id)
        assert [c["name"] for c in listed] == ["help", "persona"]
        # Discord's limits: a description of at most 100 characters.
        with pytest.raises(discord.HTTPException) as refused:
            too_long = [{"name": "help", "description": "x" * 101}]
            await client.http.bulk_upsert_global_commands(client.application_id, too_long)
        assert refused.value.code == 50035
        with pytest.raises(AssertionError):
            await fake.user_uses_command(USER, "weather")

        used = await fake.user_uses_command(USER, "persona", "be brief")
        async with asyncio.timeout(WAIT_S):
            interaction = await client.interactions.get()
        assert interaction.id == used and interaction.guild_id is None
        assert interaction.context.dm_channel and interaction.channel_id == fake.dm_channel(USER)
        assert interaction.data is not None and interaction.data.get("options") == [
            {"name": "arguments", "type": 3, "value": "be brief"}
        ]
        await interaction.response.send_message("noted", ephemeral=True)
        # A second answer is refused; an ephemeral one is no message in the channel.
        url = f"{fake.api_url}/interactions/{used}/{interaction.token}/callback"
        again = {"type": 4, "data": {"content": "again"}}
        async with aiohttp.ClientSession() as session, session.post(url, json=again) as r:
            assert r.status == 400 and (await r.json())["code"] == 40060
        assert [status for status, _ in fake.interactions[used].answers] == [200, 400]
        assert fake.messages(fake.dm_channel(USER)) == []

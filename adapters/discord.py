"""Discord, on discord.py (v2): direct messages in, replies out, from any number of replicas.

Discord delivers DMs over one gateway connection per bot (shard 0), so the replicas elect one
gateway holder with the core's role lease; if it dies, another connects within the lease TTL.
Every replica logs in over REST only, which is all it needs to send replies and typing
indicators for the conversations whose cycles it runs.

The gateway has no acknowledgement to hold back, so what it delivers is queued in arrival
order and stored by one task, retried while the store is down. Three things keep a DM from
being lost or answered twice:

- a RESUME may replay `MESSAGE_CREATE`s already seen: the core drops a repeated message id;
- a gap with no gateway (a failover, a restart) delivers nothing sent meanwhile: on each new
  session the holder reads the history of recently active DM channels after the last message
  it took in, and their live messages wait until it has, so the gap is stored first;
- a reply part re-sent after a crash carries the same `nonce` with `enforce_nonce`, so Discord
  returns the first copy instead of posting a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from functools import partial
from typing import Any

import discord
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from adapters.base import Sink, describe, until_stored
from bot.cancel import cancel_and_wait
from bot.message import Attachment, InboundMessage, Unavailable
from bot.settings import ConfigError, DiscordSettings

log = logging.getLogger(__name__)

PLATFORM = "discord"
GATEWAY_ROLE = "discord:gateway"
# DMs and their text, nothing else: no guild events, no presences, no member lists. Message
# content is a privileged intent: it must be switched on in the Developer Portal.
INTENTS = discord.Intents.none()
INTENTS.dm_messages = True
INTENTS.message_content = True
# discord.py waits this long for guilds to stream in before `on_ready`; a DM bot has none.
GUILD_READY_TIMEOUT_S = 0.2
# A 429 longer than this fails the send instead of holding the conversation's lease for it;
# the core retries the cycle later, and the nonce keeps the retry from posting twice.
MAX_RATE_LIMIT_WAIT_S = 60.0
# Discord refuses a nonce longer than this.
NONCE_CHARS = 25
# At most this many missed DMs are read back per conversation after a gateway gap.
CATCH_UP_LIMIT = 200
# The error code for "Cannot send messages to this user" (DMs closed, or no shared server).
CANNOT_DM = 50007
# Message types that carry what a user wrote; the rest are system notices (pins, calls...).
USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


def nonce(idempotency_key: str) -> str:
    """A short, stable nonce for one reply part: the same part re-sent gets the same one."""
    return hashlib.blake2b(idempotency_key.encode(), digest_size=12).hexdigest()[:NONCE_CHARS]


def normalize(message: discord.Message, me: int, *, edited: bool = False) -> InboundMessage | None:
    """The platform-free message for a user's DM; None for the rest (guilds, bots, ourselves,
    system messages), which are ignored."""
    # A message from a guild the bot has no cache of has no `guild` either, only a partial
    # channel of unknown type: the channel type is what tells a DM.
    if message.guild is not None or message.channel.type is not discord.ChannelType.private:
        return None
    author = message.author
    if author.bot or author.id == me or message.type not in USER_MESSAGE_TYPES:
        return None
    message_id = str(message.id)
    text = message.content
    if edited:
        if message.edited_at is None:
            # Discord also sends updates for link previews resolving: not an edit.
            return None
        # An edit is new input; its id differs per edit so dedupe keeps each one.
        message_id = f"{message.id}:edit:{int(message.edited_at.timestamp() * 1000)}"
        text = f"(edited) {text}"
    reference = message.reference
    return InboundMessage(
        platform=PLATFORM,
        chat_id=str(message.channel.id),
        user_id=str(author.id),
        display_name=author.display_name,
        message_id=message_id,
        text=text,
        timestamp=message.created_at.timestamp(),
        reply_to_id=str(reference.message_id) if reference and reference.message_id else None,
        attachments=_attachments(message),
        is_dm=True,
    )


def _attachments(message: discord.Message) -> tuple[Attachment, ...]:
    found = [Attachment(_kind(item), item.url) for item in message.attachments]
    found += [Attachment("sticker", sticker.name) for sticker in message.stickers]
    return tuple(found)


def _kind(attachment: discord.Attachment) -> str:
    if attachment.is_voice_message():
        return "voice"
    major = (attachment.content_type or "").split("/", 1)[0]
    return {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")


def _channel_id(conversation: str) -> int:
    return int(conversation.split(":", 1)[1])


def _point_at(settings: DiscordSettings) -> None:
    """Aim discord.py at the configured REST base and gateway.

    discord.py reads both from class attributes and offers no per-client option; one process
    serves one Discord bot, so setting them for the process is what is meant.
    """
    Route.BASE = settings.api_url.rstrip("/")
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.gateway_url)


class DiscordAdapter:
    platform = PLATFORM
    max_message_chars = 2000
    # Discord shows "typing" for about 10 s after each call.
    typing_interval_s = 8.0

    def __init__(self, settings: DiscordSettings) -> None:
        assert settings.token is not None  # the settings refuse discord without a token
        self.settings = settings
        self._token = settings.token.get_secret_value()
        _point_at(settings)
        self.rest = discord.Client(intents=INTENTS, max_ratelimit_timeout=MAX_RATE_LIMIT_WAIT_S)
        self._logged_in = asyncio.Event()
        # Channels whose user does not take DMs from the bot; told once, skipped until they
        # write again.
        self._closed: set[int] = set()
        # The gateway connection, while this replica holds it.
        self._gateway: _Gateway | None = None

    def connected(self) -> bool:
        gateway = self._gateway
        if gateway is not None and not gateway.is_ready():
            return False
        return self._logged_in.is_set()

    async def run(self, sink: Sink) -> None:
        try:
            await _login(self.rest, self._token)
            self._logged_in.set()
            assert self.rest.user is not None
            log.info("logged in to Discord as %s (id %s)", self.rest.user, self.rest.user.id)
            await sink.run_exclusively(GATEWAY_ROLE, lambda: self._listen(sink))
        finally:
            self._logged_in.clear()
            await self.rest.close()

    # Receiving

    async def _listen(self, sink: Sink) -> None:
        """Hold the gateway: runs on one replica at a time, restarted on another if it dies."""
        gateway = _Gateway(sink, self.settings.catch_up_minutes)
        deliver = asyncio.create_task(self._deliver(sink, gateway.inbox), name="discord inbox")
        self._gateway = gateway
        try:
            await _login(gateway, self._token)
            log.info("this replica holds the Discord gateway")
            # Reconnects and RESUMEs by itself; returns only once the client is closed.
            await gateway.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            raise ConfigError(
                "LASTWORD_DISCORD__TOKEN: this bot may not read message content; turn on "
                "Bot → Privileged Gateway Intents → Message Content Intent in the Discord "
                "Developer Portal"
            ) from None
        finally:
            # Whatever is still queued is in the DM history, for the next holder's catch-up.
            self._gateway = None
            await cancel_and_wait(deliver)
            await gateway.close()

    async def _deliver(self, sink: Sink, inbox: asyncio.Queue[InboundMessage]) -> None:
        """Store what the gateway delivered, one at a time, in arrival order: one writer, so
        a message is never stored ahead of one that came before it."""
        while True:
            message = await inbox.get()
            await until_stored(partial(self._take, sink, message), describe(message))

    async def _take(self, sink: Sink, message: InboundMessage) -> None:
        # A user who writes again may have opened their DMs.
        self._closed.discard(int(message.chat_id))
        await sink.ingest(message)

    # Sending

    async def send(self, conversation: str, text: str, idempotency_key: str) -> None:
        await self._logged_in.wait()
        channel_id = _channel_id(conversation)
        if channel_id in self._closed:
            return
        channel = self.rest.get_partial_messageable(channel_id, type=discord.ChannelType.private)
        try:
            # discord.py waits out a 429 itself; the core keeps the lease renewed meanwhile.
            await channel.send(
                text,
                nonce=nonce(idempotency_key),
                allowed_mentions=discord.AllowedMentions.none(),
            )
        except discord.Forbidden as exc:
            if exc.code != CANNOT_DM:
                raise
            # Nothing can be delivered: count it as delivered, so the conversation moves on.
            self._closed.add(channel_id)
            log.warning("%s does not accept DMs from the bot; dropping replies to it", conversation)

    async def typing(self, conversation: str) -> None:
        await self._logged_in.wait()
        channel_id = _channel_id(conversation)
        if channel_id not in self._closed:
            await self.rest.http.send_typing(channel_id)


async def _login(client: discord.Client, token: str) -> None:
    try:
        await client.login(token)
    except discord.LoginFailure:
        raise ConfigError("LASTWORD_DISCORD__TOKEN: Discord refused the bot token") from None


class _Gateway(discord.Client):
    """The gateway connection: queues the DMs it receives, and catches up on each new session."""

    def __init__(self, sink: Sink, catch_up_minutes: int) -> None:
        super().__init__(
            intents=INTENTS,
            guild_ready_timeout=GUILD_READY_TIMEOUT_S,
            # Edits arrive raw; nothing here reads the message cache.
            max_messages=None,
        )
        self.sink = sink
        self.catch_up_minutes = catch_up_minutes
        self.inbox: asyncio.Queue[InboundMessage] = asyncio.Queue()
        # While a catch-up runs, live messages of the conversations whose history it has yet
        # to read wait here, so that none is stored ahead of an older one from the gap. None:
        # no catch-up; `_unread` None: which conversations it reads is not known yet (all wait).
        self._held: list[InboundMessage] | None = None
        self._unread: set[str] | None = None
        # A session that ends during its catch-up starts another: one at a time.
        self._catching_up = asyncio.Lock()

    def _normalize(
        self, message: discord.Message, *, edited: bool = False
    ) -> InboundMessage | None:
        assert self.user is not None
        return normalize(message, self.user.id, edited=edited)

    def _live(self, message: discord.Message, *, edited: bool = False) -> None:
        # Synchronous: discord.py runs each handler as its own task, in arrival order, and
        # queueing before any await keeps that order.
        found = self._normalize(message, edited=edited)
        if found is None:
            return
        if self._held is not None and self._waits(found):
            self._held.append(found)
        else:
            self.inbox.put_nowait(found)

    def _waits(self, message: InboundMessage) -> bool:
        """Whether a live message must wait for the catch-up to read its conversation first."""
        return self._unread is None or message.conversation in self._unread

    def _release(self, read: str | None = None) -> None:
        """Queue the held messages that need wait no longer: those of conversation `read`
        (its history is queued), of conversations the catch-up does not read, or, with
        nothing left to read, all of them; in arrival order."""
        if self._held is None:
            return
        if read is not None and self._unread is not None:
            self._unread.discard(read)
        waiting = []
        for message in self._held:
            if self._waits(message):
                waiting.append(message)
            else:
                self.inbox.put_nowait(message)
        self._held = waiting

    async def on_message(self, message: discord.Message) -> None:
        self._live(message)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        self._live(payload.message, edited=True)

    async def on_ready(self) -> None:
        # A new session, not a RESUME: nothing sent while none was open was delivered.
        await self.catch_up()

    async def catch_up(self) -> None:
        """Take in DMs sent while no replica held the gateway: for each recently active
        conversation, its history after the last message taken in. Any already taken in
        are dropped by the core's dedupe."""
        if not self.catch_up_minutes:
            return
        async with self._catching_up:
            self._held, self._unread = [], None
            try:
                await self._read_gap()
            finally:
                self._unread = set()
                self._release()
                self._held = None

    async def _read_gap(self) -> None:
        try:
            recent = await self.sink.recent(PLATFORM, self.catch_up_minutes * 60)
        except Unavailable as exc:
            log.warning("cannot read recent conversations for the catch-up: %s", exc)
            return
        self._unread = set(recent)
        self._release()
        found = 0
        for conversation, last in recent.items():
            channel = self.get_partial_messageable(
                _channel_id(conversation), type=discord.ChannelType.private
            )
            # An edit's id is "<message id>:edit:<when>"; history is read by message id.
            after = discord.Object(int(last.split(":", 1)[0]))
            try:
                async for item in channel.history(
                    limit=CATCH_UP_LIMIT, after=after, oldest_first=True
                ):
                    if (message := self._normalize(item)) is not None:
                        self.inbox.put_nowait(message)
                        found += 1
            except discord.HTTPException as exc:
                log.warning("cannot read the history of %s: %s", conversation, exc)
            self._release(read=conversation)
        log.info("catch-up: %d conversations read, %d messages found", len(recent), found)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("error in the Discord %s handler", event_method)

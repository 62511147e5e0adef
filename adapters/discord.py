"""Discord, on discord.py (v2): direct messages in, replies out, from any number of replicas.

Discord delivers DMs over one gateway connection per bot (shard 0), so the replicas elect one
gateway holder with the core's role lease; if it dies, another connects within the lease TTL.
Every replica logs in over REST only, which is all it needs to send replies and typing
indicators for the conversations whose cycles it runs.

The gateway has no acknowledgement to hold back, so what it delivers is queued in arrival
order and stored by one task, retried while the store is down. What keeps a DM from being lost
or answered twice:

- the holder keeps its gateway session in the store as it goes: the session id, the resume
  URL, and the sequence number of the last event whose DM is stored (never past one that is
  not). The next holder, after a crash, a hand-over or a restart, RESUMEs that session, and
  Discord replays every event since that number, including DMs sent while no replica was
  connected, from any user;
- a replay repeats `MESSAGE_CREATE`s already stored: the core drops a repeated message id;
- a holder stopped on purpose (SIGTERM, a lost role) first closes its connection without
  ending the session (close code 4000: Discord ends a session closed with 1000 or 1001), then
  stores what it has queued, within the core's hand-over time;
- when Discord refuses the RESUME (the session expired), the holder starts a new session and
  catches up: for each recently active conversation, it reads the history after the last
  message it took in. Live DMs wait from the moment the new session is asked for until the
  catch-up has read their conversation, so the gap is stored first;
- a RESUME that fails (its address unreachable, or the socket closed before Discord said
  RESUMED) is tried again, by the same holder, `RESUME_ATTEMPTS` times in a row at most, then
  the session is dropped and a new one asked for, which catches up; a close code with which
  Discord says the session is over gives it up at once. One line says so, no traceback;
- the queue in memory is capped: beyond the cap, newer DMs are dropped from memory, and the
  sequence kept in the store stays before them; once the queue is stored, the holder reconnects
  and RESUMEs from there, so Discord delivers them again;
- a reply part re-sent after a crash carries the same `nonce` with `enforce_nonce`, so Discord
  returns the first copy instead of posting a second.

The commands are in Discord's `/` menu: at start, every replica registers the registry's
commands for everyone (`/help` without the admin part: Discord cannot show a command to some
users of a DM and not others, and admins type theirs) as global application commands usable in
the bot's DMs (a PUT that replaces the whole list, so doing it twice is harmless; retried a few
times, backed off, never stopping the bot). A use of one arrives at the gateway holder as an
interaction, and becomes the "/name arguments" message typing it would have made, taken in
like any DM (its id is the interaction's, so a replay is dropped). Once it is stored, the
interaction is answered at once with a short ephemeral note, which only its user sees and
Discord forgets; the command's answer comes as an ordinary DM like every reply, from whichever
replica runs the cycle (an interaction's follow-up could only come through its token, which
only the holder has, and only for 15 minutes). Typed commands work as in any chat.

Send errors are classified for the core: a user who does not take DMs from the bot is
`Unreachable`; a request Discord rejects (unknown channel, missing access, any other 4xx but a
429) is a permanent `SendFailed`; a 5xx or a network error is a transient one; a rate limit
longer than `MAX_RATE_LIMIT_WAIT_S` is `Throttled`, and the reply waits in its outbox while the
core holds what the 429 was about. A reply whose message reference Discord refuses goes out
without it (`adapters.base.replying`).

A 429 holds what Discord says it is about (`_scope_of_429`): the whole bot for its global
limit, one channel for a channel's messages, the previews for a typing indicator, and nothing
for any other route (the command menu's), whose limit no reply shares.

In a server's channel (groups on), a mention of the bot or of the role Discord made for it
addresses the bot; another bot's post and a webhook's (whose author is whoever holds its URL)
are the room's context only, never answered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Self, TypeVar

import aiohttp
import discord
import discord.client
import yarl
from discord.gateway import DiscordWebSocket, ReconnectWebSocket
from discord.http import Route
from pydantic import BaseModel, Field

from adapters import Platform
from adapters.base import (
    Identity,
    Sink,
    describe,
    register_menu,
    replying,
    until_stored,
)
from bot import log_lines
from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.config.credentials import Credential
from bot.config.settings import ConfigError, RequiredSecret, Settings, WebSocketUrl, WebUrl
from bot.message import (
    BOT_SCOPE,
    PREVIEWS_SCOPE,
    Attachment,
    Call,
    FetchFailed,
    InboundMessage,
    MenuEntry,
    Place,
    Quote,
    Scope,
    SendFailed,
    Throttled,
    Unavailable,
    Unreachable,
    edited_id,
    platform_id,
)
from bot.ops.check import Check, guarded

log = logging.getLogger(__name__)

AnyClient = TypeVar("AnyClient", bound=discord.Client)

# discord.py logs every request and gateway event at INFO, and warns at every start about
# voice and the guilds intent, which a DM bot never uses.
log_lines.quiet("discord.http", "discord.gateway")
log_lines.irrelevant("discord.client", "voice will NOT be supported")
log_lines.irrelevant("discord.state", "Guilds intent seems to be disabled")


class DiscordSettings(BaseModel):
    """`LASTWORD_DISCORD__*`, the `[discord]` table: read when the platform is discord."""

    token: RequiredSecret = Field(
        description="the bot token from the Developer Portal; required for `discord`"
    )
    api_url: WebUrl = Field(
        default="https://discord.com/api/v10",
        description=(
            "the base URL of Discord's REST API, through which replies are sent and history "
            "read (tests point it at a fake)"
        ),
    )
    gateway_url: WebSocketUrl = Field(
        default="wss://gateway.discord.gg",
        description=(
            "the websocket URL of Discord's gateway, `wss://`, where incoming messages and "
            "typing arrive (tests point it at a fake)"
        ),
    )
    catch_up_minutes: int = Field(
        default=60,
        ge=0,
        le=60,
        description=(
            "after a gateway gap, read back the DMs of conversations active this recently "
            "(`0`: off)"
        ),
    )
    # Discord's limits for one bot, shared by every replica.
    requests_per_second: int = Field(
        default=50,
        ge=1,
        le=10_000,
        description=(
            "Discord's bot-wide limit: requests a second over all routes, shared by every replica"
        ),
    )
    channel_messages_per_5s: int = Field(
        default=5,
        ge=1,
        le=1000,
        description="Discord's per-channel limit: messages per 5 s in one channel",
    )


PLATFORM = "discord"
GATEWAY_ROLE = "discord:gateway"
# Where the holder keeps its gateway session for the next holder to resume.
SESSION_KEY = "discord:gateway:session"
# Kept this long after its last update: long after Discord would still resume it, so a holder
# that died is always followed by a RESUME attempt, never by a session known to nobody.
SESSION_TTL_S = 900.0
# How often the kept sequence is moved forward while it changes; kept behind, it only makes
# the next holder's replay longer.
KEEP_EVERY_S = 1.0
# Close code of a hand-over: anything but 1000 and 1001 leaves the session resumable.
RESUMABLE_CLOSE = 4000
# DMs held in memory, received but not stored (the store is down): beyond this, newer ones are
# dropped from memory and come back by a RESUME once the queue is stored.
INBOX_CAP = 10_000
# Backoff while the store cannot say which session to resume, or which conversations to
# catch up on.
RETRY_FIRST_S = 0.2
RETRY_CAP_S = 5.0
# RESUMEs that fail in a row (the resume address unreachable, or the socket closed before
# Discord said RESUMED) before the session is dropped and a new one asked for. Resuming is
# worth a second and third try: it replays everything since the kept sequence (a guild's
# messages too, which no catch-up reads, and DMs past the catch-up's bounds), and a resume
# host restarting or a network blip passes within seconds. More is not: Discord keeps a
# session resumable only briefly, nothing is received meanwhile, and a new session's
# catch-up reads the DMs sent in the gap. Three tries, 1 and 2 s apart, each bounded by
# `RESUME_CONNECT_TIMEOUT_S`, give up within about half a minute at worst.
RESUME_ATTEMPTS = 3
RESUME_RETRY_FIRST_S = 1.0
RESUME_RETRY_CAP_S = 4.0
# A RESUME's connection, up to Discord's HELLO (sub-second when it answers), is given this
# long: discord.py allows a connection a minute, three of which would hold up every DM.
RESUME_CONNECT_TIMEOUT_S = 10.0
# Close codes with which Discord says a session cannot be resumed and a new one is needed
# (invalid sequence, session timed out): no second try.
SESSION_OVER_CLOSES = frozenset({4007, 4009})
# DMs and their text, nothing else: no guild events, no presences, no member lists. Message
# content is a privileged intent: it must be switched on in the Developer Portal.
INTENTS = discord.Intents.none()
INTENTS.dm_messages = True
INTENTS.message_content = True
# With groups on (LASTWORD_GROUPS__ALLOWED set), guilds' messages too, and the guilds
# themselves, so a message's channel or thread is known.
GROUP_INTENTS = discord.Intents(**(dict(INTENTS) | {"guilds": True, "guild_messages": True}))
# With typing on (LASTWORD_DEBOUNCE__TYPING_MS above 0), `TYPING_START` in DMs: what holds a
# user's window open while they write (not privileged).
TYPING_INTENTS = discord.Intents(dm_typing=True)
# Typing signals are queued only while fewer than this many DMs and signals wait: a store
# slow to take DMs in gets no typing on top.
TYPING_QUEUED_CAP = 100
# discord.py waits this long for guilds to stream in before `on_ready`; a DM bot has none.
GUILD_READY_TIMEOUT_S = 0.2
# A 429 longer than this is not waited out inside the call but handed to the core as
# `Throttled`, which holds its scope for every replica while the reply waits in its outbox;
# the nonce keeps the later send from posting twice.
MAX_RATE_LIMIT_WAIT_S = 60.0
# Users' files come from Discord's CDN through a session of their own, this many connections
# at once (more wait their turn, within media.fetch_timeout_s): the REST session that replies
# go out through has no limit, so downloads there would be unbounded.
DOWNLOAD_CONNECTIONS = 8
DOWNLOAD_CHUNK_BYTES = 64 * 1024
# Discord refuses a nonce longer than this.
NONCE_CHARS = 25
# At most this many missed DMs are read back per conversation after a gateway gap.
CATCH_UP_LIMIT = 200
# The error code for "Cannot send messages to this user" (DMs closed, or no shared server).
CANNOT_DM = 50007
# Message types that carry what a user wrote; the rest are system notices (pins, calls...).
USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
# The gateway's close code for a token it does not accept (revoked while connected).
CLOSE_AUTHENTICATION_FAILED = 4004
# A token Discord refuses while running is tried again after this long, doubling up to the
# cap: it may be given back, but asking more often changes nothing.
REFUSED_RETRY_FIRST_S = 2.0
REFUSED_RETRY_CAP_S = 60.0
# What the invite link asks for in a server: to see its channels, to answer in them and their
# threads, and to read their history (a reply to a message needs it). DMs need none of it.
INVITE_PERMISSIONS = discord.Permissions(
    view_channel=True,
    send_messages=True,
    send_messages_in_threads=True,
    read_message_history=True,
)
INVITE_SCOPES = ("bot", "applications.commands")
# Discord's limit on a command's and an option's description.
COMMAND_DESCRIPTION_CHARS = 100
# The one option of a command that takes arguments: what follows "/name" when typed.
ARGUMENTS_OPTION = "arguments"
# What a slash command's user sees at once (ephemeral) while its answer is worked out.
ACKNOWLEDGED = "On it: my answer follows as a message."
# Discord waits 3 s for an interaction's answer; one later than that is refused anyway.
ACKNOWLEDGE_TIMEOUT_S = 3.0
TOKEN_SETTING = "LASTWORD_DISCORD__TOKEN"
# The routes whose 429s hold one of our scopes (what follows the API's base).
MESSAGES_ROUTE = re.compile(r".*/channels/(\d+)/messages")
TYPING_ROUTE = re.compile(r".*/channels/(\d+)/typing")
# The scope of the last 429 heard (`_heard`) by the call under way: aiohttp runs its trace
# hooks in the task that makes the request, so the send or typing call that discord.py gives
# up on reads here what Discord said that 429 was about.
HEARD_SCOPE: ContextVar[str | None] = ContextVar("discord_heard_scope", default=None)
TOKEN_FIX = f"copy the bot token from the Developer Portal (Bot > Reset Token) into {TOKEN_SETTING}"


def nonce(idempotency_key: str) -> str:
    """A short, stable nonce for one reply part: the same part re-sent gets the same one."""
    return hashlib.blake2b(idempotency_key.encode(), digest_size=12).hexdigest()[:NONCE_CHARS]


def normalize(message: discord.Message, me: int, *, edited: bool = False) -> InboundMessage | None:
    """The platform-free message for a user's DM or a message in a guild's text channel or
    thread; None for the rest (bots in DMs, ourselves, system messages), which are ignored."""
    # A message from a guild the bot has no cache of has no `guild` either, only a partial
    # channel of unknown type: the channel type is what tells a DM.
    group = message.guild is not None
    if not group and message.channel.type is not discord.ChannelType.private:
        return None
    author = message.author
    if (author.bot and not group) or author.id == me or message.type not in USER_MESSAGE_TYPES:
        return None
    message_id = str(message.id)
    # In a group, mentions read as "@name" rather than "<@123>".
    text = message.clean_content if group else message.content
    if edited:
        if message.edited_at is None:
            # Discord also sends updates for link previews resolving: not an edit.
            return None
        # An edit is new input; its id differs per edit so dedupe keeps each one.
        message_id = edited_id(message_id, str(int(message.edited_at.timestamp() * 1000)))
        text = f"(edited) {text}"
    reference = message.reference
    replied = reference.resolved if reference else None
    replied = replied if isinstance(replied, discord.Message) else None
    # A webhook's post is no person's: anyone with its URL posts under any name, and what
    # posts through them (feeds, alerts, other bots) would talk to the bot for ever. Like
    # another bot's line, it is the room's context, never answered.
    person = not author.bot and message.webhook_id is None
    # A thread is a channel of its own: its conversations and room are the thread's.
    place = Place(PLATFORM, str(message.channel.id), str(author.id), group=group)
    return InboundMessage.at(
        place,
        message_id,
        text,
        display_name=author.display_name,
        timestamp=message.created_at.timestamp(),
        reply_to_id=str(reference.message_id) if reference and reference.message_id else None,
        attachments=_attachments(message),
        mentioned=group
        and (
            any(user.id == me for user in message.mentions)
            # The role Discord made for the bot, which the member list offers beside it.
            or any(
                role.tags is not None and role.tags.bot_id == me for role in message.role_mentions
            )
            or (replied is not None and replied.author.id == me)
        ),
        from_bot=not person,
        quoted=_quoted(replied, me) if group and replied is not None else None,
    )


def _quoted(replied: discord.Message, me: int) -> Quote:
    """The message a group message replies to, as Discord resolved it with the reply."""
    labels = [a.label() for a in _attachments(replied)]
    said = " ".join([replied.clean_content, *labels]).strip()
    return Quote(replied.author.display_name, said, replied.author.id == me)


def interaction_message(interaction: discord.Interaction) -> InboundMessage | None:
    """The "/name arguments" message a slash command used in the bot's DM stands for, as
    typing it would have made it; None for any other interaction (a guild's, a button's)."""
    data: Any = interaction.data
    if (
        interaction.type is not discord.InteractionType.application_command
        or interaction.guild_id is not None
        or not interaction.context.dm_channel
        or interaction.channel_id is None
        or not isinstance(data, dict)
        or not isinstance(data.get("name"), str)
    ):
        return None
    words = [
        str(option.get("value", ""))
        for option in data.get("options") or []
        if option.get("name") == ARGUMENTS_OPTION
    ]
    user = interaction.user
    return InboundMessage(
        platform=PLATFORM,
        chat_id=str(interaction.channel_id),
        user_id=str(user.id),
        display_name=user.display_name,
        # A snowflake like a message's: the catch-up reads the history after it.
        message_id=str(interaction.id),
        text=" ".join([f"/{data['name']}", *words]).strip(),
        timestamp=interaction.created_at.timestamp(),
        is_dm=True,
    )


def application_commands(entries: tuple[MenuEntry, ...]) -> list[dict[str, Any]]:
    """The menu as Discord's global application commands: slash commands usable in the bot's
    DMs, one optional text option for a command that takes arguments."""
    return [
        {
            "name": entry.name,
            "description": entry.description(COMMAND_DESCRIPTION_CHARS),
            "type": discord.AppCommandType.chat_input.value,
            "contexts": discord.app_commands.AppCommandContext(dm_channel=True).to_array(),
            "integration_types": discord.app_commands.AppInstallationType(guild=True).to_array(),
            "options": [
                {
                    "type": discord.AppCommandOptionType.string.value,
                    "name": ARGUMENTS_OPTION,
                    "description": entry.arguments[:COMMAND_DESCRIPTION_CHARS],
                    "required": False,
                }
            ]
            if entry.arguments
            else [],
        }
        for entry in entries
    ]


def _rate_limit_wait(exc: Exception) -> float | None:
    return exc.retry_after if isinstance(exc, discord.RateLimited) else None


def _attachments(message: discord.Message) -> tuple[Attachment, ...]:
    """References to the message's files: their signed CDN URLs, fetched by whichever
    replica answers (they expire; an expired one is a failed download). Discord shows the
    text first, then the attachments."""
    found = [
        Attachment(
            _kind(item),
            item.url,
            mime=item.content_type or "",
            size=item.size,
            name=item.filename,
            file_key=str(item.id),
            text_first=True,
        )
        for item in message.attachments
    ]
    found += [
        Attachment("sticker", str(s.id), name=s.name, text_first=True) for s in message.stickers
    ]
    return tuple(found)


def _kind(attachment: discord.Attachment) -> str:
    if attachment.is_voice_message():
        return "voice"
    major = (attachment.content_type or "").split("/", 1)[0]
    return {"image": "photo", "audio": "audio", "video": "video"}.get(major, "document")


def _channel_id(conversation: str) -> int:
    return int(Place.of(conversation).chat)


def _point_at(settings: DiscordSettings) -> None:
    """Aim discord.py at the configured REST base and gateway, and have it open a gateway
    holder's first connection with RESUME when there is a session to take over.

    discord.py reads all of these from module and class attributes and offers no per-client
    option; one process serves one Discord bot, so setting them for the process is what is
    meant.
    """
    Route.BASE = settings.api_url.rstrip("/")
    DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(settings.gateway_url)
    discord.client.DiscordWebSocket = _GatewaySocket  # type: ignore[misc]


def _verdict(conversation: str, exc: discord.HTTPException) -> SendFailed:
    """What a refused send means for the core."""
    if exc.code == CANNOT_DM:
        return Unreachable(f"{conversation} does not accept DMs from the bot: {exc}")
    # A 429 here is Cloudflare's (discord.py waits out Discord's own): it passes.
    permanent = 400 <= exc.status < 500 and exc.status != 429
    return SendFailed(f"Discord refused a reply part to {conversation}: {exc}", permanent=permanent)


class DiscordAdapter:
    platform = PLATFORM
    max_message_chars = 2000
    # Discord shows "typing" for about 10 s after each call.
    typing_interval_s = 8.0

    def __init__(
        self, settings: DiscordSettings, *, groups: bool = False, typing: bool = False
    ) -> None:
        self.settings = settings
        # Whether to listen in guilds (LASTWORD_GROUPS__ALLOWED is set): a bot that answers
        # DMs only is not sent every guild's messages.
        self.groups = groups
        # Whether to be told when a user types in a DM (`bot.message.SeesTyping`).
        self.dm_typing = typing
        self._token = settings.token.get_secret_value()
        _point_at(settings)
        self.rest = self._rest_client()
        # Set by `run`: where a 429 discord.py waited out is told.
        self._sink: Sink | None = None
        self._news: set[asyncio.Task[None]] = set()
        self._logged_in = asyncio.Event()
        # The gateway connection, while this replica holds it.
        self._gateway: _Gateway | None = None
        # Made on the first download (a session needs the running loop).
        self._downloads: aiohttp.ClientSession | None = None
        self.token = Credential(TOKEN_SETTING, "Discord")

    def connected(self) -> bool:
        gateway = self._gateway
        if gateway is not None and not gateway.live():
            return False
        return self._logged_in.is_set() and self.token.reason is None

    def refused(self) -> str | None:
        return self.token.reason

    def identity(self) -> Identity | None:
        """The bot's name and id, and the link that invites it to a server (its application
        id, read by the login): who shares a server with the bot can DM it."""
        user = self.rest.user
        application = self.rest.application_id
        if user is None or application is None:
            return None
        invite = discord.utils.oauth_url(
            application, permissions=INVITE_PERMISSIONS, scopes=INVITE_SCOPES
        )
        return Identity(
            f"{user} (id {user.id}) on Discord",
            f"invite it to a server with {invite}, then message it there",
        )

    def sees_typing(self, place: Place) -> bool:
        # Guild typing would need an intent that sends every guild member's typing.
        return self.dm_typing and not place.group

    def _api_url(self) -> str:
        return self.settings.api_url.rstrip("/")

    async def login(self) -> None:
        """The REST login (GET /users/@me): a refused token is a `ConfigError`."""
        try:
            await self.rest.login(self._token)
        except discord.LoginFailure:
            await self.rest.close()
            raise ConfigError(
                f"{TOKEN_SETTING}: Discord refused the bot token (GET /users/@me at "
                f"{self._api_url()}): {TOKEN_FIX}"
            ) from None
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            # Its session closed, as after any failed run: `run` logs in afresh.
            await self.rest.close()
            log.warning(
                "cannot reach Discord at %s to check the token (%s); starting anyway",
                self._api_url(),
                type(exc).__name__,
            )
            return
        self.token.accepted()
        self._logged_in.set()

    async def _log_in(self, make: Callable[[], AnyClient]) -> AnyClient:
        """A client from `make`, logged in, waiting out a token refused since start-up
        (backed off, one ERROR line a minute): it may be given back.

        Each attempt has a client of its own, closed if the login fails: discord.py opens a
        session at every login and leaves a refused one's open, and a closed client can never
        log in again (its connector is closed with it)."""
        backoff = Backoff(REFUSED_RETRY_FIRST_S, REFUSED_RETRY_CAP_S)
        while True:
            client = make()
            try:
                await client.login(self._token)
            except discord.LoginFailure:
                await client.close()
                self.token.refused(f"GET /users/@me at {self._api_url()}", TOKEN_FIX)
            except BaseException:
                await client.close()
                raise
            else:
                self.token.accepted()
                return client
            await asyncio.sleep(backoff.next_delay())

    async def run(self, sink: Sink) -> None:
        registering: asyncio.Task[bool] | None = None
        self._sink = sink
        try:
            if not self._logged_in.is_set():
                # Not logged in, so closed (by a failed login or run) or never used: a new one.
                self.rest = await self._log_in(self._rest_client)
                self._logged_in.set()
            assert self.rest.user is not None
            log.info("logged in to Discord as %s (id %s)", self.rest.user, self.rest.user.id)
            # Beside receiving: a menu Discord is slow to take must not hold up messages.
            registering = asyncio.create_task(
                register_menu(PLATFORM, partial(self._set_menu, sink), _rate_limit_wait),
                name="discord menu",
            )
            await sink.run_exclusively(GATEWAY_ROLE, lambda: self._listen(sink))
        finally:
            if registering is not None:
                await cancel_and_wait(registering)
            self._logged_in.clear()
            await self.rest.close()
            if self._downloads is not None:
                await self._downloads.close()

    async def _set_menu(self, sink: Sink) -> None:
        # The login read the application's id (GET /oauth2/applications/@me).
        application = self.rest.application_id
        assert application is not None
        commands = application_commands(sink.menu())
        await self.rest.http.bulk_upsert_global_commands(application, commands)

    # Receiving

    async def _listen(self, sink: Sink) -> None:
        """Hold the gateway: runs on one replica at a time, restarted on another if it dies."""
        log.info("this replica holds the Discord gateway")
        # Between rounds whose gateway refused the token: the REST login may still pass.
        refusals = Backoff(REFUSED_RETRY_FIRST_S, REFUSED_RETRY_CAP_S)
        # Between RESUMEs that failed in a row; its count says when to give the session up.
        resumes = Backoff(RESUME_RETRY_FIRST_S, RESUME_RETRY_CAP_S)
        # The kept session is given up: the next connection asks for a new one.
        fresh = False
        while True:
            intents = GROUP_INTENTS if self.groups else INTENTS
            if self.dm_typing:
                intents = intents | TYPING_INTENTS
            gateway = await self._log_in(
                partial(_Gateway, sink, self.settings.catch_up_minutes, intents)
            )
            self._gateway = gateway
            refused = False
            retry_in: float | None = None
            try:
                gateway.take_over(None if fresh else await _recall(sink))
                fresh = False
                await gateway.hold()
                return
            except _ResumeFailed as exc:
                if gateway.was_live:
                    # A session was open since the last failure: this one starts a new run.
                    resumes.reset()
                retry_in = await _resume_failed(sink, resumes, exc)
                fresh = retry_in is None
            except _Overflowed as exc:
                log.warning("%s; resuming the Discord session to receive them again", exc)
            except discord.ConnectionClosed as exc:
                if exc.code != CLOSE_AUTHENTICATION_FAILED:
                    raise
                # Revoked while connected: the next login waits until it is given back.
                self.token.refused(f"the gateway (close {exc.code})", TOKEN_FIX)
                refused = True
            except discord.PrivilegedIntentsRequired:
                raise ConfigError(
                    "LASTWORD_DISCORD__TOKEN: this bot may not read message content; turn on "
                    "Bot → Privileged Gateway Intents → Message Content Intent in the Discord "
                    "Developer Portal"
                ) from None
            finally:
                self._gateway = None
                await gateway.close()
            if refused:
                await asyncio.sleep(refusals.next_delay())
            if retry_in is not None:
                await asyncio.sleep(retry_in)

    # Sending

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        await self._logged_in.wait()
        channel_id = _channel_id(conversation)
        group = Place.of(conversation).group
        channel = self.rest.get_partial_messageable(
            channel_id, type=None if group else discord.ChannelType.private
        )
        part = partial(self._send_part, conversation, text, idempotency_key, channel_id, channel)
        await replying(part, reply_to, f"a reply part to {conversation}")

    async def _send_part(
        self,
        conversation: str,
        text: str,
        idempotency_key: str,
        channel_id: int,
        channel: discord.PartialMessageable,
        reply_to: int | None,
    ) -> None:
        # In a group, a reply to the person's last message, which pings them alone; without
        # the message (deleted meanwhile) it still goes, as a plain one.
        replying: dict[str, Any] = {}
        if reply_to is not None:
            replying["reference"] = discord.MessageReference(
                message_id=reply_to, channel_id=channel_id, fail_if_not_exists=False
            )
        mentions = discord.AllowedMentions.none()
        mentions.replied_user = reply_to is not None
        HEARD_SCOPE.set(None)
        try:
            # discord.py waits out a 429 itself; the core keeps the lease renewed meanwhile.
            await channel.send(
                text,
                nonce=nonce(idempotency_key),
                allowed_mentions=mentions,
                **replying,
            )
            self.token.accepted()
        except discord.RateLimited as exc:
            raise _throttled(exc, f"channel:{channel_id}") from None
        except discord.HTTPException as exc:
            if exc.status == 401:
                # Revoked while running: an outage, as the core sees it (the reply waits in
                # the outbox); the log says what.
                self.token.refused(f"a reply at {self._api_url()}", TOKEN_FIX)
                raise Unavailable(f"Discord refuses {TOKEN_SETTING} for now") from None
            raise _verdict(conversation, exc) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise SendFailed(f"cannot reach Discord to reply to {conversation}: {exc!r}") from exc

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        """Discord's limits: every request counts bot-wide; a message also in its channel."""
        every = Scope(BOT_SCOPE, self.settings.requests_per_second, 1.0)
        if call != "message":
            return (every,)
        channel = f"channel:{_channel_id(conversation)}"
        return (every, Scope(channel, self.settings.channel_messages_per_5s, 5.0))

    def _rest_client(self) -> discord.Client:
        """The client for Discord's REST API (sends, typing, the login's token check), which
        tells the core of every 429 it hears."""
        trace = aiohttp.TraceConfig()
        trace.on_request_end.append(self._heard)
        return discord.Client(
            intents=INTENTS, max_ratelimit_timeout=MAX_RATE_LIMIT_WAIT_S, http_trace=trace
        )

    async def _heard(
        self, session: object, context: object, params: aiohttp.TraceRequestEndParams
    ) -> None:
        """A 429 from Discord: what it is about is noted for the call that made it
        (`HEARD_SCOPE`). discord.py waits out one up to `MAX_RATE_LIMIT_WAIT_S` and tries
        again by itself: meanwhile every replica is told to hold that scope (in the
        background: this runs inside the request). A longer one fails the call with
        `Throttled`, which the core holds itself: told here too, it would count twice."""
        if params.response.status != 429:
            return
        heard = _scope_of_429(params.url.path, params.response.headers)
        if heard is None:
            log.debug(
                "Discord answered 429 to %s %s: no reply waits on it",
                params.method,
                params.url.path,
            )
            return
        scope, wait = heard
        HEARD_SCOPE.set(scope)
        if self._sink is None or wait > MAX_RATE_LIMIT_WAIT_S:
            return
        task = asyncio.create_task(self._sink.throttled(scope, wait))
        self._news.add(task)
        task.add_done_callback(self._news.discard)

    async def typing(self, conversation: str) -> None:
        await self._logged_in.wait()
        HEARD_SCOPE.set(None)
        try:
            await self.rest.http.send_typing(_channel_id(conversation))
        except discord.RateLimited as exc:
            raise _throttled(exc, PREVIEWS_SCOPE) from None

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        """An attachment from its signed URL (the CDN needs no token)."""
        if attachment.size > max_bytes:
            raise FetchFailed(f"it is {attachment.size} bytes, over the limit of {max_bytes}")
        if self._downloads is None or self._downloads.closed:
            connector = aiohttp.TCPConnector(limit=DOWNLOAD_CONNECTIONS)
            self._downloads = aiohttp.ClientSession(connector=connector)
        try:
            async with self._downloads.get(attachment.ref) as response:
                if response.status in (403, 404):
                    raise FetchFailed("its link has expired, or it was deleted")
                if response.status != 200:
                    raise FetchFailed(f"Discord's CDN answered {response.status}")
                data = bytearray()
                async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK_BYTES):
                    data += chunk
                    if len(data) > max_bytes:
                        raise FetchFailed(f"it is over the limit of {max_bytes} bytes")
        except (aiohttp.ClientError, OSError) as exc:
            raise FetchFailed(f"cannot reach Discord's CDN ({type(exc).__name__})") from None
        return bytes(data)


def _scope_of_429(path: str, headers: Mapping[str, str]) -> tuple[str, float] | None:
    """The scope a 429 from Discord holds, and for how long, as its headers and route say: the
    whole bot for the global limit (`X-RateLimit-Global: true`, or `X-RateLimit-Scope:
    global`), a channel's messages for a message route, the previews for a typing indicator
    (so a reply never waits on one); None for any other route (the command menu, ...), whose
    own limit no reply or preview shares."""
    wait = _wait_of_429(headers)
    if (
        headers.get("X-RateLimit-Global", "").lower() == "true"
        or headers.get("X-RateLimit-Scope", "").lower() == "global"
    ):
        return BOT_SCOPE, wait
    if (channel := MESSAGES_ROUTE.match(path)) is not None:
        return f"channel:{channel.group(1)}", wait
    if TYPING_ROUTE.match(path) is not None:
        return PREVIEWS_SCOPE, wait
    return None


def _wait_of_429(headers: Mapping[str, str]) -> float:
    """The longest wait a 429's headers name (`Retry-After`, whole seconds; the bucket's
    `X-RateLimit-Reset-After`), as given, odd ones too (0, negative: the core bounds them);
    1 s if neither reads as a number of seconds."""
    waits: list[float] = []
    for name in ("Retry-After", "X-RateLimit-Reset-After"):
        try:
            waits.append(float(headers.get(name, "")))
        except ValueError:
            continue
    return max((wait for wait in waits if math.isfinite(wait)), default=1.0)


def _throttled(exc: discord.RateLimited, scope: str) -> Throttled:
    """A 429 longer than discord.py waits, as the core takes it: holding the scope Discord
    said it was about, heard in this call (`HEARD_SCOPE`), else the call's own `scope` (for a
    wait discord.py foresaw from the route's last answers, without asking)."""
    return Throttled(exc.retry_after, HEARD_SCOPE.get() or scope)


async def _resume_failed(sink: Sink, resumes: Backoff, exc: _ResumeFailed) -> float | None:
    """After a RESUME that did not take: how long to wait before resuming again (one INFO
    line), or None once the session is given up (`RESUME_ATTEMPTS` in a row, or Discord said
    it is over): then it is dropped from the store, so that no holder resumes it again, and
    one WARNING says so. Never a traceback: a dead address is no bug."""
    delay = resumes.next_delay()
    if not exc.over and resumes.failures < RESUME_ATTEMPTS:
        log.info(
            "cannot resume the Discord session (%s); trying again in %.0fs (%d of %d)",
            exc,
            delay,
            resumes.failures,
            RESUME_ATTEMPTS,
        )
        return delay
    resumes.reset()
    log.warning(
        "cannot resume the Discord session (%s%s): dropping it and logging in afresh; a "
        "catch-up reads the DMs sent meanwhile",
        exc,
        "" if exc.over else f", {RESUME_ATTEMPTS} tries in a row",
    )
    try:
        # Best effort: the new session replaces it within a second of opening anyway.
        await sink.remember(SESSION_KEY, None, SESSION_TTL_S)
    except Unavailable as exc_store:
        log.warning("cannot drop the Discord session from the store: %s", exc_store)
    return None


async def _recall(sink: Sink) -> _Session | None:
    """The session the last holder kept, waiting for the store: without it, the DMs that
    Discord would replay could not be stored anyway."""
    backoff = Backoff(RETRY_FIRST_S, RETRY_CAP_S)
    while True:
        try:
            kept = await sink.recall(SESSION_KEY)
        except Unavailable as exc:
            log.warning("cannot read the Discord session to resume (%s); retrying", exc)
            await asyncio.sleep(backoff.next_delay())
            continue
        return None if kept is None else _Session.loads(kept)


@dataclass(frozen=True)
class _Session:
    """A gateway session another holder can RESUME, at `url`: Discord replays every event
    after `seq`."""

    id: str
    seq: int
    url: str
    # The session began after a gap whose catch-up has not finished: whoever resumes it
    # catches up too.
    catch_up: bool

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, kept: str) -> _Session | None:
        try:
            return cls(**json.loads(kept))
        except (ValueError, TypeError) as exc:
            log.warning("ignoring an unreadable Discord session %r: %s", kept, exc)
            return None


@dataclass(frozen=True)
class _Received:
    message: InboundMessage
    # The (session id, sequence number) of the event that carried it; None for a message
    # read from the history.
    event: tuple[str, int] | None
    # The slash command it came from, answered once the message is stored.
    interaction: discord.Interaction | None = None


class _Overflowed(Exception):
    def __init__(self, dropped: int) -> None:
        super().__init__(
            f"{dropped} Discord DMs were dropped from memory while the store could not take them"
        )


class _ResumeFailed(Exception):
    """A RESUME did not take: its connection failed, or the socket closed before Discord said
    RESUMED. `over`: Discord said the session cannot be resumed at all."""

    def __init__(self, reason: str, *, over: bool = False) -> None:
        super().__init__(reason)
        self.over = over


class _GatewaySocket(DiscordWebSocket):
    """discord.py's gateway socket, but a `_Gateway` with a session to take over opens its
    first connection with RESUME, at that session's resume URL, instead of IDENTIFY; and a
    RESUME that does not take (the first one or a reconnect's) ends the connection with
    `_ResumeFailed`, for `DiscordAdapter._listen` to try again or give the session up.

    `Client.connect` starts every client with IDENTIFY and keeps what it would resume in a
    local variable; it opens each connection by calling this class method through its module's
    name for the class, which `_point_at` sets to this subclass: the one seam before the first
    IDENTIFY, and before each reconnect. Left to itself, discord.py would resume a dead address
    for ever (a traceback each time), or, on the first connection, fail on a socket it never
    had. A RESUME Discord answers with op 9 false is discord.py's own: a new IDENTIFY.
    """

    @classmethod
    async def from_client(cls, client: discord.Client, **params: Any) -> Self:
        if not isinstance(client, _Gateway):
            return await super().from_client(client, **params)
        if (session := client.pop_takeover()) is not None:
            params.update(
                resume=True, session=session.id, sequence=session.seq, gateway=yarl.URL(session.url)
            )
        if client.resuming:
            # The last RESUME's socket closed before Discord said RESUMED.
            client.resuming = False
            if params.get("resume"):
                code = client.ws.socket.close_code if client.ws is not None else None
                raise _ResumeFailed(
                    f"the gateway closed the RESUME with {code}", over=code in SESSION_OVER_CLOSES
                )
        if not params.get("resume"):
            return await super().from_client(client, **params)
        client.resuming = True
        try:
            async with asyncio.timeout(RESUME_CONNECT_TIMEOUT_S):
                return await super().from_client(client, **params)
        except (
            OSError,
            aiohttp.ClientError,
            TimeoutError,
            discord.GatewayNotFound,
            discord.ConnectionClosed,
            ReconnectWebSocket,
        ) as exc:
            client.resuming = False
            where = yarl.URL(str(params.get("gateway") or cls.DEFAULT_GATEWAY))
            raise _ResumeFailed(f"{type(exc).__name__} at {where.with_query(None)}") from None


class _Gateway(discord.Client):
    """The gateway connection: queues the DMs it receives with the event that carried them,
    stores them in that order, keeps the session for the next holder, and catches up after a
    gap."""

    def __init__(self, sink: Sink, catch_up_minutes: int, intents: discord.Intents) -> None:
        super().__init__(
            intents=intents,
            guild_ready_timeout=GUILD_READY_TIMEOUT_S,
            # Edits arrive raw; nothing here reads the message cache.
            max_messages=None,
        )
        self.sink = sink
        self.catch_up_minutes = catch_up_minutes
        # DMs, and the places users were seen typing at, in arrival order.
        self.inbox: asyncio.Queue[_Received | Place] = asyncio.Queue(maxsize=INBOX_CAP)
        # The events whose DM is in memory, not stored yet: the kept sequence stays before them.
        self._unstored: set[tuple[str, int]] = set()
        self._storing = 0
        # DMs dropped from memory since the queue was full; all later ones are dropped too, so
        # that the RESUME brings them back in order. Per session, the first one dropped, which
        # the kept sequence stays before: the rest need no memory.
        self._dropped = 0
        self._dropped_from: dict[str, int] = {}
        self._takeover: _Session | None = None
        # A session is open (READY or RESUMED, until a disconnect).
        self._live = asyncio.Event()
        # A session was open at some point: a RESUME failing later is a new run of failures.
        self.was_live = False
        # A RESUME was sent and Discord has not said RESUMED yet (`_GatewaySocket`).
        self.resuming = False
        # While a catch-up is owed, live DMs of the conversations whose history it has yet to
        # read wait here, so that none is stored ahead of an older one from the gap. None: no
        # catch-up; `_unread` None: which conversations it reads is not known yet (all wait).
        self._held: list[_Received] | None = None
        self._unread: set[str] | None = None
        self._owes_catch_up = False
        # Counts gaps: a catch-up that began before the latest one does not end the hold.
        self._gap = 0
        self._catching_up: asyncio.Task[None] | None = None
        # Interactions being answered (each within ACKNOWLEDGE_TIMEOUT_S).
        self._answering: set[asyncio.Task[None]] = set()

    def live(self) -> bool:
        return self._live.is_set()

    def take_over(self, session: _Session | None) -> None:
        """Open the first connection by resuming `session`, kept by the last holder."""
        self._takeover = session
        if session is not None:
            log.info("resuming the Discord session of the last gateway holder at %d", session.seq)
            if session.catch_up:
                self._begin_gap()

    def pop_takeover(self) -> _Session | None:
        session, self._takeover = self._takeover, None
        return session

    async def hold(self) -> None:
        """Connect and store what arrives until cancelled (or the connection ends for good, or
        the queue overflowed), then hand the session over."""
        connect = asyncio.create_task(self.connect(reconnect=True), name="discord gateway")
        deliver = asyncio.create_task(self._deliver(), name="discord inbox")
        try:
            await asyncio.wait({connect, deliver}, return_when=asyncio.FIRST_COMPLETED)
            # The inbox never returns: if it ended, it raised, and that ends the connection.
            for task in (deliver, connect):
                if task.done():
                    task.result()
        finally:
            try:
                await self._hand_over(connect, deliver)
            finally:
                # Cut short by a second cancellation: nothing may outlive the hand-over.
                for left in (self._catching_up, connect, deliver, *self._answering):
                    if left is not None:
                        left.cancel()

    async def _hand_over(self, connect: asyncio.Task[None], deliver: asyncio.Task[None]) -> None:
        """Leave the session to the next holder: stop receiving without ending the session,
        store what is queued, and keep how far that got. Held DMs, and what a catch-up cut
        short had yet to read, are left to the next holder's RESUME and catch-up."""
        if self._catching_up is not None:
            await cancel_and_wait(self._catching_up)
        # Before the socket closes: discord.py would reconnect.
        await cancel_and_wait(connect)
        await self.close()
        if not deliver.done():
            queued = self.inbox.qsize() + self._storing
            if queued:
                log.info("handing the Discord gateway over: storing %d queued DMs first", queued)
            await self.inbox.join()
        await cancel_and_wait(deliver)
        session = self._session()
        if session is not None:
            await self._keep(session)

    async def close(self) -> None:
        # discord.py closes the socket with 1000, after which Discord refuses to resume the
        # session. Called once `connect` has ended: it would reconnect on a closed socket.
        if self.ws is not None and self.ws.open:
            await self.ws.close(code=RESUMABLE_CLOSE)
        await super().close()

    # Receiving

    def dispatch(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        # discord.py calls this while it parses an event, with `ws.sequence` still that
        # event's; its handlers run later, as tasks, when more events may have been parsed. So
        # DMs are taken here, each with the sequence number a RESUME would replay it from.
        try:
            if event == "message":
                self._received(args[0])
            elif event == "raw_message_edit":
                self._received(args[0].message, edited=True)
            elif event == "interaction":
                self._interacted(args[0])
            elif event == "raw_typing":
                self._typed(args[0])
            elif event in ("connect", "resumed"):
                self._live.set()
                self.was_live = True
                self.resuming = False
            elif event == "disconnect":
                self._live.clear()
        except Exception:
            log.exception("error taking in the Discord %s event", event)
        super().dispatch(event, *args, **kwargs)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        # A new session is about to be asked for: nothing sent while none was open will be
        # delivered, and its first DMs (even those discord.py passes on while it waits for
        # guilds, before READY counts as done) wait for the catch-up.
        self._live.clear()
        self._begin_gap()
        await super().before_identify_hook(shard_id, initial=initial)

    def _received(self, message: discord.Message, *, edited: bool = False) -> None:
        assert self.user is not None
        found = normalize(message, self.user.id, edited=edited)
        if found is not None:
            self._take(found)

    def _interacted(self, interaction: discord.Interaction) -> None:
        found = interaction_message(interaction)
        if found is not None:
            self._take(found, interaction)

    def _typed(self, event: discord.RawTypingEvent) -> None:
        """Queue a user's typing in a DM behind the messages before it, so that it is counted
        after them: a signal counted before the message it came after would be taken for
        the typing of that message, and hold nothing. Dropped, never queued, while DMs wait
        for the store or for a catch-up: typing is best effort, DMs are not."""
        if event.guild_id is not None or self._dropped or self.inbox.qsize() >= TYPING_QUEUED_CAP:
            return
        place = Place(PLATFORM, str(event.channel_id), str(event.user_id))
        # Its conversation's DMs wait for the catch-up: it would be counted ahead of them.
        if self._held is not None and self._waits(place.conversation):
            return
        self.inbox.put_nowait(place)

    def _take(self, found: InboundMessage, interaction: discord.Interaction | None = None) -> None:
        """Queue a DM taken in from the event being parsed, in arrival order."""
        ws = self.ws
        event = None
        if ws.session_id is not None and ws.sequence is not None:
            event = (ws.session_id, ws.sequence)
            self._unstored.add(event)
        received = _Received(found, event, interaction)
        if self._held is not None and self._waits(found.conversation):
            if len(self._held) < INBOX_CAP and not self._dropped:
                self._held.append(received)
            else:
                self._drop(received)
        else:
            self._queue(received)

    def _queue(self, received: _Received) -> None:
        if self._dropped:
            self._drop(received)
            return
        try:
            self.inbox.put_nowait(received)
        except asyncio.QueueFull:
            self._drop(received)

    def _drop(self, received: _Received) -> None:
        if not self._dropped:
            log.warning(
                "%d Discord DMs are waiting for the store: dropping newer ones from memory "
                "until they are stored, then resuming the session to receive them again",
                INBOX_CAP,
            )
        self._dropped += 1
        if received.event is not None:
            self._unstored.discard(received.event)
            session, seq = received.event
            # A held DM released after a later one was dropped comes before it.
            self._dropped_from[session] = min(seq, self._dropped_from.get(session, seq))

    async def _deliver(self) -> None:
        """Store what the gateway delivered, one at a time, in arrival order: one writer, so
        a message is never stored ahead of one that came before it. Keeps the session, with
        the sequence number of the last event stored, for the next holder."""
        loop = asyncio.get_running_loop()
        kept: _Session | None = None
        kept_at = -math.inf
        while True:
            if self._dropped and self.inbox.empty():
                raise _Overflowed(self._dropped)
            session = self._session()
            since = loop.time() - kept_at
            due = since >= SESSION_TTL_S / 3 or (session != kept and since >= KEEP_EVERY_S)
            if session is not None and due and await self._keep(session):
                kept, kept_at = session, loop.time()
            try:
                async with asyncio.timeout(KEEP_EVERY_S):
                    received = await self.inbox.get()
            except TimeoutError:
                continue
            if isinstance(received, Place):
                # A user seen typing (best effort: this never raises, and is bounded in time).
                await self.sink.user_typing(received)
                self.inbox.task_done()
                continue
            message = received.message
            self._storing = 1
            await until_stored(partial(self.sink.ingest, message), describe(message))
            self._storing = 0
            if received.event is not None:
                self._unstored.discard(received.event)
            if received.interaction is not None:
                answering = asyncio.create_task(self._acknowledge(received.interaction))
                self._answering.add(answering)
                answering.add_done_callback(self._answering.discard)
            self.inbox.task_done()

    async def _acknowledge(self, interaction: discord.Interaction) -> None:
        """Answer a stored slash command with a note only its user sees; its answer comes as
        a DM. One Discord no longer takes (too late, a replay) is only noted: the DM comes."""
        try:
            async with asyncio.timeout(ACKNOWLEDGE_TIMEOUT_S):
                await interaction.response.send_message(ACKNOWLEDGED, ephemeral=True)
        except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info(
                "interaction %s not acknowledged (%s); its answer comes as a DM all the same",
                interaction.id,
                type(exc).__name__,
            )

    def _session(self) -> _Session | None:
        """This session as the next holder should resume it: from the last event before the
        first DM not stored."""
        ws = self.ws
        if ws is None or ws.session_id is None or ws.sequence is None:
            return None
        waiting = [seq for session, seq in self._unstored if session == ws.session_id]
        if ws.session_id in self._dropped_from:
            waiting.append(self._dropped_from[ws.session_id])
        seq = min(waiting) - 1 if waiting else ws.sequence
        return _Session(ws.session_id, seq, str(ws.gateway), self._owes_catch_up)

    async def _keep(self, session: _Session) -> bool:
        try:
            await self.sink.remember(SESSION_KEY, session.dumps(), SESSION_TTL_S)
        except Unavailable as exc:
            log.warning("cannot keep the Discord session for the next holder: %s", exc)
            return False
        except Exception:
            log.exception("cannot keep the Discord session for the next holder")
            return False
        return True

    # Catching up after a gap

    def _begin_gap(self) -> None:
        """Nothing sent before this session was delivered by it: hold its live DMs, and catch
        up once it is open."""
        if not self.catch_up_minutes:
            return
        self._gap += 1
        self._owes_catch_up = True
        self._unread = None
        if self._held is None:
            self._held = []
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.create_task(self._catch_up(), name="discord catch-up")

    def _waits(self, conversation: str) -> bool:
        """Whether a live message of `conversation` must wait for the catch-up to read it
        first."""
        return self._unread is None or conversation in self._unread

    def _release(self, read: str | None = None) -> None:
        """Queue the held messages that need wait no longer: those of conversation `read`
        (its history is queued), of conversations the catch-up does not read, or, with
        nothing left to read, all of them; in arrival order."""
        if self._held is None:
            return
        if read is not None and self._unread is not None:
            self._unread.discard(read)
        waiting = []
        for received in self._held:
            if self._waits(received.message.conversation):
                waiting.append(received)
            else:
                self._queue(received)
        self._held = waiting

    async def _catch_up(self) -> None:
        """Take in DMs sent while no session was open: for each recently active conversation,
        its history after the last message taken in, once the new session is open (what is
        sent after that comes live). Any already taken in are dropped by the core's dedupe.
        Again if another gap began meanwhile, or if it failed: the held DMs wait for it."""
        backoff = Backoff(RETRY_FIRST_S, RETRY_CAP_S)
        while self._owes_catch_up:
            await self._live.wait()
            gap = self._gap
            try:
                read = await self._read_gap(gap)
            except Unavailable as exc:
                log.warning("cannot read recent conversations for the catch-up: %s", exc)
            except Exception:
                log.exception("the Discord catch-up failed")
            else:
                if read and gap == self._gap:
                    self._owes_catch_up = False
                    self._unread = set()
                    self._release()
                    self._held = None
                continue
            delay = backoff.next_delay()
            log.info("catching up again in %.1fs", delay)
            await asyncio.sleep(delay)

    async def _read_gap(self, gap: int) -> bool:
        """Read the gap into the inbox; False if a newer gap began meanwhile."""
        assert self.user is not None
        # DMs only: a guild channel's history is everyone's, and what was missed there is
        # not each person's to answer after the fact.
        recent = {
            conversation: last
            for conversation, last in (
                await self.sink.recent(PLATFORM, self.catch_up_minutes * 60)
            ).items()
            if not Place.of(conversation).group
        }
        if gap != self._gap:
            return False
        self._unread = set(recent)
        self._release()
        found = 0
        for conversation, last in recent.items():
            channel = self.get_partial_messageable(
                _channel_id(conversation), type=discord.ChannelType.private
            )
            # History is read by the platform's id (an edit's is the edited message's).
            after = discord.Object(int(platform_id(last)))
            try:
                async for item in channel.history(
                    limit=CATCH_UP_LIMIT, after=after, oldest_first=True
                ):
                    if (message := normalize(item, self.user.id)) is not None:
                        # Waits for room: a reader, unlike the gateway, can be held back.
                        await self.inbox.put(_Received(message, None))
                        found += 1
            except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("cannot read the history of %s: %s", conversation, exc)
            if gap != self._gap:
                return False
            self._release(read=conversation)
        log.info("catch-up: %d conversations read, %d messages found", len(recent), found)
        return True

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("error in the Discord %s handler", event_method)


# Application flags that say the message content intent is switched on in the Developer
# Portal (verified apps get the first, unverified ones the second). The adapter asks for
# that privileged intent, and Discord closes the gateway (4014) if it is off.
GATEWAY_MESSAGE_CONTENT = 1 << 18
GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19
# `lastword doctor`'s advice when the REST API does not answer.
UNREACHABLE_FIX = "check the network, or LASTWORD_DISCORD__API_URL"


async def check(settings: Settings, timeout_s: float) -> Check:
    """Whether Discord accepts the token and the message content intent is on, for
    `lastword doctor`."""
    return await guarded(
        _check(settings),
        timeout_s,
        Check("platform", False, f"discord: no answer within {timeout_s:g} s", UNREACHABLE_FIX),
    )


async def _check(settings: Settings) -> Check:
    own = settings.section(DiscordSettings)
    _point_at(own)
    api_url = own.api_url.rstrip("/")
    client = discord.Client(intents=INTENTS)
    try:
        # login() is GET /users/@me, then GET /oauth2/applications/@me for the flags.
        await client.login(own.token.get_secret_value())
        user = client.user
        flags = client.application_flags.value
    except discord.LoginFailure:
        return Check(
            "platform",
            False,
            f"Discord refused {TOKEN_SETTING} (GET /users/@me at {api_url})",
            TOKEN_FIX,
        )
    except discord.HTTPException as exc:
        return Check(
            "platform",
            False,
            f"Discord answered {exc.status} at {api_url}: {exc.text[:200]}",
            UNREACHABLE_FIX,
        )
    except (aiohttp.ClientError, OSError) as exc:
        return Check(
            "platform",
            False,
            f"cannot reach Discord at {api_url}: {type(exc).__name__}",
            UNREACHABLE_FIX,
        )
    finally:
        await client.close()
    assert user is not None
    found = f"discord: {user.name} ({user.id})"
    if not flags & (GATEWAY_MESSAGE_CONTENT | GATEWAY_MESSAGE_CONTENT_LIMITED):
        return Check(
            "platform",
            False,
            f"{found}, but the message content intent is off",
            "switch on Message Content Intent in the Developer Portal (Bot > Privileged "
            "Gateway Intents); without it Discord refuses the gateway connection",
        )
    return Check("platform", True, f"{found}, message content intent on")


PLUGIN = Platform(
    create=lambda settings: DiscordAdapter(
        settings.section(DiscordSettings),
        groups=bool(settings.groups.allowed),
        typing=settings.debounce.typing_ms > 0,
    ),
    check=check,
    settings=DiscordSettings,
)

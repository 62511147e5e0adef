"""A loopback fake of Discord (REST API v10 and the gateway websocket), for tests.

The Discord adapter talks to Discord through the real ``discord.py`` library. Tests drive that
same library against this fake instead of mocking it, so the wire format (JSON payloads, error
bodies ``{"message": ..., "code": ...}``, 429 answers with their headers, gateway opcodes,
sequence numbers, the ``zlib-stream`` transport) and the library's own behaviour (rate-limit
waits, ``Forbidden``, RESUME after a reconnect) are exercised for real, while the test keeps
full control: users post and edit messages, errors are scripted per channel, POST answers can
be withheld, and every REST request (its status too), POST, typing call, IDENTIFY and RESUME
is recorded.

discord.py is pointed at the fake through two class attributes, as the adapter does::

    async with FakeDiscord() as fake:
        discord.http.Route.BASE = fake.api_url
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
        client = discord.Client(intents=..., guild_ready_timeout=0.2)
        await client.login(fake.token)      # REST: GET /users/@me, /oauth2/applications/@me
        task = asyncio.create_task(client.connect())   # gateway: HELLO, IDENTIFY, READY
        await fake.wait_for_sessions(1)
        await fake.user_sends(user_id=7, content="hi")  # MESSAGE_CREATE -> on_message

What Discord does and this fake copies (checked against discord.py 2.7 and the API docs):

- Snowflakes carry a millisecond timestamp from the Discord epoch (2015) in their top bits, so
  ids sort by creation time; every id the fake hands out (users, channels, messages, sessions'
  attachments) comes from one monotonic generator.
- ``nonce`` + ``enforce_nonce``: a second POST by the same author with the same nonce within
  :attr:`FakeDiscord.nonce_window_s` returns the first message and creates nothing. A nonce is
  at most 25 characters.
- Channel history is answered newest first; ``after`` returns the oldest ``limit`` messages
  after the id (still newest first), ``around`` centres on the id.
- A session stays resumable when its socket drops or the client closes with a code other than
  1000/1001; events for it are logged meanwhile and replayed on RESUME (op 6) after the
  sequence number the client sends, on any connection (another process may resume it),
  followed by a ``RESUMED`` dispatch. An unknown or invalidated session gets op 9 ``false``.
- READY names a ``resume_gateway_url`` of its own (``/resume`` here), where a RESUME should go;
  as on Discord, one sent to the main URL works too. A test can have READY name another
  (:attr:`FakeDiscord.resume_url`: a resume host that is down), or have every RESUME refused
  by a close code (:attr:`FakeDiscord.resume_close`: 4009 "Session timed out", after which
  Discord wants a new IDENTIFY). Each heartbeat carries the sequence number
  of the last event the client received, which the fake records.
- DMs carry their content whether or not the session asked for the message content intent;
  guild messages that do not mention the bot (a reply's ping counts) are blanked for a
  session without it, and so is a reply's ``referenced_message`` judged on its own.
- Guilds (:meth:`FakeDiscord.guild`, :meth:`FakeDiscord.guild_channel`,
  :meth:`FakeDiscord.thread`): READY lists every guild the bot is in as ``unavailable``; a
  session with the GUILDS intent then gets a ``GUILD_CREATE`` for each (channels, active
  threads, roles, and as members the bot alone unless it has the presences intent; with the
  members intent discord.py asks for the rest, op 8, answered by ``GUILD_MEMBERS_CHUNK``).
  A guild, channel or thread made while connected is announced to such sessions by
  ``GUILD_CREATE``, ``CHANNEL_CREATE`` or ``THREAD_CREATE`` before any later dispatch. A
  session without GUILDS gets none of these: discord.py then knows the guild only as
  unavailable and a guild message's channel only as a ``PartialMessageable``.
- Replies: a message with a ``message_reference`` (type 0) is of type 19 (REPLY) and carries
  the replied-to message as ``referenced_message`` (one level deep). A bot's POST naming a
  message not in the channel is refused (400, 50035, ``message_reference``: ``Unknown
  message``) unless ``fail_if_not_exists`` is false, which sends it without the reference.
  ``mentions`` holds whom the message pings: for a bot's POST, the users its content names
  that ``allowed_mentions`` lets through, plus the replied-to author if ``replied_user`` (or
  without ``allowed_mentions`` at all, Discord's default: everyone named, and the reply's
  author).
- An attachment's bytes are not in the message: its ``url`` points at the CDN, signed and
  expiring (``?ex=<expiry>&is=<issued>&hm=<signature>&``, unix seconds in hex), and needs no
  token. The CDN answers an expired, unsigned or tampered URL with 404 and the plain-text body
  ``This content is no longer available.``; the fake serves such URLs itself
  (:meth:`FakeDiscord.add_attachment`) and records every download.
- A voice message is a message with flag ``IS_VOICE_MESSAGE`` (1 << 13), empty content and one
  ``audio/ogg`` attachment carrying ``duration_secs`` and a base64 ``waveform``.
- Application commands: ``PUT /applications/{id}/commands`` replaces the bot's global commands
  (names, descriptions and option limits checked as Discord does) and ``GET`` lists them. A user
  can only use one that is registered and usable where they are
  (:meth:`FakeDiscord.user_uses_command`, in their DM: context 1): it arrives as an
  ``INTERACTION_CREATE`` dispatch carrying a token. The bot must answer it once, within 3 s,
  at ``POST /interactions/{id}/{token}/callback`` (no bot token needed there); later it is
  ``Unknown interaction`` (10062), a second answer ``already been acknowledged`` (40060). A
  non-ephemeral channel message answer is a message of the bot's in the channel.
- Rate limits, when asked for (``FakeDiscord(limits=discord_limits())``, see
  :func:`discord_limits`): the global limit on every REST request that takes the bot's token
  (not the CDN, not interaction callbacks, not the gateway) and the per-channel limit on
  message POSTs. A request past one is answered Discord's 429 (``retry_after`` in seconds,
  ``global`` for the global limit), performs nothing, is recorded with status 429 (in
  ``requests``, and in ``posts`` for a message POST) and is counted in
  ``fake.limits.violations``. discord.py sleeps out such a 429 and retries by itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import importlib
import importlib.util
import itertools
import json
import math
import re
import secrets
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from aiohttp import BodyPartReader, WSMsgType, web

from tests.support.fakes.limits import Limit, Limits
from tests.support.fakes.loopback import LoopbackServer

__all__ = [
    "CDN_GONE",
    "CHANNEL_GUILD_TEXT",
    "CHANNEL_PUBLIC_THREAD",
    "CLOSE_SESSION_TIMED_OUT",
    "DEFAULT_TOKEN",
    "DISCORD_EPOCH_MS",
    "MESSAGE_FLAG_IS_VOICE_MESSAGE",
    "MESSAGE_TYPE_REPLY",
    "FakeDiscord",
    "RecordedDownload",
    "RecordedInteraction",
    "RecordedPost",
    "RecordedRequest",
    "ScriptedError",
    "discord_limits",
    "snowflake_time_ms",
]

# Where the REST API sits below the origin (v10, as the adapter is configured).
API_PREFIX = "/api/v10"
DEFAULT_TOKEN = "MTAxNTEyMzQ1Njc4OTAxMjM0.FakeDi.scord-token-for-tests-0123456789"
DISCORD_EPOCH_MS = 1420070400000

MAX_CONTENT = 2000
MAX_NONCE = 25

# Application commands, as Discord checks them.
_COMMAND_NAME_RE = re.compile(r"[-_\w]{1,32}")
MAX_COMMAND_DESCRIPTION = 100
MAX_GLOBAL_COMMANDS = 100
# Interaction context types: a guild, the bot's DM, another private channel.
CONTEXT_BOT_DM = 1
# How long Discord waits for an interaction's first answer.
INTERACTION_ANSWER_S = 3.0
# The interaction callback type that answers with a channel message, and the ephemeral flag.
CALLBACK_CHANNEL_MESSAGE = 4
MESSAGE_FLAG_EPHEMERAL = 1 << 6

MESSAGE_FLAG_IS_VOICE_MESSAGE = 1 << 13
# What Discord's CDN answers (404, text/plain) for an expired, unsigned or tampered URL.
CDN_GONE = "This content is no longer available."
# How long a signed attachment URL lasts on Discord: about a day from when it was handed out.
ATTACHMENT_URL_TTL_S = 24 * 3600

# How the limits name a message POST (see FakeDiscord._over_limit).
_POST_MESSAGE = "POST /channels/{channel_id}/messages"

# Gateway opcodes.
OP_DISPATCH = 0
OP_HEARTBEAT = 1
OP_IDENTIFY = 2
OP_PRESENCE_UPDATE = 3
OP_VOICE_STATE_UPDATE = 4
OP_RESUME = 6
OP_RECONNECT = 7
OP_REQUEST_GUILD_MEMBERS = 8
OP_INVALID_SESSION = 9
OP_HELLO = 10
OP_HEARTBEAT_ACK = 11

# Gateway close codes (https://discord.com/developers/docs/topics/opcodes-and-status-codes).
CLOSE_UNKNOWN_ERROR = 4000
CLOSE_UNKNOWN_OPCODE = 4001
CLOSE_DECODE_ERROR = 4002
CLOSE_NOT_AUTHENTICATED = 4003
CLOSE_AUTHENTICATION_FAILED = 4004
CLOSE_ALREADY_AUTHENTICATED = 4005
CLOSE_SESSION_TIMED_OUT = 4009
CLOSE_INVALID_INTENTS = 4013
CLOSE_DISALLOWED_INTENTS = 4014
# After these Discord wants a fresh IDENTIFY: the session is gone.
_SESSION_ENDING_CLOSES = frozenset({4004, 4007, 4009, 4010, 4011, 4012, 4013, 4014})

# Intent bits this fake looks at.
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_GUILD_MESSAGE_TYPING = 1 << 11
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_DIRECT_MESSAGE_TYPING = 1 << 14
INTENT_MESSAGE_CONTENT = 1 << 15
_PRIVILEGED = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT
# Application flag an unverified bot gets once "Message Content Intent" is toggled on.
APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19

_MENTION_RE = re.compile(r"<@!?(\d+)>")
_ROLE_MENTION_RE = re.compile(r"<@&(\d+)>")
# The bot's managed role in a guild (the one Discord makes for a bot, `tags.bot_id`) has the
# guild's id plus this as its own.
BOT_ROLE_OFFSET = 7

# Channel types.
CHANNEL_GUILD_TEXT = 0
CHANNEL_DM = 1
CHANNEL_PUBLIC_THREAD = 11
# Message types: what a user or the bot writes, and a reply (a message with a reference).
MESSAGE_TYPE_DEFAULT = 0
MESSAGE_TYPE_REPLY = 19
# Message reference types: a reply, a forward.
REFERENCE_REPLY = 0
# What @everyone may do in a fake guild (and so the bot): see channels, read their history,
# send messages (in threads too), embed, attach, react, make public threads, use commands.
_PERMISSION_BITS = (6, 10, 11, 14, 15, 16, 18, 31, 35, 38)
EVERYONE_PERMISSIONS = sum(1 << bit for bit in _PERMISSION_BITS)
# A thread archives after this many minutes without a message (Discord's default).
THREAD_AUTO_ARCHIVE_MIN = 1440


def snowflake_time_ms(snowflake: int) -> int:
    """Unix milliseconds at which ``snowflake`` was made."""
    return (snowflake >> 22) + DISCORD_EPOCH_MS


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


@dataclass
class ScriptedError:
    """A REST error the fake answers with instead of performing a request."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RecordedPost:
    """One ``POST /channels/{id}/messages`` as the fake received it, and how it was answered."""

    channel_id: int
    content: str | None
    # As a string (Discord takes an integer or a string and compares them as text); the
    # message itself keeps the nonce as sent.
    nonce: str | None
    enforce_nonce: bool
    at: float
    # HTTP status of the answer; None while it is in flight (held) or if the client went away.
    status: int | None = None
    # True when enforce_nonce matched an earlier message and nothing was created.
    deduplicated: bool = False
    # The message created or returned, if any.
    message_id: int | None = None
    # The client hung up (or was killed) before the answer was sent.
    cancelled: bool = False
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def message_reference(self) -> dict[str, Any] | None:
        """The ``message_reference`` the POST asked for, as sent (kept even when refused)."""
        reference = self.body.get("message_reference")
        return reference if isinstance(reference, dict) else None

    @property
    def reply_to(self) -> int | None:
        """The id of the message the POST replies to, if it names one."""
        reference = self.message_reference
        if reference is None:
            return None
        return _digits(reference.get("message_id"))

    @property
    def allowed_mentions(self) -> dict[str, Any] | None:
        """The ``allowed_mentions`` the POST was sent with, as sent; None if it had none."""
        allowed = self.body.get("allowed_mentions")
        return allowed if isinstance(allowed, dict) else None


@dataclass
class RecordedRequest:
    """One request to a REST route that takes the token, and the status it was answered with:
    what shows how often a client logs in (``GET /users/@me``) while its token is refused."""

    method: str
    # Below the API base, e.g. "/users/@me".
    path: str
    status: int
    at: float


@dataclass
class RecordedDownload:
    """One GET (or HEAD) of an attachment URL on the fake CDN, and how it was answered."""

    # None when the path names no attachment the fake made.
    attachment_id: int | None
    # Decoded, e.g. "/attachments/<channel>/<attachment>/<filename>"; proxy_url downloads
    # start with "/media".
    path: str
    query: dict[str, str]
    status: int
    at: float
    method: str = "GET"


@dataclass
class _StoredAttachment:
    """An attachment made by :meth:`FakeDiscord.add_attachment`: its bytes and its URL state."""

    id: int
    filename: str
    data: bytes
    content_type: str | None
    # The channel its URL names; None until it is first sent (see FakeDiscord._bind).
    channel_id: int | None
    issued_s: int
    expires_s: int
    # Gone from the CDN whatever the URL says (see FakeDiscord.expire).
    expired: bool
    # The dict handed to the test, rebound in place when it is first sent.
    obj: dict[str, Any]


@dataclass
class RecordedInteraction:
    """A slash command a user used, and the bot's answers to it (the callbacks' bodies, the
    refused ones too, with the status each got)."""

    id: int
    token: str
    channel_id: int
    user_id: int
    name: str
    at: float
    answers: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @property
    def acknowledged(self) -> bool:
        return any(status == 200 for status, _ in self.answers)


@dataclass
class _Channel:
    id: int
    type: int  # CHANNEL_DM, CHANNEL_GUILD_TEXT or CHANNEL_PUBLIC_THREAD
    guild_id: int | None = None
    recipient_id: int | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    name: str | None = None
    # A thread's: the text channel it is in, and who started it.
    parent_id: int | None = None
    owner_id: int | None = None


@dataclass
class _Guild:
    """A server the bot is in: its text channels and threads (ids, in creation order) and its
    members as far as the fake knows them (the bot, and everyone who wrote there)."""

    id: int
    name: str
    owner_id: int
    joined_at: str
    channel_ids: list[int] = field(default_factory=list)
    thread_ids: list[int] = field(default_factory=list)
    # user id -> {"nick": ..., "joined_at": ...}
    members: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Session:
    id: str
    intents: int
    shard: list[int] | None
    seq: int = 0
    # The sequence number the client last reported in a heartbeat: what it has received.
    heartbeat_seq: int | None = None
    # Every dispatch after READY, as sent: what RESUME replays.
    log: list[dict[str, Any]] = field(default_factory=list)
    connection: _Connection | None = None
    invalidated: bool = False


class _Connection:
    """One gateway websocket and its per-connection compression stream."""

    def __init__(self, ws: web.WebSocketResponse, compress: str | None) -> None:
        self.ws = ws
        self.compress = compress
        self.session: _Session | None = None
        self.frames_sent = 0
        self._lock = asyncio.Lock()
        self._compressor: Any = None
        if compress == "zlib-stream":
            self._compressor = zlib.compressobj()
        elif compress == "zstd-stream":
            zstandard: Any = importlib.import_module("zstandard")
            self._compressor = zstandard.ZstdCompressor().compressobj()
            self._zstd_flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK

    @property
    def open(self) -> bool:
        return not self.ws.closed

    async def send(self, payload: dict[str, Any]) -> None:
        text = json.dumps(payload, separators=(",", ":"))
        # One lock per socket: the compression stream must be written in the order it was
        # produced, and both the read loop and test-driven dispatches send.
        async with self._lock:
            if self._compressor is None:
                await self.ws.send_str(text)
            elif self.compress == "zlib-stream":
                data = self._compressor.compress(text.encode())
                data += self._compressor.flush(zlib.Z_SYNC_FLUSH)
                await self.ws.send_bytes(data)
            else:
                data = self._compressor.compress(text.encode())
                data += self._compressor.flush(self._zstd_flush)
                await self.ws.send_bytes(data)
            self.frames_sent += 1


class _Failed(Exception):
    def __init__(self, error: ScriptedError) -> None:
        super().__init__(error.body.get("message"))
        self.error = error


def _route(request: web.Request) -> str:
    """The request's route as the API reference names it: ``POST /channels/{channel_id}/
    messages``."""
    resource = request.match_info.route.resource
    path = "" if resource is None else resource.canonical.removeprefix(API_PREFIX)
    return f"{request.method} {path}"


def _error(status: int, message: str, code: int, **extra: Any) -> ScriptedError:
    return ScriptedError(status, {"message": message, "code": code, **extra})


def _form_error(field_name: str, code: str, message: str) -> _Failed:
    return _Failed(
        _error(
            400,
            "Invalid Form Body",
            50035,
            errors={field_name: {"_errors": [{"code": code, "message": message}]}},
        )
    )


def _unknown_channel() -> _Failed:
    return _Failed(_error(404, "Unknown Channel", 10003))


class FakeDiscord(LoopbackServer):
    """Fake Discord REST API v10 and gateway on 127.0.0.1 with an OS-chosen port."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        bot_username: str = "fakebot",
        limits: Limits | None = None,
    ) -> None:
        super().__init__()
        self.token = token
        # The rate limits enforced (see discord_limits), and their violations; None: none.
        self.limits = limits
        self.heartbeat_interval_ms = 41250
        # How long enforce_nonce remembers a nonce; Discord says "the past few minutes".
        self.nonce_window_s = 300.0
        # RESUME replays every event of the session, not just those after its seq: plays
        # Discord re-sending events the client already saw.
        self.replay_from_start_on_resume = False
        # The ``resume_gateway_url`` READY names instead of the fake's own ``/resume`` (None:
        # its own): an address nothing answers at plays a resume host that is down.
        self.resume_url: str | None = None
        # A RESUME is answered by closing the socket with this code, its session ended (None:
        # resumed as usual): Discord's refusal of a session it will not resume.
        self.resume_close: int | None = None
        # Off: MESSAGE_CREATE/UPDATE go to every identified session whatever its intents. On:
        # as Discord, DMs only to sessions with DIRECT_MESSAGES, guild messages only to those
        # with GUILD_MESSAGES.
        self.dispatch_by_intents = False
        # The privileged intents toggled on in the Developer Portal; IDENTIFY asking for
        # another privileged intent is closed with 4014, as Discord does.
        self.enabled_privileged_intents = INTENT_MESSAGE_CONTENT

        self._ids = self._snowflakes()
        self.application_id = next(self._ids)
        self.bot_user: dict[str, Any] = {
            "id": str(next(self._ids)),
            "username": bot_username,
            "discriminator": "0",
            "global_name": None,
            "avatar": None,
            "bot": True,
            "public_flags": 0,
            "flags": 0,
            "verified": True,
            "mfa_enabled": False,
            "email": None,
            "locale": "en-US",
        }
        # (user, channel, sessions sent to) of each `user_types`, in order.
        self.typing_events: list[tuple[int, int, int]] = []
        self.posts: list[RecordedPost] = []
        # Every answered request to a route that takes the token, in order, refused ones too.
        self.requests: list[RecordedRequest] = []
        self.typing_calls: list[tuple[int, float]] = []
        self.identifies: list[dict[str, Any]] = []
        self.identify_count = 0
        # The token the gateway takes, when it is not the one REST takes (None: the same), and
        # how many IDENTIFYs or RESUMEs it closed with 4004 for a token it did not take.
        self.gateway_token: str | None = None
        self.refused_identifies = 0
        self.resume_count = 0
        self.heartbeat_acks = 0
        # Query parameters of every gateway connection, in order (v, encoding, compress).
        self.gateway_connections: list[dict[str, str]] = []
        # The URL path of every gateway connection, in order: "/gateway" or "/resume".
        self.gateway_paths: list[str] = []
        # How each gateway socket ended, in order: the close code (the client's, or the one
        # the fake sent), None if the socket just died.
        self.close_codes: list[int | None] = []

        self._users: dict[int, dict[str, Any]] = {self.bot_id: self._public_user(self.bot_user)}
        self._channels: dict[int, _Channel] = {}
        self._dm_by_user: dict[int, int] = {}
        self._guild_channel: dict[int, int] = {}
        self._guilds: dict[int, _Guild] = {}
        # Guild events (GUILD_CREATE, CHANNEL_CREATE, THREAD_CREATE) made by the synchronous
        # scripting methods, each with the sessions it is for, not yet dispatched: sent before
        # any later dispatch (so a message never overtakes the channel it is in) or soon by a
        # task of their own. Dispatches hold _events_lock, which keeps that order.
        self._pending_events: list[tuple[list[_Session], str, dict[str, Any]]] = []
        self._events_lock = asyncio.Lock()
        self._messages: dict[int, dict[str, Any]] = {}
        # (author id, nonce as sent) -> (message id, time.monotonic() of creation)
        self._nonces: dict[tuple[int, str], tuple[int, float]] = {}
        self._errors: dict[int | None, list[ScriptedError | None]] = {}
        # channel id -> the error every message POST to it gets (see fail_channel)
        self._channel_errors: dict[int, ScriptedError] = {}
        # "METHOD /route/{param}" -> errors its next requests get (see fail_next_request)
        self._route_errors: dict[str, list[ScriptedError | None]] = {}
        self._attachments: dict[int, _StoredAttachment] = {}
        # Signs attachment URLs, so a URL the bot rebuilt or trimmed is refused as on Discord.
        self._cdn_key = secrets.token_bytes(32)
        # Every request to the fake CDN, in order.
        self.downloads: list[RecordedDownload] = []
        self._post_gate = asyncio.Event()
        self._post_gate.set()
        self._history_gate = asyncio.Event()
        self._history_gate.set()
        # History reads received (held or not), for tests that act while one is in flight.
        self.history_reads = 0
        # The bot's global application commands, as the last PUT left them (ids added).
        self.application_commands: list[dict[str, Any]] = []
        self.interactions: dict[int, RecordedInteraction] = {}
        self._sessions: dict[str, _Session] = {}
        self._connections: set[_Connection] = set()
        # Replaced on every state change so waiters can sleep on "something changed" without
        # polling and without needing a lock from synchronous code paths.
        self._changed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_get("/gateway", self._handle_gateway_ws)
        app.router.add_get("/resume", self._handle_gateway_ws)
        app.router.add_get(f"{API_PREFIX}/gateway", self._handle_get_gateway)
        routes: list[tuple[str, str, Callable[[web.Request], Any]]] = [
            ("GET", "/gateway/bot", self._get_gateway_bot),
            ("GET", "/users/@me", self._get_me),
            ("GET", "/users/{user_id}", self._get_user),
            ("POST", "/users/@me/channels", self._create_dm),
            ("GET", "/oauth2/applications/@me", self._get_application),
            ("GET", "/applications/@me", self._get_application),
            ("GET", "/guilds/{guild_id}", self._get_guild),
            ("GET", "/guilds/{guild_id}/channels", self._get_guild_channels),
            ("GET", "/guilds/{guild_id}/members/{user_id}", self._get_member),
            ("GET", "/channels/{channel_id}", self._get_channel),
            ("POST", "/channels/{channel_id}/messages", self._post_message),
            ("GET", "/channels/{channel_id}/messages", self._get_messages),
            ("GET", "/channels/{channel_id}/messages/{message_id}", self._get_message),
            ("POST", "/channels/{channel_id}/typing", self._post_typing),
            ("PUT", "/applications/{application_id}/commands", self._put_commands),
            ("GET", "/applications/{application_id}/commands", self._get_commands),
        ]
        for method, path, handler in routes:
            # A message POST checks the limits itself, so a refused one is a RecordedPost too.
            checked = handler != self._post_message
            app.router.add_route(method, API_PREFIX + path, self._authenticated(handler, checked))
        # An interaction's token is its credential: the callback takes no bot token.
        app.router.add_post(
            API_PREFIX + "/interactions/{interaction_id}/{token}/callback", self._callback
        )
        # The CDN (cdn.discordapp.com) and its media proxy (media.discordapp.net): no token.
        for prefix in ("", "/media"):
            app.router.add_get(
                prefix + "/attachments/{channel_id}/{attachment_id}/{filename}", self._cdn
            )
        app.router.add_route("*", "/{tail:.*}", self._not_found)

    def _before_stop(self) -> None:
        # Held requests would otherwise keep cleanup waiting until its timeout.
        self._post_gate.set()
        self._history_gate.set()

    async def stop(self) -> None:
        # Websocket handlers run as long as their socket; say goodbye as Discord does on a
        # deploy (1001), so cleanup does not wait on them.
        for conn in list(self._connections):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1001, message=b"fake stopping")
        await super().stop()

    @property
    def api_url(self) -> str:
        """REST base, ``http://127.0.0.1:PORT/api/v10``: what ``Route.BASE`` is set to."""
        return self.origin + API_PREFIX

    @property
    def gateway_url(self) -> str:
        """``ws://127.0.0.1:PORT/gateway``; discord.py appends ``?v=10&encoding=json&...``."""
        return "ws" + self.origin[len("http") :] + "/gateway"

    @property
    def resume_gateway_url(self) -> str:
        """``ws://127.0.0.1:PORT/resume``: the ``resume_gateway_url`` READY hands out."""
        return "ws" + self.origin[len("http") :] + "/resume"

    @property
    def bot_id(self) -> int:
        return int(self.bot_user["id"])

    # -- scripting: REST ---------------------------------------------------------------------

    def fail_next_post(self, channel_id: int | None, *errors: ScriptedError | None) -> None:
        """Queue errors for message POSTs to ``channel_id`` (None: to any channel).

        The next POSTs answer with them, one each, in order, and perform nothing (no message is
        created, no nonce remembered). A None in the queue lets that POST through, so a later
        one can be made to fail. A channel's own queue is used before the any-channel one.
        """
        self._errors.setdefault(channel_id, []).extend(errors)

    def fail_channel(self, channel_id: int, error: ScriptedError | None) -> None:
        """Answer every message POST to ``channel_id`` with ``error`` from now on (after any
        queued by :meth:`fail_next_post`), performing nothing; None lifts it."""
        if error is None:
            self._channel_errors.pop(channel_id, None)
        else:
            self._channel_errors[channel_id] = error

    def fail_next_request(self, route: str, *errors: ScriptedError | None) -> None:
        """Queue errors for the next requests of ``route``, named as the API reference names
        it: ``"POST /channels/{channel_id}/typing"``, ``"PUT /applications/{application_id}/
        commands"``. They answer with them, one each, in order (a None lets that one through),
        perform nothing, and are recorded in ``requests``. For message POSTs use
        :meth:`fail_next_post`, which also records them as posts."""
        self._route_errors.setdefault(route, []).extend(errors)

    @staticmethod
    def missing_access() -> ScriptedError:
        """What a POST to a channel the bot may no longer see gets."""
        return _error(403, "Missing Access", 50001)

    @staticmethod
    def rate_limited(
        retry_after: float, global_: bool = False, scope: str | None = None
    ) -> ScriptedError:
        """A 429 as Discord's API sends it (not Cloudflare's: that one has no ``Via``).
        ``scope``: the ``X-RateLimit-Scope`` it names, if not the one ``global_`` implies
        ("shared" for a resource's limit; "global" without the global flag, as a proxy that
        drops headers might pass it on)."""
        headers = {
            # discord.py reads a 429 without Via as a Cloudflare ban and raises at once.
            "Via": "1.1 google",
            "Retry-After": str(max(1, math.ceil(retry_after))),
            "X-RateLimit-Scope": scope or ("global" if global_ else "user"),
        }
        if global_:
            headers["X-RateLimit-Global"] = "true"
        else:
            headers.update(
                {
                    "X-RateLimit-Limit": "5",
                    "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset-After": f"{retry_after:.3f}",
                    "X-RateLimit-Reset": f"{time.time() + retry_after:.3f}",
                    "X-RateLimit-Bucket": "fakebucket0000000000000000000000",
                }
            )
        body = {"message": "You are being rate limited.", "retry_after": retry_after}
        body["global"] = global_
        return ScriptedError(429, body, headers)

    @staticmethod
    def cannot_dm() -> ScriptedError:
        """What a DM to a user who closed their DMs (or blocked the bot) gets."""
        return _error(403, "Cannot send messages to this user", 50007)

    @staticmethod
    def server_error(status: int = 500) -> ScriptedError:
        reasons = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}
        return _error(status, f"{status}: {reasons.get(status, 'Server Error')}", 0)

    def hold_posts(self, on: bool) -> None:
        """While on, a message POST is performed (the message is created, visible, its nonce
        remembered and dispatched) but its answer is withheld until this is turned off or the
        client disconnects: the window of "crashed after the POST, before the commit"."""
        if on:
            self._post_gate.clear()
        else:
            self._post_gate.set()

    def hold_history(self, on: bool) -> None:
        """While on, channel history reads are answered only once this is turned off: the
        moment a catch-up is reading the history and live messages keep coming."""
        if on:
            self._history_gate.clear()
        else:
            self._history_gate.set()

    # -- scripting: users and channels -------------------------------------------------------

    def dm_channel(self, user_id: int) -> int:
        """The DM channel between the bot and ``user_id``, made on first use."""
        channel_id = self._dm_by_user.get(user_id)
        if channel_id is None:
            self._user(user_id)
            channel_id = next(self._ids)
            self._channels[channel_id] = _Channel(channel_id, 1, recipient_id=user_id)
            self._dm_by_user[user_id] = channel_id
        return channel_id

    def guild(self, guild_id: int, *, name: str | None = None) -> int:
        """The guild ``guild_id``, with the bot in it, made on first use (``name`` names a new
        one, else ``guild-<id>``). Connected sessions with the GUILDS intent are sent its
        ``GUILD_CREATE``, as when a bot joins a server; every later IDENTIFY finds it in READY.
        Returns ``guild_id``."""
        self._ensure_guild(guild_id, name)
        return guild_id

    def guild_channel(
        self, guild_id: int, channel_id: int | None = None, *, name: str | None = None
    ) -> int:
        """A text channel in ``guild_id`` (the guild's default one unless ``channel_id``),
        made on first use with the guild if need be (:meth:`guild`); ``name`` names a new one,
        else ``channel-<id>``. A new channel in a guild the sessions know is announced by
        ``CHANNEL_CREATE`` (GUILDS intent). A thread's id is accepted too: the thread."""
        if channel_id is None:
            channel_id = self._guild_channel.get(guild_id)
            if channel_id is None:
                channel_id = self._next_id()
                self._guild_channel[guild_id] = channel_id
        existing = self._channels.get(channel_id)
        if existing is not None:
            if existing.guild_id != guild_id:
                raise ValueError(f"channel {channel_id} is not in guild {guild_id}")
            return channel_id
        guild, announced = self._ensure_guild(guild_id, None, announce=False)
        channel = _Channel(channel_id, CHANNEL_GUILD_TEXT, guild_id=guild_id, name=name)
        self._channels[channel_id] = channel
        guild.channel_ids.append(channel_id)
        if announced:
            self._announce("CHANNEL_CREATE", self._channel_object(channel))
        else:
            self._announce("GUILD_CREATE", self._guild_create(guild))
        return channel_id

    def thread(
        self,
        guild_id: int,
        parent_channel_id: int,
        thread_id: int | None = None,
        *,
        name: str | None = None,
        owner_id: int | None = None,
    ) -> int:
        """A public thread (channel type 11) in the text channel ``parent_channel_id`` of
        ``guild_id`` (both made if need be), started by ``owner_id`` (default: the guild's
        owner); ``thread_id`` None makes a new one, an existing id returns that thread.
        Connected sessions with the GUILDS intent get ``THREAD_CREATE`` (``newly_created``).
        Users write in it with ``user_sends(..., guild_id=guild_id, channel_id=thread_id)``;
        its messages reach the gateway with ``guild_id`` and ``channel_id`` the thread's."""
        parent = self._channels.get(parent_channel_id)
        if parent is None:
            self.guild_channel(guild_id, parent_channel_id)
        elif parent.guild_id != guild_id or parent.type != CHANNEL_GUILD_TEXT:
            raise ValueError(f"channel {parent_channel_id} is no text channel of {guild_id}")
        guild = self._guilds[guild_id]
        if thread_id is not None and thread_id in self._channels:
            existing = self._channels[thread_id]
            if existing.type != CHANNEL_PUBLIC_THREAD or existing.parent_id != parent_channel_id:
                raise ValueError(f"channel {thread_id} is no thread of {parent_channel_id}")
            return thread_id
        thread_id = self._next_id() if thread_id is None else thread_id
        owner = guild.owner_id if owner_id is None else owner_id
        self._user(owner)
        self._join(guild, owner)
        channel = _Channel(
            thread_id,
            CHANNEL_PUBLIC_THREAD,
            guild_id=guild_id,
            name=name,
            parent_id=parent_channel_id,
            owner_id=owner,
        )
        self._channels[thread_id] = channel
        guild.thread_ids.append(thread_id)
        self._announce("THREAD_CREATE", {**self._channel_object(channel), "newly_created": True})
        return thread_id

    def _ensure_guild(
        self, guild_id: int, name: str | None, *, announce: bool = True
    ) -> tuple[_Guild, bool]:
        """The guild, made if need be; and whether it existed (was announced) already."""
        guild = self._guilds.get(guild_id)
        if guild is not None:
            return guild, True
        owner_id = self._next_id()
        self._user(owner_id)
        guild = _Guild(
            id=guild_id,
            name=name or f"guild-{guild_id}",
            owner_id=owner_id,
            joined_at=_iso(int(time.time() * 1000)),
        )
        self._guilds[guild_id] = guild
        self._join(guild, self.bot_id)
        self._join(guild, owner_id)
        if announce:
            self._announce("GUILD_CREATE", self._guild_create(guild))
        return guild, False

    @staticmethod
    def _join(guild: _Guild, user_id: int) -> dict[str, Any]:
        return guild.members.setdefault(
            user_id, {"nick": None, "joined_at": _iso(int(time.time() * 1000))}
        )

    @staticmethod
    def attachment(
        filename: str, content_type: str, size: int, *, attachment_id: int | None = None
    ) -> dict[str, Any]:
        """An attachment object as Discord puts it in a message, metadata only: its URL is the
        real CDN's and nothing serves it. Use :meth:`add_attachment` for one to download."""
        ident = attachment_id if attachment_id is not None else secrets.randbits(60)
        url = f"https://cdn.discordapp.com/attachments/0/{ident}/{filename}"
        return {
            "id": str(ident),
            "filename": filename,
            "size": size,
            "url": url,
            "proxy_url": url.replace("cdn.discordapp.com", "media.discordapp.net"),
            "content_type": content_type,
        }

    async def user_sends(
        self,
        user_id: int,
        content: str,
        *,
        attachments: list[dict[str, Any]] | None = None,
        flags: int = 0,
        sticker_items: list[dict[str, Any]] | None = None,
        guild_id: int | None = None,
        channel_id: int | None = None,
        bot: bool = False,
        dispatch: bool = True,
        reply_to: int | None = None,
        mention_author: bool = True,
        name: str | None = None,
        nick: str | None = None,
        webhook: bool = False,
    ) -> dict[str, Any]:
        """``user_id`` posts a message: to their DM with the bot, unless ``guild_id`` or
        ``channel_id`` say otherwise (a guild's text channel or thread, see :meth:`thread`).
        It is stored in the channel history and dispatched as ``MESSAGE_CREATE`` (unless
        ``dispatch`` is false: an event the gateway lost, found only in the history); returns
        the message as the gateway carries it.

        ``attachments`` are objects from :meth:`add_attachment` (downloadable) or
        :meth:`attachment` (metadata only); ``flags`` are message flags
        (:data:`MESSAGE_FLAG_IS_VOICE_MESSAGE`, see :meth:`user_sends_voice`);
        ``sticker_items`` are objects from :meth:`sticker`. ``bot`` makes the author a bot
        (``author.bot``, from now on). ``name`` sets the user's display name (``global_name``)
        and ``nick`` their nickname in the guild (``member.nick``), both from now on.
        ``webhook``: a webhook posts it (``webhook_id``, the author's id, as Discord shows a
        webhook's post; its author is not marked a bot).

        ``reply_to`` names a message of the same channel (the bot's or anyone's): the message
        is a reply (type 19) with ``message_reference`` and ``referenced_message``, and, as
        Discord's clients do unless the ping is switched off (``mention_author`` false), it
        mentions the replied-to author. ``<@id>`` and ``<@!id>`` in ``content`` mention a
        user the fake knows."""
        if guild_id is not None:
            channel_id = self.guild_channel(guild_id, channel_id)
        elif channel_id is None:
            channel_id = self.dm_channel(user_id)
        elif channel_id not in self._channels:
            raise ValueError(f"unknown channel {channel_id}: pass guild_id to create it")
        channel = self._channels[channel_id]
        user = self._user(user_id)
        if bot:
            user["bot"] = True
        if name is not None:
            user["global_name"] = name
        if channel.guild_id is not None:
            member = self._join(self._guilds[channel.guild_id], user_id)
            if nick is not None:
                member["nick"] = nick
        referenced = None
        if reply_to is not None:
            referenced = self._messages.get(reply_to)
            if referenced is None or int(referenced["channel_id"]) != channel_id:
                raise ValueError(f"no message {reply_to} in channel {channel_id} to reply to")
        for attachment in attachments or []:
            self._bind(attachment, channel_id)
        mentions = self._mentions(content)
        if referenced is not None and mention_author:
            mentions = self._with_mention(mentions, int(referenced["author"]["id"]), user_id)
        message = self._new_message(
            channel_id,
            user,
            content,
            attachments or [],
            flags=flags,
            sticker_items=sticker_items,
            reference=None if reply_to is None else {"message_id": reply_to},
            referenced=referenced,
            mentions=mentions,
        )
        if webhook:
            message["webhook_id"] = str(user_id)
        payload = self._gateway_message(message)
        if dispatch:
            await self._dispatch_message("MESSAGE_CREATE", payload)
        return payload

    async def user_types(self, user_id: int, *, channel_id: int | None = None) -> int:
        """``user_id`` starts typing: in their DM with the bot, unless ``channel_id`` names a
        guild's channel or thread. Discord sends ``TYPING_START`` only to sessions with the
        direct (or guild) message typing intent, whatever ``dispatch_by_intents`` says; a
        client repeats it about every 8-10 s while its user keeps typing, which a test plays
        by calling this again. Returns how many sessions it was sent to."""
        if channel_id is None:
            channel_id = self.dm_channel(user_id)
        channel = self._channels[channel_id]
        data: dict[str, Any] = {
            "channel_id": str(channel_id),
            "user_id": str(user_id),
            "timestamp": int(time.time()),
        }
        bit = INTENT_DIRECT_MESSAGE_TYPING
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
            bit = INTENT_GUILD_MESSAGE_TYPING
        sent = 0
        async with self._events_lock:
            await self._flush_events()
            for session in self._live_sessions():
                if session.intents & bit:
                    await self._dispatch(session, "TYPING_START", data)
                    sent += 1
        self.typing_events.append((user_id, channel_id, sent))
        self._notify()
        return sent

    async def user_uses_command(self, user_id: int, name: str, arguments: str = "") -> int:
        """``user_id`` picks the slash command ``name`` from the ``/`` menu in their DM with the
        bot, with ``arguments`` in its first option (which the command must have). Discord
        offers only a registered command usable in the bot's DM, so any other is an
        AssertionError. Dispatched as ``INTERACTION_CREATE``; returns the interaction's id."""
        command = next((c for c in self.application_commands if c["name"] == name), None)
        assert command is not None, f"/{name} is not a registered application command"
        assert CONTEXT_BOT_DM in (command.get("contexts") or [CONTEXT_BOT_DM]), (
            f"/{name} is not usable in DMs"
        )
        channel_id = self.dm_channel(user_id)
        data: dict[str, Any] = {"id": command["id"], "name": name, "type": 1}
        if arguments:
            options = command.get("options") or []
            assert options, f"/{name} takes no options"
            data["options"] = [{"name": options[0]["name"], "type": 3, "value": arguments}]
        interaction_id = self._next_id()
        token = secrets.token_urlsafe(32)
        self.interactions[interaction_id] = RecordedInteraction(
            interaction_id, token, channel_id, user_id, name, time.monotonic()
        )
        payload = {
            "id": str(interaction_id),
            "application_id": str(self.application_id),
            "type": 2,
            "data": data,
            "channel": self._channel_object(self._channels[channel_id]),
            "channel_id": str(channel_id),
            "user": self._public_user(self._user(user_id)),
            "token": token,
            "version": 1,
            "app_permissions": "0",
            "locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(user_id)},
            "context": CONTEXT_BOT_DM,
            "attachment_size_limit": 10 * 1024 * 1024,
        }
        async with self._events_lock:
            await self._flush_events()
            for session in list(self._sessions.values()):
                if not session.invalidated:
                    await self._dispatch(session, "INTERACTION_CREATE", payload)
        self._notify()
        return interaction_id

    async def user_sends_voice(
        self, user_id: int, data: bytes, *, duration_secs: float = 2.5, expired: bool = False
    ) -> dict[str, Any]:
        """``user_id`` records a voice message in their DM: what Discord's clients send, flag
        ``IS_VOICE_MESSAGE``, no content and one ``voice-message.ogg`` (``audio/ogg``) whose
        bytes are ``data``. Returns the message as the gateway carries it."""
        voice = self.add_attachment(
            data,
            "voice-message.ogg",
            "audio/ogg",
            voice=True,
            duration_secs=duration_secs,
            expired=expired,
        )
        return await self.user_sends(
            user_id, "", attachments=[voice], flags=MESSAGE_FLAG_IS_VOICE_MESSAGE
        )

    async def user_edits(self, message_id: int, new_content: str) -> dict[str, Any]:
        """Edit a stored message; dispatches ``MESSAGE_UPDATE`` with the full message (as
        Discord does for DMs). Returns that payload."""
        message = self._messages.get(message_id)
        if message is None:
            raise KeyError(f"unknown message {message_id}")
        message["content"] = new_content
        message["edited_timestamp"] = _iso(int(time.time() * 1000))
        mentions = self._mentions(new_content)
        replied = message.get("referenced_message")
        pinged = {m["id"] for m in message["mentions"]}
        if replied is not None and replied["author"]["id"] in pinged:
            # The reply's ping stays with the message whatever its new text says.
            author_id = int(message["author"]["id"])
            mentions = self._with_mention(mentions, int(replied["author"]["id"]), author_id)
        message["mentions"] = mentions
        payload = self._gateway_message(message)
        await self._dispatch_message("MESSAGE_UPDATE", payload)
        return payload

    async def redeliver(self, message_id: int) -> dict[str, Any]:
        """Dispatch ``MESSAGE_CREATE`` again for a stored message, unchanged, with a new
        sequence number: the same event delivered twice, as a replay after a RESUME does.
        Returns the payload."""
        message = self._messages.get(message_id)
        if message is None:
            raise KeyError(f"unknown message {message_id}")
        payload = self._gateway_message(message)
        await self._dispatch_message("MESSAGE_CREATE", payload)
        return payload

    # -- scripting: attachments and the CDN --------------------------------------------------

    def add_attachment(
        self,
        data: bytes,
        filename: str,
        content_type: str | None,
        *,
        channel_id: int | None = None,
        voice: bool = False,
        duration_secs: float = 2.5,
        expired: bool = False,
        declared_size: int | None = None,
    ) -> dict[str, Any]:
        """An attachment whose bytes the fake CDN serves, as Discord puts it in a message.

        Its ``url`` (and ``proxy_url``, the media proxy's) is signed and names ``channel_id``;
        when that is None, the channel the attachment is first sent in by :meth:`user_sends`,
        the URLs (naming channel 0 until then) being rewritten in this very dict (on Discord a
        file is uploaded to the channel it is posted in). ``voice`` adds ``duration_secs`` and
        a ``waveform``, which make discord.py's ``Attachment.is_voice_message()`` true.
        ``expired`` hands out a URL whose ``ex`` is already past (the CDN answers 404);
        ``declared_size`` puts another ``size`` in the object than the bytes served, to play a
        huge file without one.
        ``content_type`` None leaves the field out, as Discord does for unknown types.
        """
        now = int(time.time())
        issued = now - ATTACHMENT_URL_TTL_S - 3600 if expired else now
        obj: dict[str, Any] = {
            "id": str(self._next_id()),
            "filename": filename,
            "size": len(data) if declared_size is None else declared_size,
        }
        if content_type is not None:
            obj["content_type"] = content_type
        if voice:
            obj["duration_secs"] = duration_secs
            obj["waveform"] = base64.b64encode(_waveform(data)).decode()
        stored = _StoredAttachment(
            id=int(obj["id"]),
            filename=filename,
            data=data,
            content_type=content_type,
            channel_id=channel_id,
            issued_s=issued,
            expires_s=issued + ATTACHMENT_URL_TTL_S,
            expired=False,
            obj=obj,
        )
        self._attachments[stored.id] = stored
        self._sign(stored)
        return obj

    def expire(self, attachment_id: int) -> None:
        """From now on the CDN answers every URL of the attachment with 404 ``CDN_GONE``: its
        URL ran out while the message waited, or the message was deleted."""
        self._attachments[attachment_id].expired = True

    def sticker(self, name: str, *, format_type: int = 1) -> dict[str, Any]:
        """A sticker item as a message's ``sticker_items`` carries it (format 1 PNG, 2 APNG,
        3 Lottie, 4 GIF); stickers have no bytes here, only what discord.py's StickerItem
        reads."""
        return {"id": str(self._next_id()), "name": name, "format_type": format_type}

    def downloads_of(self, attachment_id: int) -> list[RecordedDownload]:
        """The CDN requests for one attachment, in order."""
        return [d for d in self.downloads if d.attachment_id == attachment_id]

    def _bind(self, attachment: dict[str, Any], channel_id: int) -> None:
        """Give an attachment sent before it named a channel its URLs in ``channel_id``."""
        stored = self._attachments.get(_digits(attachment.get("id")) or 0)
        if stored is not None and stored.obj is attachment and stored.channel_id is None:
            stored.channel_id = channel_id
            self._sign(stored)

    def _signature(self, attachment_id: int, ex: str, issued: str) -> str:
        message = f"{attachment_id}:{ex}:{issued}".encode()
        return hmac.new(self._cdn_key, message, hashlib.sha256).hexdigest()

    def _sign(self, stored: _StoredAttachment) -> None:
        """Write the signed ``url`` and ``proxy_url`` into the attachment's object."""
        ex, issued = f"{stored.expires_s:x}", f"{stored.issued_s:x}"
        path = f"/attachments/{stored.channel_id or 0}/{stored.id}/{quote(stored.filename, '')}"
        query = f"?ex={ex}&is={issued}&hm={self._signature(stored.id, ex, issued)}&"
        stored.obj["url"] = self.origin + path + query
        stored.obj["proxy_url"] = self.origin + "/media" + path + query

    def _serves(self, stored: _StoredAttachment | None, request: web.Request) -> bool:
        """Whether the CDN hands out the bytes for this request: the URL is the one the fake
        signed for ``stored``, unexpired, and the attachment was not expired since."""
        if stored is None or stored.expired:
            return False
        info, query = request.match_info, request.query
        ex, issued, hm = query.get("ex", ""), query.get("is", ""), query.get("hm", "")
        return (
            info["channel_id"] == str(stored.channel_id or 0)
            and info["filename"] == stored.filename
            and hmac.compare_digest(hm, self._signature(stored.id, ex, issued))
            and (_hex(ex) or 0) > time.time()
        )

    async def _cdn(self, request: web.Request) -> web.Response:
        attachment_id = _digits(request.match_info["attachment_id"])
        stored = self._attachments.get(attachment_id or 0)
        ok = self._serves(stored, request)
        self.downloads.append(
            RecordedDownload(
                attachment_id=attachment_id if stored is not None else None,
                path=request.path,
                query=dict(request.query),
                status=200 if ok else 404,
                at=time.monotonic(),
                method=request.method,
            )
        )
        self._notify()
        if not ok or stored is None:
            return web.Response(status=404, text=CDN_GONE)
        content_type = stored.content_type or "application/octet-stream"
        return web.Response(body=stored.data, headers={"Content-Type": content_type})

    # -- scripting: gateway ------------------------------------------------------------------

    async def request_reconnect(self) -> None:
        """Send op 7 RECONNECT to every connected session; discord.py then RESUMEs."""
        for session in self._live_sessions():
            conn = session.connection
            assert conn is not None
            # Detached at once: what is dispatched from now on is logged for the RESUME.
            session.connection = None
            with contextlib.suppress(ConnectionError, RuntimeError):
                await conn.send({"op": OP_RECONNECT, "d": None, "s": None, "t": None})
        self._notify()

    async def drop_connections(self, code: int = CLOSE_UNKNOWN_ERROR) -> None:
        """Close every gateway socket with ``code``. Sessions stay resumable unless the code is
        one after which Discord requires a new IDENTIFY (4004, 4007, 4009, 4010-4014)."""
        for conn in list(self._connections):
            session = conn.session
            if session is not None:
                session.connection = None
                if code in _SESSION_ENDING_CLOSES:
                    session.invalidated = True
            conn.session = None
            with contextlib.suppress(Exception):
                await conn.ws.close(code=code, message=b"dropped by test")
        self._notify()

    async def invalidate_sessions(self) -> None:
        """End every session; connected ones get op 9 INVALID_SESSION ``false``."""
        for session in self._sessions.values():
            session.invalidated = True
            conn = session.connection
            session.connection = None
            if conn is not None:
                conn.session = None
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await conn.send({"op": OP_INVALID_SESSION, "d": False, "s": None, "t": None})
        self._notify()

    # -- observation -------------------------------------------------------------------------

    def bot_messages(self, channel_id: int) -> list[dict[str, Any]]:
        """Visible messages authored by the bot in ``channel_id``, oldest first."""
        channel = self._channels.get(channel_id)
        if channel is None:
            return []
        return [m for m in channel.messages if m["author"]["id"] == self.bot_user["id"]]

    def messages(self, channel_id: int) -> list[dict[str, Any]]:
        """Every message in ``channel_id``, oldest first."""
        channel = self._channels.get(channel_id)
        return list(channel.messages) if channel is not None else []

    def received_all(self) -> bool:
        """Whether every connected client has reported, in a heartbeat, the sequence number of
        the last event dispatched to its session: it has received them all."""
        return all(s.heartbeat_seq == s.seq for s in self._live_sessions())

    def first_event(self, message_id: int) -> tuple[str, int] | None:
        """(session id, sequence number) of the first ``MESSAGE_CREATE`` that carried
        ``message_id``, sessions taken in the order they were made; None if none did."""
        for session in self._sessions.values():
            for frame in session.log:
                if frame["t"] == "MESSAGE_CREATE" and frame["d"].get("id") == str(message_id):
                    return session.id, int(frame["s"])
        return None

    def requests_to(self, method: str, path: str) -> list[RecordedRequest]:
        """The requests to one route, e.g. ``("GET", "/users/@me")``: each login's, in order."""
        return [r for r in self.requests if r.method == method and r.path == path]

    def connected_sessions(self) -> int:
        """Sessions that are identified, not invalidated, and have an open socket."""
        return len(self._live_sessions())

    async def wait_for(
        self,
        predicate: Callable[[], bool],
        # A plain parameter, as in the other fakes: a hung test fails fast with a default.
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until ``predicate()`` holds; it is re-checked on every change in the fake
        (a request, a frame, a connection opening or closing). TimeoutError after ``timeout``.
        """
        async with asyncio.timeout(timeout):
            while not predicate():
                await self._changed.wait()

    async def wait_for_bot_messages(
        self,
        channel_id: int,
        n: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[dict[str, Any]]:
        """Wait until the bot has at least ``n`` visible messages in the channel; return them."""
        await self.wait_for(lambda: len(self.bot_messages(channel_id)) >= n, timeout)
        return self.bot_messages(channel_id)

    async def wait_for_sessions(
        self,
        n: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until exactly ``n`` sessions are connected (0 waits for all to go away)."""
        await self.wait_for(lambda: self.connected_sessions() == n, timeout)

    def _notify(self) -> None:
        changed = self._changed
        self._changed = asyncio.Event()
        changed.set()

    # -- model -------------------------------------------------------------------------------

    @staticmethod
    def _snowflakes() -> itertools.count[int]:
        # A counter seeded from now: monotonic whatever the clock does, and each id still
        # decodes to about the moment it was made (ids are made far below 4096 per ms).
        start_ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
        return itertools.count(start_ms << 22, 1)

    def _next_id(self) -> int:
        # Re-seed when the clock has moved past the counter, so a message's id carries its
        # creation time as on Discord (history by time relies on that).
        candidate = next(self._ids)
        now = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        if now > candidate:
            self._ids = itertools.count(now + 1, 1)
            return now
        return candidate

    @staticmethod
    def _public_user(user: dict[str, Any]) -> dict[str, Any]:
        keys = ("id", "username", "discriminator", "global_name", "avatar", "public_flags")
        public = {k: user[k] for k in keys}
        if user.get("bot"):
            public["bot"] = True
        return public

    def _user(self, user_id: int) -> dict[str, Any]:
        user = self._users.get(user_id)
        if user is None:
            user = {
                "id": str(user_id),
                "username": f"user{user_id}",
                "discriminator": "0",
                "global_name": f"User {user_id}",
                "avatar": None,
                "public_flags": 0,
            }
            self._users[user_id] = user
        return user

    def _mentions(self, content: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for match in _MENTION_RE.finditer(content):
            user = self._users.get(int(match.group(1)))
            if user is not None and user not in found:
                found.append(dict(user))
        return found

    def _with_mention(
        self, mentions: list[dict[str, Any]], user_id: int, author_id: int
    ) -> list[dict[str, Any]]:
        """``mentions`` with ``user_id`` added (a reply's ping): no one is pinged twice, and
        no one by their own reply."""
        if user_id == author_id or any(m["id"] == str(user_id) for m in mentions):
            return mentions
        user = self._users.get(user_id)
        return [*mentions, dict(user)] if user is not None else mentions

    def _new_message(
        self,
        channel_id: int,
        author: dict[str, Any],
        content: str,
        attachments: list[dict[str, Any]],
        *,
        nonce: str | int | None = None,
        tts: bool = False,
        embeds: list[Any] | None = None,
        reference: dict[str, Any] | None = None,
        referenced: dict[str, Any] | None = None,
        mentions: list[dict[str, Any]] | None = None,
        mention_everyone: bool | None = None,
        flags: int = 0,
        sticker_items: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Store a new message. ``mentions`` None: the users ``content`` mentions; a
        ``reference`` (as a POST body has it) makes a reply to ``referenced``, the stored
        message it names (None: unknown, kept as Discord keeps a deleted one)."""
        channel = self._channels[channel_id]
        message_id = self._next_id()
        if mention_everyone is None:
            mention_everyone = "@everyone" in content or "@here" in content
        message: dict[str, Any] = {
            "id": str(message_id),
            "type": MESSAGE_TYPE_DEFAULT,
            "channel_id": str(channel_id),
            "author": self._public_user(author),
            "content": content,
            "timestamp": _iso(snowflake_time_ms(message_id)),
            "edited_timestamp": None,
            "tts": tts,
            "mention_everyone": mention_everyone,
            "mentions": self._mentions(content) if mentions is None else mentions,
            "mention_roles": _ROLE_MENTION_RE.findall(content),
            "attachments": attachments,
            "embeds": embeds or [],
            "pinned": False,
            "flags": flags,
            "components": [],
        }
        if sticker_items:
            message["sticker_items"] = sticker_items
        if nonce is not None:
            message["nonce"] = nonce
        if reference is not None:
            kind = reference.get("type", REFERENCE_REPLY)
            source = channel
            if referenced is not None:
                source = self._channels[int(referenced["channel_id"])]
            stored_reference: dict[str, Any] = {
                "type": kind,
                "message_id": str(reference.get("message_id")),
                "channel_id": str(source.id),
            }
            if source.guild_id is not None:
                stored_reference["guild_id"] = str(source.guild_id)
            message["message_reference"] = stored_reference
            if kind == REFERENCE_REPLY:
                message["type"] = MESSAGE_TYPE_REPLY
                # One level deep, as on Discord: the replied-to message without its own.
                message["referenced_message"] = (
                    None
                    if referenced is None
                    else {k: v for k, v in referenced.items() if k != "referenced_message"}
                )
        channel.messages.append(message)
        self._messages[message_id] = message
        self._notify()
        return message

    def _member_object(
        self, guild: _Guild, user_id: int, *, with_user: bool = True
    ) -> dict[str, Any]:
        """A guild member as the gateway carries it (``with_user``: as GUILD_CREATE lists it;
        without: as a message's ``member`` or a mention's)."""
        known = guild.members.get(user_id) or self._join(guild, user_id)
        member: dict[str, Any] = {
            "roles": [],
            "joined_at": known["joined_at"],
            "deaf": False,
            "mute": False,
            "flags": 0,
            "nick": known["nick"],
            "avatar": None,
            "premium_since": None,
            "pending": False,
        }
        if with_user:
            member["user"] = self._public_user(self._user(user_id))
        return member

    def _gateway_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """The stored message as the gateway carries it: guild messages add guild_id, the
        author's member object and each mentioned member's (REST history has neither member
        nor, for DMs, guild_id)."""
        payload = json.loads(json.dumps(message))
        channel = self._channels[int(message["channel_id"])]
        if channel.guild_id is not None:
            guild = self._guilds[channel.guild_id]
            payload["guild_id"] = str(channel.guild_id)
            author_id = int(message["author"]["id"])
            payload["member"] = self._member_object(guild, author_id, with_user=False)
            for mention in payload["mentions"]:
                if int(mention["id"]) in guild.members:
                    mention["member"] = self._member_object(
                        guild, int(mention["id"]), with_user=False
                    )
        return dict(payload)

    def _channel_object(self, channel: _Channel) -> dict[str, Any]:
        last = channel.messages[-1]["id"] if channel.messages else None
        if channel.type == CHANNEL_DM:
            assert channel.recipient_id is not None
            return {
                "id": str(channel.id),
                "type": CHANNEL_DM,
                "last_message_id": last,
                "flags": 0,
                "recipients": [self._public_user(self._users[channel.recipient_id])],
            }
        if channel.type == CHANNEL_PUBLIC_THREAD:
            created = _iso(snowflake_time_ms(channel.id))
            authors = {m["author"]["id"] for m in channel.messages} | {str(channel.owner_id)}
            return {
                "id": str(channel.id),
                "type": CHANNEL_PUBLIC_THREAD,
                "guild_id": str(channel.guild_id),
                "parent_id": str(channel.parent_id),
                "owner_id": str(channel.owner_id),
                "name": channel.name or f"thread-{channel.id}",
                "last_message_id": last,
                "rate_limit_per_user": 0,
                "flags": 0,
                "message_count": len(channel.messages),
                "total_message_sent": len(channel.messages),
                "member_count": min(len(authors), 50),
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": THREAD_AUTO_ARCHIVE_MIN,
                    "archive_timestamp": created,
                    "locked": False,
                    "create_timestamp": created,
                },
            }
        return {
            "id": str(channel.id),
            "type": CHANNEL_GUILD_TEXT,
            "guild_id": str(channel.guild_id),
            "name": channel.name or f"channel-{channel.id}",
            "position": 0,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
            "topic": None,
            "rate_limit_per_user": 0,
            "last_message_id": last,
            "flags": 0,
        }

    def _guild_object(self, guild: _Guild) -> dict[str, Any]:
        """A guild as ``GET /guilds/{id}`` answers it."""
        everyone = {
            "id": str(guild.id),
            "name": "@everyone",
            "color": 0,
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": 0,
            "permissions": str(EVERYONE_PERMISSIONS),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }
        return {
            "id": str(guild.id),
            "name": guild.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(guild.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 1,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "roles": [everyone, self._bot_role(guild)],
            "emojis": [],
            "stickers": [],
            "features": [],
            "application_id": None,
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "vanity_url_code": None,
            "max_members": 500000,
        }

    def bot_role(self, guild_id: int) -> int:
        """The id of the bot's managed role in the guild (``<@&id>`` mentions it)."""
        return guild_id + BOT_ROLE_OFFSET

    def _bot_role(self, guild: _Guild) -> dict[str, Any]:
        """The role Discord makes for a bot in a guild it joins: managed, tagged with the bot."""
        return {
            "id": str(self.bot_role(guild.id)),
            "name": self.bot_user["username"],
            "color": 0,
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": 1,
            "permissions": str(EVERYONE_PERMISSIONS),
            "managed": True,
            "mentionable": True,
            "flags": 0,
            "tags": {"bot_id": str(self.bot_id)},
        }

    def _guild_create(self, guild: _Guild, *, available: bool = False) -> dict[str, Any]:
        """``GUILD_CREATE``'s payload: the guild with its channels, active threads and members.
        ``available``: the lazy load after READY, where Discord says ``unavailable: false``; a
        guild joined while connected comes without it (discord.py's ``on_guild_join``)."""
        payload = {
            **self._guild_object(guild),
            "joined_at": guild.joined_at,
            "large": False,
            "member_count": len(guild.members),
            "members": [self._member_object(guild, uid) for uid in list(guild.members)],
            "channels": [self._channel_object(self._channels[c]) for c in guild.channel_ids],
            "threads": [self._channel_object(self._channels[t]) for t in guild.thread_ids],
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }
        if available:
            payload["unavailable"] = False
        return payload

    def _announce(self, event: str, payload: dict[str, Any]) -> None:
        """Queue a guild event for every session with the GUILDS intent (a disconnected one
        gets it on RESUME); sent before any later dispatch, or soon by a task."""
        targets = [
            s for s in self._sessions.values() if not s.invalidated and s.intents & INTENT_GUILDS
        ]
        if not targets:
            return
        self._pending_events.append((targets, event, payload))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sent with the next dispatch
        task = loop.create_task(self._flush_soon())
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _flush_soon(self) -> None:
        async with self._events_lock:
            await self._flush_events()
        self._notify()

    async def _flush_events(self) -> None:
        """Dispatch the queued guild events, in order; the caller holds ``_events_lock``."""
        while self._pending_events:
            targets, event, payload = self._pending_events.pop(0)
            for session in targets:
                if not session.invalidated:
                    await self._dispatch(session, event, self._guild_shaped(session, payload))

    def _guild_shaped(self, session: _Session, payload: dict[str, Any]) -> dict[str, Any]:
        """A GUILD_CREATE as ``session`` gets it: without the presences intent its members
        are the bot alone (Discord's rule; ``member_count`` still counts all of them), and a
        client with the members intent asks for the rest (GUILD_MEMBERS_CHUNK)."""
        if "members" not in payload or session.intents & INTENT_GUILD_PRESENCES:
            return payload
        own = [m for m in payload["members"] if m["user"]["id"] == self.bot_user["id"]]
        return {**payload, "members": own}

    # -- gateway: dispatch -------------------------------------------------------------------

    def _live_sessions(self) -> list[_Session]:
        return [
            s
            for s in self._sessions.values()
            if not s.invalidated and s.connection is not None and s.connection.open
        ]

    def _wants(self, session: _Session, payload: dict[str, Any]) -> bool:
        if not self.dispatch_by_intents:
            return True
        bit = INTENT_GUILD_MESSAGES if "guild_id" in payload else INTENT_DIRECT_MESSAGES
        return bool(session.intents & bit)

    def _shaped_for(
        self, session: _Session, payload: dict[str, Any], in_guild: bool | None = None
    ) -> dict[str, Any]:
        # Discord blanks guild message content for sessions without the message content
        # intent, except the bot's own messages and those that mention it (a reply's ping
        # too). DMs are exempt. A reply's referenced_message is judged on its own.
        if in_guild is None:
            in_guild = "guild_id" in payload
        if not in_guild or session.intents & INTENT_MESSAGE_CONTENT:
            return payload
        shaped = payload
        replied = payload.get("referenced_message")
        if replied is not None:
            shaped = {**payload, "referenced_message": self._shaped_for(session, replied, True)}
        if payload["author"]["id"] == self.bot_user["id"] or any(
            m["id"] == self.bot_user["id"] for m in payload["mentions"]
        ):
            return shaped
        return {**shaped, "content": "", "embeds": [], "attachments": [], "components": []}

    async def _dispatch_message(self, event: str, payload: dict[str, Any]) -> None:
        async with self._events_lock:
            # Guild events queued before it first: the channel a message is in is known.
            await self._flush_events()
            for session in list(self._sessions.values()):
                if session.invalidated or not self._wants(session, payload):
                    continue
                await self._dispatch(session, event, self._shaped_for(session, payload))
        self._notify()

    async def _dispatch(self, session: _Session, event: str, data: dict[str, Any]) -> None:
        session.seq += 1
        frame = {"op": OP_DISPATCH, "d": data, "s": session.seq, "t": event}
        session.log.append(frame)
        conn = session.connection
        if conn is not None and conn.open:
            try:
                await conn.send(frame)
            except (ConnectionError, RuntimeError):
                # The client vanished mid-send; the frame is in the log for a RESUME.
                if session.connection is conn:
                    session.connection = None

    # -- gateway: the socket -----------------------------------------------------------------

    async def _handle_gateway_ws(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        self.gateway_connections.append(params)
        self.gateway_paths.append(request.path)
        compress = params.get("compress")
        encoding = params.get("encoding", "json")
        # Permessage-deflate off: Discord compresses at the payload level (zlib-stream).
        ws = web.WebSocketResponse(compress=False, timeout=1.0, max_msg_size=0)
        await ws.prepare(request)
        unsupported = encoding != "json" or compress not in (None, "zlib-stream", "zstd-stream")
        if compress == "zstd-stream" and importlib.util.find_spec("zstandard") is None:
            unsupported = True
        if unsupported:
            await ws.close(code=CLOSE_UNKNOWN_ERROR, message=b"unsupported encoding/compress")
            return ws
        conn = _Connection(ws, compress)
        self._connections.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        self._notify()
        try:
            await conn.send(
                {
                    "op": OP_HELLO,
                    "d": {"heartbeat_interval": self.heartbeat_interval_ms},
                    "s": None,
                    "t": None,
                }
            )
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT and msg.type is not WSMsgType.BINARY:
                    break
                raw = msg.data if isinstance(msg.data, str) else bytes(msg.data).decode()
                try:
                    payload = json.loads(raw)
                    op = payload["op"]
                except (ValueError, KeyError, TypeError):
                    await ws.close(
                        code=CLOSE_DECODE_ERROR, message=b"Error while decoding payload."
                    )
                    break
                if not await self._on_frame(conn, op, payload.get("d")):
                    break
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._connections.discard(conn)
            self.close_codes.append(ws.close_code)
            session = conn.session
            if session is not None and session.connection is conn:
                session.connection = None
                # A client that closes with 1000/1001 ends its session, as on Discord; any
                # other close, or a dead socket, leaves it resumable.
                if ws.close_code in (1000, 1001):
                    session.invalidated = True
            if task is not None:
                self._handler_tasks.discard(task)
            self._notify()
        return ws

    async def _on_frame(self, conn: _Connection, op: Any, d: Any) -> bool:
        """Handle one client frame; False once the socket was closed."""
        ws = conn.ws
        if op == OP_HEARTBEAT:
            if conn.session is not None and isinstance(d, int):
                conn.session.heartbeat_seq = d
            await conn.send({"op": OP_HEARTBEAT_ACK, "d": None, "s": None, "t": None})
            self.heartbeat_acks += 1
            self._notify()
            return True
        if op == OP_IDENTIFY:
            return await self._identify(conn, d)
        if op == OP_RESUME:
            return await self._resume(conn, d)
        if op in (OP_PRESENCE_UPDATE, OP_VOICE_STATE_UPDATE, OP_REQUEST_GUILD_MEMBERS):
            if conn.session is None:
                await ws.close(code=CLOSE_NOT_AUTHENTICATED, message=b"Not authenticated.")
                return False
            if op == OP_REQUEST_GUILD_MEMBERS and isinstance(d, dict):
                await self._members_chunk(conn.session, d)
            return True
        await ws.close(code=CLOSE_UNKNOWN_OPCODE, message=b"Unknown opcode.")
        return False

    async def _members_chunk(self, session: _Session, d: dict[str, Any]) -> None:
        """Answer a member request (what discord.py's chunking sends with the members intent)
        with one ``GUILD_MEMBERS_CHUNK`` of the members the fake knows, filtered by
        ``query`` (a username prefix), ``user_ids`` and ``limit``."""
        guild = self._guilds.get(_digits(d.get("guild_id")) or 0)
        if guild is None:
            return
        query = str(d.get("query") or "").lower()
        wanted = d.get("user_ids")
        ids = [
            uid
            for uid in guild.members
            if self._user(uid)["username"].lower().startswith(query)
            and (not isinstance(wanted, list) or str(uid) in {str(w) for w in wanted})
        ]
        limit = d.get("limit")
        if isinstance(limit, int) and limit > 0:
            ids = ids[:limit]
        chunk: dict[str, Any] = {
            "guild_id": str(guild.id),
            "members": [self._member_object(guild, uid) for uid in ids],
            "chunk_index": 0,
            "chunk_count": 1,
        }
        if d.get("nonce") is not None:
            chunk["nonce"] = d["nonce"]
        async with self._events_lock:
            await self._dispatch(session, "GUILD_MEMBERS_CHUNK", chunk)
        self._notify()

    async def _may_authenticate(self, conn: _Connection, d: Any) -> bool:
        """Whether an IDENTIFY or RESUME may go on: the socket has no session yet and the token
        is right. Otherwise the socket is closed with the code Discord uses."""
        ws = conn.ws
        if conn.session is not None:
            await ws.close(code=CLOSE_ALREADY_AUTHENTICATED, message=b"Already authenticated.")
            return False
        if not isinstance(d, dict) or d.get("token") != (self.gateway_token or self.token):
            self.refused_identifies += 1
            self._notify()
            await ws.close(code=CLOSE_AUTHENTICATION_FAILED, message=b"Authentication failed.")
            return False
        return True

    async def _identify(self, conn: _Connection, d: Any) -> bool:
        if not await self._may_authenticate(conn, d):
            return False
        ws = conn.ws
        intents = d.get("intents")
        if not isinstance(intents, int) or isinstance(intents, bool) or intents < 0:
            await ws.close(code=CLOSE_INVALID_INTENTS, message=b"Invalid intent(s).")
            return False
        if intents & _PRIVILEGED & ~self.enabled_privileged_intents:
            await ws.close(code=CLOSE_DISALLOWED_INTENTS, message=b"Disallowed intent(s).")
            return False
        self.identifies.append(d)
        self.identify_count += 1
        # Held until the guilds are sent: no dispatch can reach the new session before them.
        async with self._events_lock:
            return await self._ready(conn, d, intents)

    async def _ready(self, conn: _Connection, d: dict[str, Any], intents: int) -> bool:
        """READY, then (GUILDS intent) a GUILD_CREATE for each guild, as Discord lazy-loads
        the guilds READY lists as unavailable."""
        shard = d.get("shard")
        session = _Session(
            id=secrets.token_hex(16),
            intents=intents,
            shard=list(shard) if isinstance(shard, list) else None,
        )
        # Queued guild events go out first, to the sessions they were for; this one gets
        # the guilds as they are now.
        await self._flush_events()
        self._sessions[session.id] = session
        guilds = list(self._guilds.values())
        loads = [self._guild_create(g, available=True) for g in guilds]
        session.seq += 1
        ready: dict[str, Any] = {
            "v": 10,
            "user": dict(self.bot_user),
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.resume_url or self.resume_gateway_url,
            "private_channels": [],
            "presences": [],
            "relationships": [],
            "user_settings": {},
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "application": {"id": str(self.application_id), "flags": self._app_flags()},
            "_trace": ['["fake-gateway",{"micros":0}]'],
        }
        if session.shard is not None:
            ready["shard"] = session.shard
        await conn.send({"op": OP_DISPATCH, "d": ready, "s": session.seq, "t": "READY"})
        # Attached after READY went out, so no event can overtake it on this socket.
        conn.session = session
        session.connection = conn
        if intents & INTENT_GUILDS:
            for load in loads:
                await self._dispatch(session, "GUILD_CREATE", self._guild_shaped(session, load))
        self._notify()
        return True

    async def _resume(self, conn: _Connection, d: Any) -> bool:
        if not await self._may_authenticate(conn, d):
            return False
        self.resume_count += 1
        session = self._sessions.get(str(d.get("session_id")))
        if self.resume_close is not None:
            if session is not None:
                session.invalidated = True
            self._notify()
            await conn.ws.close(code=self.resume_close, message=b"Session cannot be resumed.")
            return False
        if session is None or session.invalidated:
            await conn.send({"op": OP_INVALID_SESSION, "d": False, "s": None, "t": None})
            self._notify()
            return True
        old = session.connection
        if old is not None and old is not conn:
            # A newer socket took the session over; the old one is a zombie.
            session.connection = None
            old.session = None
            with contextlib.suppress(Exception):
                await old.ws.close(code=CLOSE_UNKNOWN_ERROR, message=b"Session resumed elsewhere.")
        seq = d.get("seq")
        after = -1 if self.replay_from_start_on_resume or not isinstance(seq, int) else seq
        index = 0
        # Re-read the log's length every turn: events dispatched during the replay land in it
        # and are sent here too; the socket is attached only once the log is exhausted, with
        # no await in between, so nothing is lost or sent twice.
        while index < len(session.log):
            frame = session.log[index]
            index += 1
            if frame["s"] > after:
                await conn.send(frame)
        conn.session = session
        session.connection = conn
        session.seq += 1
        await conn.send(
            {
                "op": OP_DISPATCH,
                "d": {"_trace": ['["fake-gateway",{"micros":0}]']},
                "s": session.seq,
                "t": "RESUMED",
            }
        )
        self._notify()
        return True

    def _app_flags(self) -> int:
        if self.enabled_privileged_intents & INTENT_MESSAGE_CONTENT:
            return APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED
        return 0

    # -- REST --------------------------------------------------------------------------------

    def _authenticated(
        self, handler: Callable[[web.Request], Any], check_limits: bool = True
    ) -> Callable[[web.Request], Any]:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            response = await answer(request)
            path = request.path.removeprefix(API_PREFIX)
            self.requests.append(
                RecordedRequest(request.method, path, response.status, time.monotonic())
            )
            self._notify()
            return response

        async def answer(request: web.Request) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bot {self.token}":
                return _json(_error(401, "401: Unauthorized", 0))
            if check_limits and (refused := self._over_limit(request)) is not None:
                return _json(refused)
            if (scripted := self._next_route_error(request)) is not None:
                return _json(scripted)
            try:
                response: web.StreamResponse = await handler(request)
            except _Failed as failure:
                return _json(failure.error)
            return response

        return wrapped

    def _next_route_error(self, request: web.Request) -> ScriptedError | None:
        queue = self._route_errors.get(_route(request))
        return queue.pop(0) if queue else None

    def _over_limit(self, request: web.Request) -> ScriptedError | None:
        """Discord's 429 if the request breaks one of the limits, else None (and it counts)."""
        if self.limits is None:
            return None
        violation = self.limits.check(_route(request), request.match_info, time.monotonic())
        if violation is None:
            return None
        return self.rate_limited(violation.retry_after_s, global_=violation.limit == "bot")

    async def _not_found(self, request: web.Request) -> web.Response:
        return _json(_error(404, "404: Not Found", 0))

    async def _handle_get_gateway(self, request: web.Request) -> web.Response:
        # The one route Discord serves without a token.
        return _respond({"url": self.gateway_url})

    async def _get_gateway_bot(self, request: web.Request) -> web.Response:
        return _respond(
            {
                "url": self.gateway_url,
                "shards": 1,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 1000 - self.identify_count,
                    "reset_after": 86_400_000,
                    "max_concurrency": 1,
                },
            }
        )

    async def _get_me(self, request: web.Request) -> web.Response:
        return _respond(self.bot_user)

    async def _get_user(self, request: web.Request) -> web.Response:
        user = self._users.get(_snowflake(request.match_info["user_id"]))
        if user is None:
            raise _Failed(_error(404, "Unknown User", 10013))
        return _respond(user)

    async def _create_dm(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        recipient = _snowflake(body.get("recipient_id"))
        if recipient not in self._users or recipient == self.bot_id:
            raise _Failed(_error(400, "Invalid Recipient(s)", 50033))
        return _respond(self._channel_object(self._channels[self.dm_channel(recipient)]))

    async def _get_application(self, request: web.Request) -> web.Response:
        return _respond(
            {
                "id": str(self.application_id),
                "name": self.bot_user["username"],
                "icon": None,
                "description": "",
                "summary": "",
                "type": None,
                "bot_public": True,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "flags": self._app_flags(),
                "owner": self._public_user(self._user(1)),
                "team": None,
                "bot": self._public_user(self.bot_user),
                "interactions_endpoint_url": None,
                "redirect_uris": [],
            }
        )

    async def _put_commands(self, request: web.Request) -> web.Response:
        if _snowflake(request.match_info["application_id"]) != self.application_id:
            raise _Failed(_error(403, "Missing Access", 50001))
        try:
            body = json.loads(await request.read() or b"null")
        except ValueError:
            raise _Failed(_error(400, "400: Bad Request", 0)) from None
        if not isinstance(body, list) or len(body) > MAX_GLOBAL_COMMANDS:
            raise _Failed(_error(400, "Invalid Form Body", 50035))
        kept = {c["name"]: c["id"] for c in self.application_commands}
        commands = []
        for index, command in enumerate(body):
            problem = _command_problem(command)
            if problem is not None:
                raise _form_error(f"{index}.{problem[0]}", "BASE_TYPE_BAD_LENGTH", problem[1])
            # As on Discord, a command that stays keeps its id.
            ident = kept.get(command["name"]) or str(self._next_id())
            commands.append(
                {
                    **command,
                    "id": ident,
                    "application_id": str(self.application_id),
                    "version": str(self._next_id()),
                }
            )
        self.application_commands = commands
        return _respond(commands)

    async def _get_commands(self, request: web.Request) -> web.Response:
        return _respond(self.application_commands)

    async def _callback(self, request: web.Request) -> web.Response:
        found = self.interactions.get(_digits(request.match_info["interaction_id"]) or 0)
        try:
            body = await _json_body(request)
        except _Failed as failure:
            return _json(failure.error)
        if found is None or not hmac.compare_digest(found.token, request.match_info["token"]):
            return _json(_error(404, "Unknown interaction", 10062))
        if found.acknowledged:
            status, response = (
                400,
                _json(_error(400, "Interaction has already been acknowledged.", 40060)),
            )
        elif time.monotonic() - found.at > INTERACTION_ANSWER_S:
            status, response = 404, _json(_error(404, "Unknown interaction", 10062))
        else:
            status, response = 200, self._answer(found, body)
        found.answers.append((status, body))
        self._notify()
        return response

    def _answer(self, interaction: RecordedInteraction, body: dict[str, Any]) -> web.Response:
        data = body.get("data") or {}
        ephemeral = bool(int(data.get("flags") or 0) & MESSAGE_FLAG_EPHEMERAL)
        message_id = None
        if body.get("type") == CALLBACK_CHANNEL_MESSAGE and not ephemeral:
            message = self._new_message(
                interaction.channel_id, self.bot_user, str(data.get("content") or ""), []
            )
            message_id = message["id"]
        answered: dict[str, Any] = {
            "id": str(interaction.id),
            "type": 2,
            "response_message_loading": False,
            "response_message_ephemeral": ephemeral,
        }
        if message_id is not None:
            answered["response_message_id"] = message_id
        return _respond({"interaction": answered})

    def _guild(self, request: web.Request) -> _Guild:
        guild = self._guilds.get(_snowflake(request.match_info["guild_id"]))
        if guild is None:
            raise _Failed(_error(404, "Unknown Guild", 10004))
        return guild

    async def _get_guild(self, request: web.Request) -> web.Response:
        return _respond(self._guild_object(self._guild(request)))

    async def _get_guild_channels(self, request: web.Request) -> web.Response:
        # Threads are not listed here, as on Discord (they have routes of their own).
        guild = self._guild(request)
        return _respond([self._channel_object(self._channels[c]) for c in guild.channel_ids])

    async def _get_member(self, request: web.Request) -> web.Response:
        guild = self._guild(request)
        user_id = _snowflake(request.match_info["user_id"])
        if user_id not in guild.members:
            raise _Failed(_error(404, "Unknown Member", 10007))
        return _respond(self._member_object(guild, user_id))

    def _channel(self, request: web.Request) -> _Channel:
        channel = self._channels.get(_snowflake(request.match_info["channel_id"]))
        if channel is None:
            raise _unknown_channel()
        return channel

    async def _get_channel(self, request: web.Request) -> web.Response:
        return _respond(self._channel_object(self._channel(request)))

    async def _post_typing(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        self.typing_calls.append((channel.id, time.monotonic()))
        self._notify()
        return web.Response(status=204)

    async def _get_message(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        message = self._messages.get(_snowflake(request.match_info["message_id"]))
        if message is None or int(message["channel_id"]) != channel.id:
            raise _Failed(_error(404, "Unknown Message", 10008))
        return _respond(message)

    async def _get_messages(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        self.history_reads += 1
        self._notify()
        await self._history_gate.wait()
        query = request.query
        try:
            limit = int(query.get("limit", "50"))
        except ValueError:
            raise _form_error("limit", "NUMBER_TYPE_COERCE", "Value is not int.") from None
        if not 1 <= limit <= 100:
            raise _form_error(
                "limit", "NUMBER_TYPE_MAX" if limit > 100 else "NUMBER_TYPE_MIN", "Out of range."
            )
        anchors = {k: _snowflake(query[k]) for k in ("before", "after", "around") if k in query}
        if len(anchors) > 1:
            raise _form_error("before", "BASE_TYPE_CHOICES", "Only one of before/after/around.")
        ordered = sorted(channel.messages, key=lambda m: int(m["id"]))  # oldest first
        if "after" in anchors:
            chosen = [m for m in ordered if int(m["id"]) > anchors["after"]][:limit]
        elif "around" in anchors:
            pivot = anchors["around"]
            older = [m for m in ordered if int(m["id"]) < pivot]
            rest = [m for m in ordered if int(m["id"]) >= pivot]
            # Half the window before the id, the id and what follows after it.
            newer_count = min(len(rest), limit - min(len(older), limit // 2))
            older_count = min(len(older), limit - newer_count)
            chosen = older[len(older) - older_count :] + rest[:newer_count]
        else:
            pool = ordered
            if "before" in anchors:
                pool = [m for m in ordered if int(m["id"]) < anchors["before"]]
            chosen = pool[-limit:]
        return _respond(list(reversed(chosen)))  # newest first, as Discord

    async def _post_message(self, request: web.Request) -> web.Response:
        channel = self._channel(request)
        body = await _message_body(request)
        content = body.get("content")
        nonce = body.get("nonce")
        enforce = body.get("enforce_nonce") is True
        post = RecordedPost(
            channel_id=channel.id,
            content=content if isinstance(content, str) else None,
            nonce=str(nonce)
            if isinstance(nonce, str | int) and not isinstance(nonce, bool)
            else None,
            enforce_nonce=enforce,
            at=time.monotonic(),
            body=body,
        )
        self.posts.append(post)
        self._notify()
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        try:
            try:
                scripted = self._over_limit(request) or self._next_error(channel.id)
                if scripted is not None:
                    raise _Failed(scripted)
                message = await self._perform_post(channel, body, post)
            except _Failed as failure:
                post.status = failure.error.status
                self._notify()
                return _json(failure.error)
            # Withheld after the message exists: the client cannot know it was created.
            await self._post_gate.wait()
            post.status = 200
            self._notify()
            return _respond(message)
        except (asyncio.CancelledError, ConnectionError):
            if post.status is None:
                post.cancelled = True
                self._notify()
            raise
        finally:
            if task is not None:
                self._handler_tasks.discard(task)

    def _next_error(self, channel_id: int) -> ScriptedError | None:
        for key in (channel_id, None):
            queue = self._errors.get(key)
            if queue:
                return queue.pop(0)
        return self._channel_errors.get(channel_id)

    async def _perform_post(
        self, channel: _Channel, body: dict[str, Any], post: RecordedPost
    ) -> dict[str, Any]:
        content = body.get("content")
        if content is not None and not isinstance(content, str):
            raise _form_error("content", "BASE_TYPE_BAD_TYPE", "Must be a string.")
        content = content or ""
        if len(content) > MAX_CONTENT:
            raise _form_error(
                "content", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT} or fewer in length."
            )
        nonce = body.get("nonce")
        if nonce is not None:
            if isinstance(nonce, bool) or not isinstance(nonce, str | int):
                raise _form_error("nonce", "BASE_TYPE_BAD_TYPE", "Must be a string or integer.")
            if len(str(nonce)) > MAX_NONCE:
                raise _form_error(
                    "nonce", "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_NONCE} or fewer in length."
                )
        attachments: list[dict[str, Any]] = body.get("_files", [])
        embeds = body.get("embeds") if isinstance(body.get("embeds"), list) else []
        if not content.strip() and not attachments and not embeds:
            raise _Failed(_error(400, "Cannot send an empty message", 50006))
        allowed = _allowed_mentions(body.get("allowed_mentions"))
        reference, referenced = self._reference(channel, body.get("message_reference"))

        if nonce is not None and post.enforce_nonce:
            key = (self.bot_id, str(nonce))
            seen = self._nonces.get(key)
            if seen is not None and time.monotonic() - seen[1] <= self.nonce_window_s:
                existing = self._messages.get(seen[0])
                if existing is not None:
                    post.deduplicated = True
                    post.message_id = seen[0]
                    return existing

        mentions, everyone = self._post_mentions(content, allowed, referenced)
        message = self._new_message(
            channel.id,
            self.bot_user,
            content,
            attachments,
            nonce=nonce,
            tts=body.get("tts") is True,
            embeds=embeds,
            reference=reference,
            referenced=referenced,
            mentions=mentions,
            mention_everyone=everyone,
        )
        post.message_id = int(message["id"])
        if nonce is not None:
            self._nonces[(self.bot_id, str(nonce))] = (post.message_id, time.monotonic())
        # Discord echoes the bot's own messages on the gateway.
        await self._dispatch_message("MESSAGE_CREATE", self._gateway_message(message))
        return message

    def _reference(
        self, channel: _Channel, reference: Any
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """A POST's ``message_reference`` checked as Discord does: (the reference to keep, the
        stored message it names). A reply must name a message of the channel posted to; one
        that does not is refused (50035) unless ``fail_if_not_exists`` is false, which sends
        the message without the reference."""
        if reference is None:
            return None, None
        if not isinstance(reference, dict):
            raise _form_error("message_reference", "MODEL_TYPE_CONVERT", "Must be an object.")
        kind = reference.get("type", REFERENCE_REPLY)
        if kind not in (0, 1) or isinstance(kind, bool):
            raise _form_error("message_reference.type", "ENUM_TYPE_COERCE", "Not a valid type.")
        message_id = _digits(reference.get("message_id"))
        named_channel = reference.get("channel_id")
        referenced = self._messages.get(message_id or 0)
        if referenced is not None and (
            int(referenced["channel_id"]) != channel.id
            if kind == REFERENCE_REPLY
            else named_channel is not None and str(named_channel) != referenced["channel_id"]
        ):
            referenced = None
        if referenced is None:
            if reference.get("fail_if_not_exists", True) is not False:
                raise _form_error("message_reference", "REPLIES_UNKNOWN_MESSAGE", "Unknown message")
            return None, None
        return {"type": kind, "message_id": referenced["id"]}, referenced

    def _post_mentions(
        self,
        content: str,
        allowed: dict[str, Any] | None,
        referenced: dict[str, Any] | None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Whom a bot message mentions (its ``mentions``, ``mention_everyone``): those its
        content names that ``allowed_mentions`` lets through, and the replied-to author if
        it lets that ping through. Without ``allowed_mentions`` everything is (Discord's
        default for a bot's message, a reply's ping included)."""
        named = self._mentions(content)
        everyone = "@everyone" in content or "@here" in content
        if allowed is None:
            mentions, ping_replied = named, True
        else:
            parse = allowed.get("parse") or []
            if "users" in parse:
                mentions = named
            else:
                users = {str(u) for u in allowed.get("users") or []}
                mentions = [m for m in named if m["id"] in users]
            everyone = everyone and "everyone" in parse
            ping_replied = allowed.get("replied_user") is True
        if referenced is not None and ping_replied:
            mentions = self._with_mention(mentions, int(referenced["author"]["id"]), self.bot_id)
        return mentions, everyone


def _allowed_mentions(allowed: Any) -> dict[str, Any] | None:
    """A POST's ``allowed_mentions``, refused (50035) where Discord refuses it."""
    if allowed is None:
        return None
    if not isinstance(allowed, dict):
        raise _form_error("allowed_mentions", "MODEL_TYPE_CONVERT", "Must be an object.")
    parse = allowed.get("parse") or []
    if not isinstance(parse, list) or not set(parse) <= {"users", "roles", "everyone"}:
        raise _form_error("allowed_mentions.parse", "ENUM_TYPE_COERCE", "Not a valid type.")
    for kind in ("users", "roles"):
        listed = allowed.get(kind)
        if listed is not None and not isinstance(listed, list):
            raise _form_error(f"allowed_mentions.{kind}", "BASE_TYPE_BAD_TYPE", "Not a list.")
        if listed and kind in parse:
            raise _form_error(
                "allowed_mentions",
                "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                f'parse:["{kind}"] and {kind}: [ids] are mutually exclusive.',
            )
    return allowed


def discord_limits(
    per_second: int = 50, channel_messages: int = 5, channel_per_s: float = 5.0
) -> Limits:
    """Discord's limits: the global 50 requests a second of one bot, across all routes, and
    the per-route bucket of message POSTs: 5 per 5 s in one channel."""
    return Limits(
        [
            Limit("bot", per_second, 1.0, _global),
            Limit("channel", channel_messages, channel_per_s, _channel_post),
        ]
    )


def _global(route: str, params: Mapping[str, Any]) -> str | None:
    return "bot"


def _channel_post(route: str, params: Mapping[str, Any]) -> str | None:
    channel_id = params.get("channel_id")
    return str(channel_id) if route == _POST_MESSAGE and channel_id is not None else None


def _respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # Exactly "application/json", as Discord sends it: discord.py compares the header verbatim
    # and treats anything else (aiohttp's default adds "; charset=utf-8") as plain text.
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        headers={**(headers or {}), "Content-Type": "application/json"},
    )


def _json(error: ScriptedError) -> web.Response:
    return _respond(error.body, status=error.status, headers=error.headers)


def _snowflake(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _Failed(
            _error(
                400,
                "Invalid Form Body",
                50035,
                errors={"_errors": [{"code": "NUMBER_TYPE_COERCE", "message": "Not a snowflake."}]},
            )
        ) from None


def _digits(value: Any) -> int | None:
    """``value`` as a snowflake, or None if it is not one (a CDN path is not validated)."""
    text = str(value)
    return int(text) if text.isdigit() else None


def _hex(value: str) -> int | None:
    try:
        return int(value, 16)
    except ValueError:
        return None


def _waveform(data: bytes) -> bytes:
    """A voice message's waveform: up to 256 one-byte amplitudes. Discord's clients compute
    them from the audio; any bytes do here, so they are sampled from the data."""
    if not data:
        return bytes(1)
    step = max(1, len(data) // 256)
    return data[::step][:256]


def _command_problem(command: Any) -> tuple[str, str] | None:
    """What Discord would refuse in one application command of a PUT: (field, why)."""
    if not isinstance(command, dict):
        return "", "must be an object"
    name, description = command.get("name"), command.get("description")
    if not isinstance(name, str) or not _COMMAND_NAME_RE.fullmatch(name) or name != name.lower():
        return "name", "Command name is invalid"
    if not isinstance(description, str) or not 1 <= len(description) <= MAX_COMMAND_DESCRIPTION:
        return "description", f"Must be between 1 and {MAX_COMMAND_DESCRIPTION} in length."
    for index, option in enumerate(command.get("options") or []):
        option_name = option.get("name") if isinstance(option, dict) else None
        option_description = option.get("description") if isinstance(option, dict) else None
        if not isinstance(option_name, str) or not _COMMAND_NAME_RE.fullmatch(option_name):
            return f"options.{index}.name", "Command name is invalid"
        if not isinstance(option_description, str) or not (
            1 <= len(option_description) <= MAX_COMMAND_DESCRIPTION
        ):
            return (
                f"options.{index}.description",
                f"Must be between 1 and {MAX_COMMAND_DESCRIPTION} in length.",
            )
    return None


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise _Failed(_error(400, "400: Bad Request", 0)) from None
    if not isinstance(body, dict):
        raise _Failed(_error(400, "400: Bad Request", 0))
    return body


async def _message_body(request: web.Request) -> dict[str, Any]:
    """The JSON body, or a multipart form's ``payload_json`` with its files as attachments
    (listed under ``_files``, which no real field is called)."""
    if not request.content_type.startswith("multipart/"):
        return await _json_body(request)
    body: dict[str, Any] = {}
    files: list[dict[str, Any]] = []
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            continue
        data = await part.read()
        if part.name == "payload_json":
            try:
                parsed = json.loads(data)
            except ValueError:
                raise _Failed(_error(400, "400: Bad Request", 0)) from None
            if isinstance(parsed, dict):
                body.update(parsed)
        elif part.filename:
            files.append(
                FakeDiscord.attachment(
                    part.filename,
                    part.headers.get("Content-Type", "application/octet-stream"),
                    len(data),
                )
            )
    body["_files"] = files
    return body

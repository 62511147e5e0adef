"""Telegram, on python-telegram-bot's `Bot` (v22, asyncio), in webhook or polling mode.

Nothing is acknowledged to Telegram before the core has stored it. python-telegram-bot's own
webhook server answers 200 before handlers run, and its updater confirms the polling offset
before they finish, so neither is used:

- **webhook**: our own aiohttp endpoint checks the secret header in constant time, parses the
  update, ingests it, and only then answers 200 (503 while the store is down, so Telegram
  retries). Any number of replicas may serve it behind a load balancer.
- **polling**: `getUpdates` is called by hand, and the offset that confirms a batch is only
  sent once the whole batch is stored. Telegram allows one poller per token, so the replicas
  elect one with the core's role lease; the others only send replies. The poller outlives
  every error: flood control (429) is waited out as told, anything else is backed off.

Replies are rendered from the model's Markdown to Telegram HTML, part by part, falling back to
plain text when Telegram rejects the entities. Flood control (a 429) is handed to the core as
`Throttled`, with the wait Telegram named, however odd: Telegram does not say which limit it
was, so it names the chat the call was about (`_throttled`), and the core holds that chat for
every replica, the whole bot only once several chats are refused close together. A network
error that persists is handed back as a transient `SendFailed`, to try again later. A user
who blocked the bot is `Unreachable` (the core counts the reply as delivered and marks the
conversation until they write again); any other request Telegram rejects (chat not found) is
a permanent `SendFailed`, and the core gives the reply up.

Every draft carries Telegram's stop button (`can_stop`, Bot API 10.3). A press arrives as a
`stopped_message_generation` update, which python-telegram-bot 22.8 (Bot API 10.0) does not
know: it keeps the raw object in `update.api_kwargs`, and the flag goes out the same way. The
press becomes a "/stop" from the chat's user, taken in like any message it could have typed
(allow-list, dedupe, rate limit), so it cancels the generation just as typing /stop does.

In groups, someone posting as a chat (an anonymous admin as the group, a person as their
channel) is that chat, a person like any other; a linked channel's automatic forwards and
Telegram's service account are no one's, the room's context at most. A group upgraded to a
supergroup answers sends to its old id with the new one (`ChatMigrated`): the part goes there,
and the core is told (`Sink.group_moved`, also from the upgrade's service messages) so the
group's allowance moves with it.

At start, every replica sets the command menu (`setMyCommands`) from the command registry, as
`/help` lists it: everyone's commands for every chat, and everyone's plus the admin ones for
each admin's private chat (`BotCommandScopeChat`; in a private chat the chat's id is the
user's). Setting it again is harmless; a refusal or a hang is retried a few times, backed off,
and never stops the bot.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import random
import re
import urllib.parse
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from http import HTTPStatus
from typing import Any, Literal

import aiohttp
from aiohttp import web
from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from telegram import (
    Bot,
    BotCommand,
    BotCommandScopeChat,
    Message,
    MessageEntity,
    ReplyParameters,
    Update,
    User,
)
from telegram.constants import BotCommandLimit, ChatAction
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.request import BaseRequest, HTTPXRequest, RequestData

from adapters import Platform
from adapters.base import (
    Identity,
    Sink,
    describe,
    register_menu,
    replying,
    until_stored,
)
from adapters.telegram_html import plain_text, render_draft, render_part
from bot import log_lines
from bot.backoff import Backoff
from bot.cancel import cancel_and_wait
from bot.config.credentials import Credential
from bot.config.settings import (
    ENV_PREFIX,
    ConfigError,
    ListenAddress,
    OptionalWebUrl,
    RequiredSecret,
    Secret,
    Settings,
    WebUrl,
)
from bot.message import (
    BOT_SCOPE,
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
)
from bot.ops.check import Check, guarded
from bot.tls import client_context

log = logging.getLogger(__name__)

# python-telegram-bot's INFO lines are one per request.
log_lines.quiet("telegram.ext")


class TelegramSettings(BaseModel):
    """`LASTWORD_TELEGRAM__*`, the `[telegram]` table: read when the platform is telegram."""

    # As @BotFather gives it: the bot's number, a colon, then letters, digits, "_" and "-".
    token: RequiredSecret = Field(
        description="the bot token from @BotFather (`123456:ABC-def…`); required for `telegram`"
    )
    api_url: WebUrl = Field(
        default="https://api.telegram.org",
        description=(
            "the Bot API's base URL: Telegram's, a local Bot API server, or the tests' fake"
        ),
    )
    mode: Literal["polling", "webhook"] = Field(
        default="polling",
        description=(
            "how updates arrive: `polling` (the bot asks with `getUpdates`; no public address "
            "needed) or `webhook` (Telegram posts them to the webhook endpoint)"
        ),
    )
    webhook_listen: ListenAddress = Field(
        default="127.0.0.1:8443",
        description="`host:port` the webhook endpoint binds, in webhook mode",
    )
    webhook_path: str = Field(
        default="/telegram",
        pattern=r"^/\S*$",
        description="the path the webhook endpoint takes Telegram's posts on",
    )
    webhook_url: OptionalWebUrl = Field(
        default=None,
        description=(
            "the endpoint's public URL, registered with `setWebhook` on start-up (unset: not "
            "registered; call `setWebhook` yourself)"
        ),
    )
    # Telegram takes 1-256 characters of A-Z, a-z, 0-9, "_" and "-" as the secret token.
    webhook_secret: Secret = Field(
        default=None,
        description=(
            "the secret Telegram sends with each webhook post (1 to 256 of A-Z, a-z, 0-9, `_` "
            "and `-`); required in webhook mode; a post not carrying it gets 401"
        ),
    )
    drafts: bool = Field(
        default=True,
        description=(
            "show the reply as it is written, as an ephemeral draft in the chat "
            "(`sendMessageDraft`)"
        ),
    )
    draft_interval_ms: int = Field(
        default=1000,
        ge=200,
        le=10_000,
        description="the shortest time between two updates of a draft; a 429 slows them further",
    )
    # Telegram's limits for one bot (its Bot API FAQ), shared by every replica.
    messages_per_second: int = Field(
        default=30,
        ge=1,
        le=1000,
        description=(
            "Telegram's bot-wide limit: calls a second (replies, drafts, typing), shared by "
            "every replica; raise it only with paid broadcasts (up to 1000)"
        ),
    )
    chat_messages_per_second: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Telegram's per-chat limit: messages a second in one chat",
    )
    group_messages_per_minute: int = Field(
        default=20,
        ge=1,
        le=6000,
        description="Telegram's per-group limit: messages a minute in one group",
    )

    @field_validator("token")
    @classmethod
    def _token_shape(cls, value: SecretStr) -> SecretStr:
        if not re.fullmatch(r"\d+:[\w-]+", value.get_secret_value()):
            raise ValueError("expected the token as @BotFather gives it: 123456:ABC-def_...")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _secret_shape(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.fullmatch(r"[\w-]{1,256}", value.get_secret_value()):
            raise ValueError("expected 1 to 256 of A-Z, a-z, 0-9, _ and - (Telegram's rule)")
        return value

    @model_validator(mode="after")
    def _webhook_secret_set(self) -> TelegramSettings:
        if self.mode == "webhook" and self.webhook_secret is None:
            raise ValueError(f"{ENV_PREFIX}TELEGRAM__WEBHOOK_SECRET is required in webhook mode")
        return self


PLATFORM = "telegram"
# A press of a draft's stop button (Bot API 10.3): chat, draft_id, message_thread_id.
STOP_PRESSED = "stopped_message_generation"
# Telegram keeps sending only what the last setWebhook or getUpdates listed.
ALLOWED_UPDATES = ["message", "edited_message", STOP_PRESSED]
# The chats a group conversation lives in (forum topics are supergroups' threads).
GROUP_CHATS = ("group", "supergroup")
# Telegram's own account, which posts a linked channel's automatic forwards and other service
# messages into groups ("Telegram", is_bot false).
SERVICE_ACCOUNT = 777000
# Extra sendMessageDraft parameters python-telegram-bot 22.8 has no argument for: the stop
# button (Bot API 10.3). Without keep_on_stop the draft goes when pressed; "Stopped." follows.
DRAFT_OPTIONS = {"can_stop": True}
MAX_BODY_BYTES = 1024 * 1024
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
# Long-poll duration; python-telegram-bot adds it to the request's read timeout.
POLL_TIMEOUT_S = 25
# Transient send failures (network, 5xx) are retried this often before the attempt is handed
# back to the core, backed off from the first delay up to the cap, with jitter.
SEND_ATTEMPTS = 5
SEND_RETRY_FIRST_S = 1.0
SEND_RETRY_CAP_S = 10.0
# Bot API calls (replies, drafts, typing) go out over at most this many connections at once.
API_CONNECTIONS = 64
# The Bot API calls' time limits, python-telegram-bot's own defaults: (connect, pool, write,
# read). A call that waits for a connection longer than the pool limit fails as TimedOut.
API_TIMEOUTS_S = (5.0, 1.0, 5.0, 5.0)
# Users' files are downloaded through connections of their own, this many at once (more
# wait for one, up to DOWNLOAD_WAIT_S): a download may take the whole of
# media.fetch_timeout_s, and slow ones must never hold the pool that replies go out through.
DOWNLOAD_CONNECTIONS = 8
DOWNLOAD_WAIT_S = 30.0
# Backoff of a failing poll: doubling from the first delay up to the cap, with jitter.
POLL_BACKOFF_FIRST_S = 0.5
POLL_BACKOFF_CAP_S = 30.0
# After this many failed polls in a row, /healthz reports the adapter as not connected.
POLL_FAILURES_UNHEALTHY = 3
# A token Telegram refuses (revoked while running) is tried again after this long, doubling
# up to the cap: it may be given back, but asking more often changes nothing.
REFUSED_RETRY_FIRST_S = 2.0
REFUSED_RETRY_CAP_S = 60.0
# Past this, a 429's retry_after would not fit the timedelta RetryAfter holds it in (a wait of
# 31,000 years is as good as any longer one; the core bounds a hold far below it anyway).
LONGEST_RETRY_AFTER_S = 1e12
TOKEN_SETTING = "LASTWORD_TELEGRAM__TOKEN"
TOKEN_FIX = f"copy the token from @BotFather into {TOKEN_SETTING}"


def normalize(update: Update, me: User | None = None) -> InboundMessage | None:
    """The platform-free message for a text or media message in a private chat or a group
    (`me`, the bot, tells whether it is addressed to the bot there), or for a press of a
    draft's stop button; None for the rest (channels, bots in private chats, service
    messages), which are acknowledged and ignored."""
    stop = _stop_pressed(update)
    if stop is not None:
        return stop
    message = update.message or update.edited_message
    if message is None:
        return None
    sender = message.from_user
    group = message.chat.type in GROUP_CHATS
    if (
        sender is None
        or (sender.is_bot and not group)
        or not (group or message.chat.type == "private")
    ):
        return None
    edited = update.edited_message is not None
    message_id = str(message.message_id)
    text = message.text or message.caption or ""
    if edited:
        # An edit is new input, so each edit needs an id of its own. The update id is one per
        # edit (edit_date has whole seconds only: two quick edits would share it) and stays
        # the same when Telegram delivers the update again, so dedupe still drops that.
        message_id = edited_id(message_id, str(update.update_id))
        text = f"(edited) {text}"
    # A forum topic is a room of its own; other thread ids are reply chains, not topics.
    topic = str(message.message_thread_id) if group and message.is_topic_message else ""
    user_id, name, person = _speaker(message)
    place = Place(PLATFORM, str(message.chat.id), user_id, topic, group=group)
    return InboundMessage.at(
        place,
        message_id,
        text,
        display_name=name,
        timestamp=message.date.timestamp(),
        reply_to_id=_reply_to(message),
        attachments=_attachments(message),
        mentioned=group and person and me is not None and _mentions(message, me),
        from_bot=not person,
        quoted=_quoted(message, me) if group else None,
    )


def _speaker(message: Message) -> tuple[str, str, bool]:
    """Who said a message (their id and display name), and whether a person did.

    A person posting as a chat (an anonymous group admin, shown as the group; someone posting
    as their channel) is that chat: its id and title, a person like any other. Their id is no
    user's, so an anonymous admin is never taken for one of lastword's admins. A linked
    channel's automatic forward into its discussion group, and anything else Telegram's
    service account posts, is no person's: context at most, never a burst."""
    sender = message.from_user
    assert sender is not None  # normalize returned before this for a message without one
    chat = message.sender_chat
    person = not message.is_automatic_forward and sender.id != SERVICE_ACCOUNT
    if chat is not None:
        return str(chat.id), chat.title or chat.full_name or "", person
    return str(sender.id), sender.full_name, person and not sender.is_bot


def migration(update: Update) -> tuple[str, str] | None:
    """The old and new chat of a group upgraded to a supergroup, from either service message
    (`migrate_to_chat_id` in the old group, `migrate_from_chat_id` in the new); None for any
    other update."""
    message = update.message
    if message is None:
        return None
    if message.migrate_to_chat_id:
        return str(message.chat.id), str(message.migrate_to_chat_id)
    if message.migrate_from_chat_id:
        return str(message.migrate_from_chat_id), str(message.chat.id)
    return None


def _mentions(message: Message, me: User) -> bool:
    """Whether a group message is addressed to the bot: it mentions the bot (`@name`, or a
    mention of its account), is a command for it (`/help@name`), or replies to one of its
    messages (not the topic's first message, which every message in a topic replies to)."""
    name = f"@{me.username}".lower() if me.username else None
    for entity, said in message.parse_entities().items():
        if entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == me.id:
            return True
        said = said.lower()
        if name and (
            said == name or (entity.type == MessageEntity.BOT_COMMAND and said.endswith(name))
        ):
            return True
    if name and name in (s.lower() for s in message.parse_caption_entities().values()):
        return True
    replied = message.reply_to_message
    return (
        replied is not None
        and replied.forum_topic_created is None
        and replied.from_user is not None
        and replied.from_user.id == me.id
    )


def _stop_pressed(update: Update) -> InboundMessage | None:
    """A press of the stop button on a draft, as the "/stop" its user could have typed; None
    if the update is not one, or not about a private chat."""
    # A python-telegram-bot that knows Bot API 10.3 parses the field; 22.8 leaves it raw.
    parsed: Any = getattr(update, STOP_PRESSED, None)
    raw = parsed.to_dict() if parsed is not None else update.api_kwargs.get(STOP_PRESSED)
    if not isinstance(raw, dict):
        return None
    chat = raw.get("chat")
    if not isinstance(chat, dict) or chat.get("type") != "private":
        return None
    chat_id = chat.get("id")
    if not isinstance(chat_id, int) or isinstance(chat_id, bool):
        return None
    names = (chat.get("first_name"), chat.get("last_name"))
    log.info("stop pressed on draft %s of telegram:%s", raw.get("draft_id"), chat_id)
    return InboundMessage(
        platform=PLATFORM,
        chat_id=str(chat_id),
        # The update names no user: in a private chat the chat's id is the user's.
        user_id=str(chat_id),
        display_name=" ".join(n for n in names if isinstance(n, str) and n),
        # One id per press that stays the same when Telegram delivers the update again.
        message_id=f"stop:{update.update_id}",
        text="/stop",
        is_dm=True,
    )


def _reply_to(message: Message) -> str | None:
    replied = message.reply_to_message
    return str(replied.message_id) if replied is not None else None


def _quoted(message: Message, me: User | None) -> Quote | None:
    """The message a group message replies to, as Telegram delivers it with the reply (not a
    forum topic's creation, which every message in the topic replies to)."""
    replied = message.reply_to_message
    if replied is None or replied.forum_topic_created is not None or replied.from_user is None:
        return None
    _, name, _ = _speaker(replied)
    labels = [a.label() for a in _attachments(replied)]
    said = " ".join([*labels, replied.text or replied.caption or ""]).strip()
    by_bot = me is not None and replied.from_user.id == me.id
    return Quote(name, said, by_bot)


def _attachments(message: Message) -> tuple[Attachment, ...]:
    """References to the message's files (the core fetches them by file id with `fetch`;
    the file's URL carries the bot token, so it is never stored)."""
    found: list[Attachment] = []
    if message.photo:
        # Several sizes of one photo, the largest last: the one the core scales down itself.
        largest = message.photo[-1]
        found.append(_ref("photo", largest, "image/jpeg", ""))
    if message.sticker is not None:
        found.append(_ref("sticker", message.sticker, "", message.sticker.emoji or ""))
    if message.voice is not None:
        found.append(_ref("voice", message.voice, message.voice.mime_type, "voice.ogg"))
    if message.audio is not None:
        audio = message.audio
        found.append(_ref("audio", audio, audio.mime_type, audio.file_name or audio.title))
    for kind in ("video", "video_note", "animation"):
        item: Any = getattr(message, kind, None)
        if item is not None:
            found.append(_ref(kind, item, getattr(item, "mime_type", None), ""))
    # An animation also fills `document` (the Bot API keeps it for old clients): once only.
    if message.document is not None and message.animation is None:
        document = message.document
        found.append(_ref("document", document, document.mime_type, document.file_name))
    return tuple(found)


def _ref(kind: str, item: Any, mime: str | None, name: str | None) -> Attachment:
    return Attachment(
        kind,
        str(item.file_id),
        mime=mime or "",
        size=int(getattr(item, "file_size", None) or 0),
        name=name or "",
        file_key=str(item.file_unique_id),
    )


def _seconds(value: int | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _chat_id(conversation: str) -> int:
    return int(Place.of(conversation).chat)


def _thread(conversation: str) -> dict[str, Any]:
    """The forum topic a group conversation is in, as the Bot API's calls take it."""
    topic = Place.of(conversation).topic
    return {"message_thread_id": int(topic)} if topic else {}


def _throttled(exc: RetryAfter, chat_id: int) -> Throttled:
    """A call's 429 as the core takes it. Telegram does not say which limit it was, so it
    names the narrowest the call falls under: the chat it was about (a private chat's own
    scope, as `TelegramAdapter.scopes` names it; a group's minute, the likeliest there), never
    the whole bot for one chat's refusal, which would keep everyone else waiting. The core
    holds the bot too once several chats are refused close together (`inferred`)."""
    scope = f"group:{chat_id}" if chat_id < 0 else f"chat:{chat_id}"
    return Throttled(_seconds(exc.retry_after), scope, inferred=True)


def _bot_commands(entries: Sequence[MenuEntry]) -> list[BotCommand]:
    return [BotCommand(e.name, e.description(BotCommandLimit.MAX_DESCRIPTION)) for e in entries]


def _flood_wait(exc: Exception) -> float | None:
    """How long flood control asks to wait before the next call, if `exc` is one."""
    return _seconds(exc.retry_after) if isinstance(exc, RetryAfter) else None


def _httpx_request(**options: Any) -> HTTPXRequest:
    """python-telegram-bot's httpx request with the process's one TLS context (its own
    would load the certificate store again, for each request object)."""
    return HTTPXRequest(**options, httpx_kwargs={"verify": client_context()})


class TelegramAdapter:
    platform = PLATFORM
    # Leaves room for the HTML that rendering adds; a part that still does not fit is sent
    # as plain text, or halved (emoji count twice in Telegram's UTF-16 limit).
    max_message_chars = 3500
    typing_interval_s = 4.0

    def __init__(self, settings: TelegramSettings, admins: Sequence[str] = ()) -> None:
        self.settings = settings
        # The admins' private chats, whose command menu lists the admin commands too. An id
        # that is not a number is no Telegram user's: no chat to give a menu.
        self.admin_chats = sorted({int(a) for a in admins if a.isdigit()})
        base_url = settings.api_url.rstrip("/") + "/bot"
        self.bot = Bot(
            settings.token.get_secret_value(),
            base_url=base_url,
            base_file_url=settings.api_url.rstrip("/") + "/file/bot",
            request=AiohttpRequest(API_CONNECTIONS),
            get_updates_request=_httpx_request(read_timeout=10),
        )
        self.downloads = _httpx_request(
            connection_pool_size=DOWNLOAD_CONNECTIONS,
            pool_timeout=DOWNLOAD_WAIT_S,
            read_timeout=DOWNLOAD_WAIT_S,
        )
        self.draft_interval_s = settings.draft_interval_ms / 1000 if settings.drafts else None
        # Up once the Bot API answered (getMe at start-up); down while getUpdates keeps failing.
        self._connected = False
        self.token = Credential(TOKEN_SETTING, "Telegram")
        # The core, once running: told of a group's move found while sending.
        self._sink: Sink | None = None

    def connected(self) -> bool:
        return self._connected

    def refused(self) -> str | None:
        return self.token.reason

    def identity(self) -> Identity | None:
        """The bot's @username and its t.me link, as getMe (at `login`) said."""
        me = self._me()
        if me is None or not me.username:
            return None
        return Identity(
            f"@{me.username} on Telegram", f"chat with it at https://t.me/{me.username}"
        )

    def _api_url(self) -> str:
        return self.settings.api_url.rstrip("/")

    async def login(self) -> None:
        """getMe, the token's own check: a refused token is a `ConfigError`."""
        try:
            # Opened and closed again: `run` opens the bot for as long as it runs.
            async with self.bot:
                pass
        except InvalidToken:
            # Not the exception's text: python-telegram-bot quotes the token in it.
            raise ConfigError(
                f"{TOKEN_SETTING}: Telegram refused the bot token (getMe at {self._api_url()}): "
                f"{TOKEN_FIX}"
            ) from None
        except TelegramError as exc:
            log.warning(
                "cannot reach Telegram at %s to check the token (%s); starting anyway",
                self._api_url(),
                type(exc).__name__,
            )
        else:
            self.token.accepted()

    def _refused(self, method: str) -> None:
        self._connected = False
        self.token.refused(f"{method} at {self._api_url()}", TOKEN_FIX)

    async def run(self, sink: Sink) -> None:
        registering: asyncio.Task[bool] | None = None
        self._sink = sink
        try:
            await self._initialize()
            await self.downloads.initialize()
            self._connected = True
            # Beside receiving: a menu Telegram is slow to take must not hold up messages.
            registering = asyncio.create_task(
                register_menu(PLATFORM, partial(self._set_menu, sink), _flood_wait),
                name="telegram menu",
            )
            if self.settings.mode == "webhook":
                await self._serve_webhook(sink)
            else:
                await sink.run_exclusively("telegram:poller", lambda: self._poll(sink))
        finally:
            if registering is not None:
                await cancel_and_wait(registering)
            await self.downloads.shutdown()
            await self.bot.shutdown()

    async def _set_menu(self, sink: Sink) -> None:
        """The command menu: everyone's commands by default, and the admin ones too in each
        admin's private chat."""
        await self.bot.set_my_commands(_bot_commands(sink.menu()))
        everything = _bot_commands(sink.menu(admins=True))
        for chat_id in self.admin_chats:
            await self.bot.set_my_commands(everything, scope=BotCommandScopeChat(chat_id))

    async def _initialize(self) -> None:
        """Open the bot (getMe); a token refused since `login` is waited out, backed off, as
        the poller waits one refused mid-run: it may be given back."""
        backoff = Backoff(REFUSED_RETRY_FIRST_S, REFUSED_RETRY_CAP_S)
        while True:
            try:
                await self.bot.initialize()
            except InvalidToken:
                self._refused("getMe")
            else:
                self.token.accepted()
                return
            await asyncio.sleep(backoff.next_delay())

    # Receiving: webhook

    async def _serve_webhook(self, sink: Sink) -> None:
        host, _, port = self.settings.webhook_listen.rpartition(":")
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(self.settings.webhook_path, self._webhook_handler(sink))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
            if self.settings.webhook_url:
                await self.bot.set_webhook(
                    self.settings.webhook_url,
                    secret_token=self._secret(),
                    allowed_updates=ALLOWED_UPDATES,
                )
            log.info("telegram webhook listening on %s", self.settings.webhook_listen)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    def _secret(self) -> str:
        secret = self.settings.webhook_secret
        assert secret is not None  # the settings require it in webhook mode
        return secret.get_secret_value()

    def _webhook_handler(self, sink: Sink) -> Any:
        expected = self._secret().encode()

        async def handle(request: web.Request) -> web.Response:
            given = request.headers.get(SECRET_HEADER, "").encode()
            if not hmac.compare_digest(given, expected):
                return web.json_response({"error": "wrong secret"}, status=401)
            try:
                data = json.loads(await request.read())
                update = Update.de_json(data, self.bot)
            except web.HTTPRequestEntityTooLarge:
                return web.json_response({"error": "body too large"}, status=413)
            except Exception:
                return web.json_response({"error": "not a Telegram update"}, status=400)
            moved = migration(update) if update is not None else None
            if moved is not None:
                try:
                    await sink.group_moved(PLATFORM, *moved)
                except Unavailable:
                    return web.json_response({"error": "try again"}, status=503)
                except Exception:
                    log.exception("the move of telegram group %s could not be stored", moved[0])
                    return web.json_response({"error": "internal error"}, status=500)
                return web.json_response({"ok": True})
            message = normalize(update, self._me()) if update is not None else None
            if message is None:
                return web.json_response({"ignored": True})
            try:
                await sink.ingest(message)
            except Unavailable:
                # Not stored: Telegram must deliver it again later.
                return web.json_response({"error": "try again"}, status=503)
            except Exception:
                # A bug or an error reply nobody classified: not stored either, so Telegram
                # retries, and the log names the conversation it held up.
                log.exception("%s could not be stored", describe(message))
                return web.json_response({"error": "internal error"}, status=500)
            return web.json_response({"ok": True})

        return handle

    # Receiving: polling

    async def _poll(self, sink: Sink) -> None:
        log.info("this replica polls Telegram")
        webhook_deleted = False
        offset: int | None = None
        failures = 0
        backoff = Backoff(POLL_BACKOFF_FIRST_S, POLL_BACKOFF_CAP_S, jitter=0.5)
        refused = Backoff(REFUSED_RETRY_FIRST_S, REFUSED_RETRY_CAP_S)
        while True:
            try:
                if not webhook_deleted:
                    # getUpdates is refused while a webhook is set.
                    await self.bot.delete_webhook()
                    webhook_deleted = True
                updates = await self.bot.get_updates(
                    offset=offset, timeout=POLL_TIMEOUT_S, allowed_updates=ALLOWED_UPDATES
                )
                for update in updates:
                    moved = migration(update)
                    if moved is not None:
                        move = partial(sink.group_moved, PLATFORM, *moved)
                        await until_stored(move, f"the move of group {moved[0]}")
                    message = normalize(update, self._me())
                    if message is not None:
                        await until_stored(partial(sink.ingest, message), describe(message))
            except RetryAfter as exc:
                # Told exactly when to come back, so the backoff stays as it was.
                delay = _seconds(exc.retry_after) + random.uniform(0.1, 0.5)
                log.warning("Telegram flood control on polling; retrying in %.1fs", delay)
            except InvalidToken:
                # A 401 or 404: the token was revoked. Logged once a minute, no traceback.
                delay = refused.next_delay()
                self._refused("getUpdates")
            except (Conflict, NetworkError) as exc:
                # TimedOut is a NetworkError; a 409 means another poller, often one just
                # handed over, whose long poll Telegram has not ended yet.
                delay = backoff.next_delay()
                log.warning("polling Telegram failed (%s); retrying in %.1fs", exc, delay)
            except Exception:
                delay = backoff.next_delay()
                log.exception("polling Telegram failed unexpectedly; retrying in %.1fs", delay)
            else:
                failures = 0
                backoff.reset()
                refused.reset()
                self.token.accepted()
                self._connected = True
                if updates:
                    # Confirmed by the next call, after the whole batch is stored.
                    offset = updates[-1].update_id + 1
                continue
            failures += 1
            self._connected = failures < POLL_FAILURES_UNHEALTHY and not self.token.reason
            await asyncio.sleep(delay)

    def _me(self) -> User | None:
        """The bot's own account, once getMe has answered."""
        try:
            return self.bot.bot
        except RuntimeError:
            return None

    # Sending

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        try:
            body, parse_mode = render_part(text)
        except ValueError:
            # Too long in UTF-16 units even as plain text: send it in two halves.
            half = len(text) // 2
            await self.send(conversation, text[:half], idempotency_key + "a", reply_to)
            await self.send(conversation, text[half:], idempotency_key + "b")
            return
        part = partial(self._send_part, conversation, text, body, parse_mode)
        await replying(part, reply_to, f"a reply part to {conversation}")

    async def _send_part(
        self,
        conversation: str,
        text: str,
        body: str,
        parse_mode: str | None,
        reply_to: int | None,
    ) -> None:
        chat_id = _chat_id(conversation)
        where = _thread(conversation)
        if reply_to is not None:
            # Without the message (deleted meanwhile) the reply still goes, as a plain one.
            where["reply_parameters"] = ReplyParameters(reply_to, allow_sending_without_reply=True)
        backoff = Backoff(SEND_RETRY_FIRST_S, SEND_RETRY_CAP_S, jitter=0.5)
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                await self.bot.send_message(chat_id, body, parse_mode=parse_mode, **where)
                self.token.accepted()
                return
            except InvalidToken:
                # Revoked while running: an outage, as the core sees it (the reply waits in
                # the outbox); the log says what.
                self._refused("sendMessage")
                raise Unavailable(f"Telegram refuses {TOKEN_SETTING} for now") from None
            except RetryAfter as exc:
                raise _throttled(exc, chat_id) from None
            except ChatMigrated as exc:
                # The group became a supergroup: the part goes there at once (Telegram says
                # where), and the core moves the group's allowance with it.
                new_chat = int(exc.new_chat_id)
                log.info("telegram group %s moved to %s; sending there", chat_id, new_chat)
                await self._moved(str(chat_id), str(new_chat))
                chat_id = new_chat
            except Forbidden as exc:
                raise Unreachable(str(exc)) from exc
            except BadRequest as exc:
                if parse_mode is None or "parse entities" not in str(exc).lower():
                    # Telegram refused the request itself (chat not found, ...): the same
                    # request can never succeed.
                    raise SendFailed(str(exc), permanent=True) from exc
                log.info("telegram rejected the HTML entities; resending as plain text")
                body, parse_mode = plain_text(text), None
            except NetworkError as exc:
                if attempt == SEND_ATTEMPTS:
                    raise SendFailed(f"sendMessage kept failing: {exc}") from exc
                delay = backoff.next_delay()
                log.warning("sendMessage failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
        raise SendFailed("sendMessage kept failing")

    async def _moved(self, old_chat: str, new_chat: str) -> None:
        """Tell the core a group moved, found on the way (a send refused with the new id).
        Best effort: the service message in either chat tells it too."""
        if self._sink is None:
            return
        try:
            await self._sink.group_moved(PLATFORM, old_chat, new_chat)
        except Exception as exc:
            log.warning("the move of group %s to %s was not recorded: %s", old_chat, new_chat, exc)

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        """Telegram's limits: every call counts bot-wide; a message also in its chat, and in
        a group (a negative chat id) in the group's minute too. Drafts and typing are not
        messages: they count bot-wide only."""
        s = self.settings
        every = Scope(BOT_SCOPE, s.messages_per_second, 1.0)
        if call != "message":
            return (every,)
        chat_id = _chat_id(conversation)
        chat = Scope(f"chat:{chat_id}", s.chat_messages_per_second, 1.0)
        if chat_id >= 0:
            return (every, chat)
        return (every, chat, Scope(f"group:{chat_id}", s.group_messages_per_minute, 60.0))

    async def typing(self, conversation: str) -> None:
        chat_id = _chat_id(conversation)
        try:
            try:
                await self.bot.send_chat_action(chat_id, ChatAction.TYPING, **_thread(conversation))
            except ChatMigrated as exc:
                # A group upgraded to a supergroup: the indicator shows where the reply goes.
                await self.bot.send_chat_action(exc.new_chat_id, ChatAction.TYPING)
        except RetryAfter as exc:
            raise _throttled(exc, chat_id) from None

    async def draft(self, conversation: str, draft_id: int, text: str) -> None:
        """The reply so far as an ephemeral draft; "" shows "Thinking…"."""
        body, parse_mode = render_draft(text, self.max_message_chars) if text else ("", None)
        chat_id = _chat_id(conversation)
        try:
            await self.bot.send_message_draft(
                chat_id, draft_id, body, parse_mode=parse_mode, api_kwargs=dict(DRAFT_OPTIONS)
            )
        except RetryAfter as exc:
            raise _throttled(exc, chat_id) from None

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        """A file by its id: getFile, then the download. Reasons name no URL: Telegram's file
        URLs carry the bot token."""
        try:
            file = await self.bot.get_file(attachment.ref)
        except BadRequest as exc:
            raise FetchFailed(f"Telegram would not give the file ({exc.message})") from None
        except TelegramError as exc:
            raise FetchFailed(f"Telegram's getFile failed ({type(exc).__name__})") from None
        if file.file_size and file.file_size > max_bytes:
            raise FetchFailed(f"it is {file.file_size} bytes, over the limit of {max_bytes}")
        try:
            if not (file.file_path or "").startswith(("http://", "https://")):
                # A local Bot API server gives a path on this machine: read, not downloaded.
                return bytes(await file.download_as_bytearray())
            # The download request rather than file.download_as_bytearray(), which would
            # take a connection from the bot's own pool; the URL encoded as that method does.
            return bytes(await self.downloads.retrieve(file._get_encoded_url()))
        except InvalidToken:
            # What python-telegram-bot makes of any 404, a download's included.
            raise FetchFailed("Telegram no longer has the file (404)") from None
        except TelegramError as exc:
            raise FetchFailed(f"the download from Telegram failed ({type(exc).__name__})") from None


class AiohttpRequest(BaseRequest):
    """python-telegram-bot's requests on aiohttp rather than httpx: httpcore's pool scans
    every pooled connection (each one's socket polled) for every request and every response,
    which under a flood of replies, drafts and typing calls took a quarter of the event loop;
    aiohttp takes a free connection off a queue."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"User-Agent": self.USER_AGENT}
        self._form_headers = self._headers | {"Content-Type": "application/x-www-form-urlencoded"}

    @property
    def read_timeout(self) -> float | None:
        return API_TIMEOUTS_S[3]

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.connections)
            self._session = aiohttp.ClientSession(connector=connector)

    async def shutdown(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        if self._session is None or self._session.closed:
            raise RuntimeError("this AiohttpRequest is not initialized")
        connect, pool, write, read = (
            default if given is BaseRequest.DEFAULT_NONE or given is None else float(given)
            for given, default in zip(
                (connect_timeout, pool_timeout, write_timeout, read_timeout),
                API_TIMEOUTS_S,
                strict=True,
            )
        )
        timeout = aiohttp.ClientTimeout(
            total=connect + pool + write + read, connect=connect + pool, sock_read=read
        )
        data: Any = None
        headers = self._headers
        if request_data is not None and request_data.multipart_data:
            data = aiohttp.FormData(request_data.json_parameters)
            for name, (filename, content, mime) in request_data.multipart_data.items():
                data.add_field(name, content, filename=filename, content_type=mime)
        elif request_data is not None:
            # Encoded here: given a dict, aiohttp first fails to find a payload type for it,
            # then builds a multipart writer only to send the form urlencoded.
            data = urllib.parse.urlencode(request_data.json_parameters).encode()
            headers = self._form_headers
        try:
            async with self._session.request(
                method, url, data=data, timeout=timeout, headers=headers
            ) as response:
                status, payload = response.status, await response.read()
        except TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc
        if status == HTTPStatus.TOO_MANY_REQUESTS:
            # python-telegram-bot raises RetryAfter only for a retry_after that is not 0, and
            # makes any other 429 a plain NetworkError, retried at once as a network failure
            # would be: a 429 is flood control, whatever wait it names.
            raise RetryAfter(_retry_after(payload))
        return status, payload


def _retry_after(payload: bytes) -> timedelta:
    """The wait a 429's body names, as Telegram gave it (0, negative or huge: the core bounds
    it), within what a timedelta can hold; none if it names none."""
    try:
        value = json.loads(payload)["parameters"]["retry_after"]
    except (ValueError, KeyError, TypeError):
        return timedelta()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return timedelta()
    return timedelta(seconds=max(-LONGEST_RETRY_AFTER_S, min(value, LONGEST_RETRY_AFTER_S)))


# `lastword doctor`'s advice when the Bot API does not answer.
UNREACHABLE_FIX = "check the network, or LASTWORD_TELEGRAM__API_URL"


async def check(settings: Settings, timeout_s: float) -> Check:
    """Whether Telegram accepts the token (getMe), for `lastword doctor`."""
    return await guarded(
        _check(settings, timeout_s),
        timeout_s,
        Check("platform", False, f"telegram: no answer within {timeout_s:g} s", UNREACHABLE_FIX),
    )


async def _check(settings: Settings, timeout_s: float) -> Check:
    own = settings.section(TelegramSettings)
    api_url = own.api_url.rstrip("/")
    bot = Bot(
        own.token.get_secret_value(),
        base_url=api_url + "/bot",
        request=_httpx_request(connect_timeout=timeout_s, read_timeout=timeout_s),
        get_updates_request=_httpx_request(connect_timeout=timeout_s, read_timeout=timeout_s),
    )
    try:
        # initialize() is getMe, the token's own check.
        await bot.initialize()
        me = bot.bot
    except InvalidToken:
        # Not the exception's text: python-telegram-bot quotes the token in it.
        return Check(
            "platform",
            False,
            f"Telegram refused {TOKEN_SETTING} (getMe at {api_url})",
            TOKEN_FIX,
        )
    except TelegramError as exc:
        return Check(
            "platform",
            False,
            f"cannot reach Telegram at {api_url}: {type(exc).__name__}",
            UNREACHABLE_FIX,
        )
    finally:
        await bot.shutdown()
    found = f"telegram: @{me.username} ({me.id})"
    if not settings.groups.allowed:
        return Check("platform", True, found)
    if me.can_read_all_group_messages:
        return Check("platform", True, f"{found}, privacy mode off: it reads every group message")
    return Check(
        "platform",
        True,
        f"{found}, privacy mode on: in groups it reads only mentions, replies to it and "
        "commands (follow-ups without a mention and the room's context need it off: "
        "@BotFather, /setprivacy, Disable)",
    )


PLUGIN = Platform(
    create=lambda settings: TelegramAdapter(
        settings.section(TelegramSettings), settings.access.admins
    ),
    check=check,
    settings=TelegramSettings,
)

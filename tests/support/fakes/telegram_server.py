"""A loopback fake of the Telegram Bot API, for tests.

The Telegram adapter talks to Telegram through the real ``python-telegram-bot`` library. Tests
drive that same library against this fake instead of mocking it, so the wire format (form or
JSON encoded parameters, the ``{"ok": ..., "result": ...}`` envelope, error codes with their
``parameters``) and the library's own behaviour (exception classes such as ``RetryAfter``,
``BadRequest``, ``Forbidden`` and ``Conflict``; timeouts; long polling) are exercised for real,
while the test keeps full control: it queues updates for ``getUpdates``, scripts errors (the
next calls of a method, every call for a stretch of time, every call about one chat), sees
every call, and plays Telegram's webhook delivery with :func:`post_update`.

Drafts (``sendMessageDraft``) may carry the stop button (``can_stop``, Bot API 10.3); a test
presses it with :meth:`FakeTelegram.stop_pressed_update`, which builds the
``stopped_message_generation`` update Telegram sends then, and only for a draft that showed the
button. Like Telegram, the fake never queues an update of a kind the bot did not ask for (the
``allowed_updates`` of its last ``setWebhook`` or ``getUpdates``); :meth:`~FakeTelegram.delivers`
tells whether it would send one.

It also serves files, as the Bot API does for media a user sends: a test registers bytes with
:meth:`FakeTelegram.add_file`, builds a message that refers to the returned ``file_id``
(:meth:`~FakeTelegram.photo_update`, :meth:`~FakeTelegram.document_update`, ...), and the bot
resolves it with ``getFile`` and downloads ``{api_url}/file/bot{token}/{file_path}``, which is
where PTB looks when given ``base_file_url=f"{fake.api_url}/file/bot"``. Every ``getFile`` is a
:class:`RecordedCall` and every download a :class:`RecordedDownload`.

PTB builds request URLs as ``{base_url}{token}/{method}``, so a bot points at the fake with
``base_url=f"{fake.api_url}/bot"``; :attr:`FakeTelegram.api_url` is the Bot API base that
``LASTWORD_TELEGRAM__API_URL`` expects (``http://127.0.0.1:PORT``).

Groups: :meth:`FakeTelegram.group_text_update` builds a message in a group, a supergroup or a
forum topic, a reply to an earlier message, or one from another bot, with the ``mention`` and
``bot_command`` entities Telegram computes from the text. The fake remembers every message of
every chat (the users' it built and the bot's it sent; :meth:`~FakeTelegram.messages_in`) and
each chat as the users' messages showed it, so the bot's messages carry the right chat, their
``message_thread_id`` and the message they reply to; a reply to a message the chat does not have
is refused as Telegram refuses it, and so is a draft outside a private chat.

Telegram's rate limits are enforced when asked for (``FakeTelegram(limits=telegram_limits())``,
see :func:`telegram_limits`): a call past one is answered Telegram's 429 with ``retry_after``,
performs nothing, is recorded with status 429, and is counted in ``fake.limits.violations``.
Without ``limits`` nothing is limited.

Usage::

    async with FakeTelegram() as fake, Bot(fake.token, base_url=f"{fake.api_url}/bot") as bot:
        fake.push_update(fake.private_text_update(chat_id=7, user_id=7, text="hi"))
        [update] = await bot.get_updates()
        await bot.send_message(7, "hello")
        assert fake.sent_messages[0].params["text"] == "hello"
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import json
import mimetypes
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from tests.support.fakes.limits import Limit, Limits, retry_after
from tests.support.fakes.loopback import LoopbackServer

__all__ = [
    "DEFAULT_TOKEN",
    "MAX_DOWNLOAD_SIZE",
    "STOP_PRESSED",
    "FakeTelegram",
    "RecordedCall",
    "RecordedDownload",
    "ScriptedError",
    "WebhookConfig",
    "post_update",
    "telegram_limits",
]

DEFAULT_TOKEN = "123456789:AAFakeTelegramTokenForTests0123456789"

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"

# The cloud Bot API refuses getFile for anything larger ("file is too big").
MAX_DOWNLOAD_SIZE = 20 * 1024 * 1024

_T = TypeVar("_T")

# The methods the fake implements; Telegram treats method names case-insensitively.
_METHODS = (
    "getMe",
    "setWebhook",
    "deleteWebhook",
    "getWebhookInfo",
    "getUpdates",
    "sendMessage",
    "sendChatAction",
    "sendMessageDraft",
    "editMessageText",
    "deleteMessage",
    "getFile",
    "setMyCommands",
    "getMyCommands",
    "deleteMyCommands",
)
_CANONICAL = {name.lower(): name for name in _METHODS}

# The methods that count against the bot-wide limit: everything the bot shows or changes in a
# chat. Only sendMessage makes a message, so only it counts against the per-chat and per-group
# limits (drafts and typing indicators are not messages).
_SENDING = frozenset(
    {"sendMessage", "sendMessageDraft", "sendChatAction", "editMessageText", "deleteMessage"}
)

# Form-encoded requests (what PTB sends) carry every value as a string: PTB leaves strings as
# they are and JSON-encodes everything else. The real server types fields by name; so does this.
_INT_FIELDS = frozenset(
    {
        "chat_id",
        "message_id",
        "offset",
        "limit",
        "timeout",
        "max_connections",
        "reply_to_message_id",
        "message_thread_id",
        "draft_id",
    }
)
_BOOL_FIELDS = frozenset(
    {
        "drop_pending_updates",
        "disable_notification",
        "protect_content",
        "disable_web_page_preview",
        "allow_sending_without_reply",
        "can_stop",
        "keep_on_stop",
    }
)
_JSON_FIELDS = frozenset(
    {
        "allowed_updates",
        "reply_parameters",
        "reply_markup",
        "entities",
        "link_preview_options",
        "commands",
        "scope",
    }
)

_TAG_RE = re.compile(r"<[^>]*>")
# What Telegram takes as a command of the menu (setMyCommands), and how many.
_MENU_COMMAND_RE = re.compile(r"[a-z0-9_]{1,32}")
_MENU_DESCRIPTION_CHARS = 256
_MENU_MAX_COMMANDS = 100

# What a press of a draft's stop button arrives as (Bot API 10.3, MessageGenerationStopped).
STOP_PRESSED = "stopped_message_generation"
# What Telegram sends when allowed_updates was never given, or given empty.
_NOT_SENT_BY_DEFAULT = frozenset({"chat_member", "message_reaction", "message_reaction_count"})


@dataclass
class RecordedCall:
    """One Bot API call as the fake received it, and how it was answered."""

    method: str
    params: dict[str, Any]
    at: float
    # HTTP status of the answer; None while the call is still in flight (a long poll).
    status: int | None = None
    result: Any = None
    description: str | None = None
    # The request path as received (decoded), token included: "/bot<token>/getFile".
    path: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def text(self) -> str | None:
        value = self.params.get("text")
        return value if isinstance(value, str) else None

    @property
    def chat_id(self) -> int | str | None:
        value = self.params.get("chat_id")
        return value if isinstance(value, int | str) else None

    @property
    def file_id(self) -> str | None:
        value = self.params.get("file_id")
        return value if isinstance(value, str) else None

    @property
    def reply_to_message_id(self) -> int | None:
        """The message the call replies to: ``reply_parameters.message_id``, or the legacy
        ``reply_to_message_id``; None if it replies to none."""
        return _reply_to(self.params)

    @property
    def thread_id(self) -> int | None:
        """The ``message_thread_id`` the call gave (a forum topic), or None."""
        return _opt_int(self.params.get("message_thread_id"))


@dataclass
class RecordedDownload:
    """One ``GET /file/bot<token>/<file_path>`` as the fake received it, and its status."""

    # The request path as received (decoded), token included.
    path: str
    # The part after the token, and the registered file it names (None if it names none).
    file_path: str
    file_id: str | None
    at: float
    status: int

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class _StoredFile:
    file_id: str
    file_unique_id: str
    data: bytes
    # What getFile and the message builders report; may differ from len(data) on purpose.
    size: int
    file_path: str
    reachable: bool = True


# The ids Telegram sends an anonymous group admin's messages from (@GroupAnonymousBot) and
# posts a linked channel's automatic forwards from (the service account, "Telegram").
ANONYMOUS_ADMIN = 1087968824
SERVICE_ACCOUNT = 777000


@dataclass
class ScriptedError:
    """A Bot API error the fake answers with instead of performing a call."""

    status: int
    description: str
    parameters: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            payload["parameters"] = self.parameters
        return payload


@dataclass
class _Phase:
    """A stretch of time during which every call of a method fails with one error."""

    error: ScriptedError
    seconds: float
    # When the first call it answered arrived; the phase ends `seconds` after that.
    began: float | None = None


@dataclass
class WebhookConfig:
    """What the last successful ``setWebhook`` asked for."""

    url: str
    secret_token: str | None
    allowed_updates: list[str] | None
    max_connections: int | None
    drop_pending_updates: bool


@dataclass
class _Poll:
    call: RecordedCall
    terminated: bool = False


class _CallError(Exception):
    def __init__(self, error: ScriptedError) -> None:
        super().__init__(error.description)
        self.error = error


def _bad_request(description: str) -> _CallError:
    return _CallError(ScriptedError(400, f"Bad Request: {description}"))


class FakeTelegram(LoopbackServer):
    """Fake Telegram Bot API server on 127.0.0.1 with an OS-chosen port."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        bot_username: str = "fake_bot",
        limits: Limits | None = None,
        can_read_all_group_messages: bool = False,
    ) -> None:
        """``can_read_all_group_messages``: what getMe reports; True is a bot whose privacy
        mode is off (it sees every message in its groups, not only commands and mentions)."""
        super().__init__()
        self.token = token
        # The rate limits enforced (see telegram_limits), and their violations; None: none.
        self.limits = limits
        bot_id_text = token.split(":", 1)[0]
        self.bot_user: dict[str, Any] = {
            "id": int(bot_id_text) if bot_id_text.isdigit() else 424242,
            "is_bot": True,
            "first_name": "Fake Bot",
            "username": bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": can_read_all_group_messages,
            "supports_inline_queries": False,
        }
        self.calls: list[RecordedCall] = []
        self.webhook: WebhookConfig | None = None
        # Telegram measures the text after entity parsing; see _visible_length.
        self.max_message_length = 4096
        self.max_concurrent_get_updates = 0
        self._pending: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1)
        # The allowed_updates of the last getUpdates that gave one; None: never given.
        self._poll_allowed: list[str] | None = None
        # Highest update_id confirmed by an offset; updates at or below it are never returned.
        self._confirmed_below = 0
        # Message ids are per chat and shared by both directions, as in Telegram's private chats.
        self._message_ids: dict[int | str, int] = {}
        self._bot_messages: dict[tuple[int | str, int], dict[str, Any]] = {}
        # Every message of every chat by id, the users' (as built) and the bot's (as sent; the
        # same objects as in _bot_messages, so edits show); and each chat as the users'
        # messages last showed it, for the bot's messages there.
        self._chat_messages: dict[int | str, dict[int, dict[str, Any]]] = {}
        self._chats: dict[int | str, dict[str, Any]] = {}
        self._errors: dict[str, list[ScriptedError | None]] = {}
        self._phases: dict[str, list[_Phase]] = {}
        # By chat and method (None: every method about the chat).
        self._chat_errors: dict[tuple[int | str, str | None], ScriptedError] = {}
        # Set by refuse_token: every call is answered 401, as for a revoked token.
        self._token_refused = False
        self._polls: list[_Poll] = []
        self._files: dict[str, _StoredFile] = {}
        self._files_by_path: dict[str, _StoredFile] = {}
        self._media_group_ids = itertools.count(1)
        self.downloads: list[RecordedDownload] = []
        # The command menus set by setMyCommands, by scope as sent (None: the default scope),
        # each a list of {"command", "description"}.
        self.menus: dict[str | None, list[dict[str, str]]] = {}
        # Methods whose calls are held unanswered (see hang).
        self._hung: dict[str, asyncio.Event] = {}
        # Replaced on every state change so waiters can sleep on "something changed" without
        # polling and without needing a lock from synchronous code paths.
        self._changed = asyncio.Event()

    # -- lifecycle ---------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        # Telegram accepts GET and POST on every method; the token is part of the path.
        # (Handler cancellation, on in LoopbackServer, makes a long poll whose client hung up
        # or was killed stop counting as in flight.)
        # File downloads come first: the catch-all would answer them 404 as unknown methods.
        app.router.add_get("/file/{token}/{file_path:.*}", self._download)
        app.router.add_route("*", "/{tail:.*}", self._handle)

    @property
    def api_url(self) -> str:
        """The Bot API base, e.g. ``http://127.0.0.1:PORT``; PTB wants ``api_url + "/bot"``."""
        return self.origin

    # -- scripting ---------------------------------------------------------------------------

    def fail_next(self, method: str, *errors: ScriptedError | None) -> None:
        """Queue errors for ``method``; its next calls answer with them, one each, in order.
        A None in the queue lets that call through, so a later one can be made to fail.

        The calls are still recorded, with the error's status and description.
        """
        self._errors.setdefault(_CANONICAL.get(method.lower(), method), []).extend(errors)

    def fail_for(self, method: str, seconds: float, error: ScriptedError) -> None:
        """Answer every call of ``method`` with ``error`` for ``seconds``, counted from the
        first call it answers (so a test need not know when the bot starts calling). Phases
        for one method follow each other in the order they were scripted; errors queued by
        :meth:`fail_next` come first. E.g. 429 for 5 s, then 502 for 5 s, then calls succeed.
        """
        method = _CANONICAL.get(method.lower(), method)
        self._phases.setdefault(method, []).append(_Phase(error, seconds))

    def hang(self, method: str, on: bool = True) -> None:
        """Hold every call of ``method`` unanswered from now on, as a Bot API that hangs does,
        until ``hang(method, False)`` lets them through (or the client gives up)."""
        method = _CANONICAL.get(method.lower(), method)
        if on:
            self._hung.setdefault(method, asyncio.Event())
        elif (gate := self._hung.pop(method, None)) is not None:
            gate.set()

    def menu(self, chat_id: int | None = None) -> list[dict[str, str]] | None:
        """The command menu set for the default scope, or for one private chat (a
        ``BotCommandScopeChat``); None if none was set."""
        if chat_id is None:
            return self.menus.get(None)
        return self.menus.get(json.dumps({"type": "chat", "chat_id": chat_id}, sort_keys=True))

    def fail_chat(
        self, chat_id: int | str, error: ScriptedError | None, method: str | None = None
    ) -> None:
        """Answer every call about ``chat_id`` (sending, typing, editing) with ``error`` from
        now on, as Telegram does for a user who blocked the bot or a chat that is gone; None
        lifts it (the user unblocked the bot). With ``method``, only that method's calls
        about the chat (a 429 on its typing calls alone); those come before the chat's own."""
        key = (chat_id, None if method is None else _CANONICAL.get(method.lower(), method))
        if error is None:
            self._chat_errors.pop(key, None)
        else:
            self._chat_errors[key] = error

    def refuse_token(self, refused: bool = True) -> None:
        """From now on answer every call 401 Unauthorized, as Telegram does once the token
        was revoked (refused=False: the token works again); a long poll in flight ends with
        it. Unlike a wrong token, these calls are recorded, so a test can count how often
        the bot still asks."""
        self._token_refused = refused
        self._notify()

    @staticmethod
    def unauthorized() -> ScriptedError:
        return ScriptedError(401, "Unauthorized")

    @staticmethod
    def too_many_requests(retry_after: float) -> ScriptedError:
        """Flood control, with the wait as given: 0, negative and huge ones too, which
        Telegram should never send and a bot must survive."""
        return ScriptedError(
            429,
            f"Too Many Requests: retry after {retry_after}",
            {"retry_after": retry_after},
        )

    @staticmethod
    def cant_parse_entities() -> ScriptedError:
        return ScriptedError(
            400,
            'Bad Request: can\'t parse entities: Unsupported start tag "span" at byte offset 0',
        )

    @staticmethod
    def forbidden_blocked() -> ScriptedError:
        return ScriptedError(403, "Forbidden: bot was blocked by the user")

    @staticmethod
    def chat_not_found() -> ScriptedError:
        return ScriptedError(400, "Bad Request: chat not found")

    @staticmethod
    def server_error(status: int = 500) -> ScriptedError:
        descriptions = {500: "Internal Server Error", 502: "Bad Gateway"}
        return ScriptedError(status, descriptions.get(status, "Internal Server Error"))

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue an update for ``getUpdates``; assigns ``update_id`` if missing. Returns it.

        An update of a kind the bot did not ask for (see :meth:`delivers`) is not queued, as
        Telegram never keeps one; its id is still returned.
        """
        update_id = update.get("update_id")
        if not isinstance(update_id, int):
            update_id = next(self._update_ids)
            update["update_id"] = update_id
        if not self.delivers(update):
            return update_id
        self._pending.append(update)
        self._pending.sort(key=lambda u: int(u["update_id"]))
        self._notify()
        return update_id

    def delivers(self, update: dict[str, Any]) -> bool:
        """Whether Telegram would send ``update`` now: its kind is in the ``allowed_updates``
        of the webhook, or of the last ``getUpdates`` that gave one while no webhook is set
        (never given, or empty: every kind but chat_member and the reaction counts)."""
        allowed = self.webhook.allowed_updates if self.webhook else self._poll_allowed
        kinds = set(update) - {"update_id"}
        if allowed:
            return kinds <= set(allowed)
        return not kinds & _NOT_SENT_BY_DEFAULT

    # -- files (what getFile resolves and /file/bot<token>/... serves) ------------------------

    def add_file(
        self,
        data: bytes,
        *,
        file_unique_id: str | None = None,
        declared_size: int | None = None,
        file_path: str | None = None,
    ) -> str:
        """Put ``data`` on Telegram's servers, as a user's upload would; return its new
        ``file_id``, for the message builders' ``file_id``/``photo`` and for ``getFile``.

        ``declared_size`` is the ``file_size`` that getFile and the built messages report
        instead of ``len(data)``: a test can have a 50 MB file meet the 20 MB limit without
        holding 50 MB. ``file_path`` is where it downloads from (default
        ``documents/file_<n>``); Telegram picks it, and a test may pick one with spaces or
        non-ASCII letters to check the download URL is encoded.
        """
        return self._store_file(
            data, file_unique_id, declared_size, lambda n: file_path or f"documents/file_{n}"
        )

    def make_unreachable(self, file_id: str) -> None:
        """Make downloads of ``file_id`` answer 404 Not Found while ``getFile`` still resolves
        it, as for a link that expired (Telegram keeps one for an hour) or a file Telegram lost:
        the bot learns only when it fetches. (For a getFile that fails, register the file with
        a ``declared_size`` over 20 MB, or use an id that was never registered.)
        """
        self._files[file_id].reachable = False

    def _store_file(
        self,
        data: bytes,
        file_unique_id: str | None,
        declared_size: int | None,
        file_path_for: Callable[[int], str],
    ) -> str:
        number = len(self._files) + 1
        file_path = file_path_for(number)
        if file_path in self._files_by_path:
            raise ValueError(f"file_path {file_path!r} is already taken")
        stored = _StoredFile(
            file_id=f"file-{number}",
            file_unique_id=file_unique_id or f"unique-{number}",
            data=bytes(data),
            size=len(data) if declared_size is None else declared_size,
            file_path=file_path,
        )
        self._files[stored.file_id] = stored
        self._files_by_path[file_path] = stored
        return stored.file_id

    def _file_fields(self, file_id: str) -> dict[str, Any]:
        """The fields every media object starts with; a registered file adds its size."""
        stored = self._files.get(file_id)
        if stored is None:
            return {"file_id": file_id, "file_unique_id": f"u-{file_id}"}
        return {
            "file_id": file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": stored.size,
        }

    # -- update builders (Bot API JSON, ready for push_update or post_update) ----------------

    def private_text_update(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        message_id: int | None = None,
        first_name: str = "Ann",
    ) -> dict[str, Any]:
        message = self._inbound(chat_id, user_id, first_name, "private", message_id)
        message["text"] = text
        return self._update("message", message)

    def edited_update(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        message_id: int,
        first_name: str = "Ann",
    ) -> dict[str, Any]:
        """An ``edited_message``: the message ``message_id`` now reads ``text``."""
        message = self._inbound(chat_id, user_id, first_name, "private", message_id)
        message["text"] = text
        message["edit_date"] = message["date"]
        return self._update("edited_message", message)

    def stop_pressed_update(
        self, chat_id: int, draft_id: int | None = None, first_name: str = "Ann"
    ) -> dict[str, Any]:
        """The ``stopped_message_generation`` update Telegram sends when the user presses the
        stop button on the draft ``draft_id`` of the private chat ``chat_id`` (default: the
        last draft shown there). Raises AssertionError if no draft with that id was shown
        there with ``can_stop``, as the user then had no button to press."""
        shown = [
            c
            for c in self.calls_to("sendMessageDraft")
            if c.ok
            and c.chat_id == chat_id
            and (draft_id is None or c.params["draft_id"] == draft_id)
        ]
        assert shown, f"no draft {draft_id or ''} was shown in chat {chat_id}"
        last = shown[-1]
        assert last.params.get("can_stop") is True, f"draft {last.params} had no stop button"
        stopped: dict[str, Any] = {
            "chat": {"id": chat_id, "type": "private", "first_name": first_name},
            "draft_id": last.params["draft_id"],
        }
        if "message_thread_id" in last.params:
            stopped["message_thread_id"] = last.params["message_thread_id"]
        return self._update(STOP_PRESSED, stopped)

    def group_text_update(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        message_id: int | None = None,
        first_name: str = "Ann",
        title: str = "Test group",
        *,
        supergroup: bool = False,
        topic: int | None = None,
        reply_to: int | None = None,
        is_bot: bool = False,
        username: str | None = None,
        sender_chat: dict[str, Any] | None = None,
        automatic_forward: bool = False,
    ) -> dict[str, Any]:
        """A message in a group; ``chat_id`` should be negative, as Telegram's group ids are.

        It carries the ``mention`` (``@name``) and ``bot_command`` (``/cmd``, ``/cmd@bot``)
        entities Telegram finds in ``text``, offsets and lengths in UTF-16 code units.

        - ``supergroup``: the chat is a supergroup (else a basic group).
        - ``topic``: the message is in that forum topic (the chat a forum supergroup); the
          topic's id is the id of the message that created it. Without ``reply_to`` the
          message replies, as in Telegram, to that creation message (``forum_topic_created``),
          which a bot must not take for a reply to something said.
        - ``reply_to``: the message replies to that message of the chat, the user's or the
          bot's as the fake remembers it (a minimal one if it knows none).
        - ``is_bot``: another bot posts it (``from.is_bot``; username ``otherbot`` unless
          ``username`` says otherwise); ``username``: the sender's ``@username``.
        - ``sender_chat``: the chat the message is sent on behalf of (``{"id", "type",
          "title"}``): the group itself for an anonymous admin (then ``user_id`` should be
          ``ANONYMOUS_ADMIN`` and ``is_bot`` true, as Telegram sends it), or a channel.
        - ``automatic_forward``: a linked channel's post forwarded into its discussion group
          (``is_automatic_forward``; ``user_id`` should be ``SERVICE_ACCOUNT``, ``sender_chat``
          the channel).

        The chat is remembered as built here: the bot's messages there show it.
        """
        forum = topic is not None
        chat: dict[str, Any] = {
            "id": chat_id,
            "title": title,
            "type": "supergroup" if supergroup or forum else "group",
        }
        if forum:
            chat["is_forum"] = True
        sender: dict[str, Any] = {"id": user_id, "is_bot": is_bot, "first_name": first_name}
        if is_bot or username is not None:
            sender["username"] = username or "otherbot"
        if not is_bot:
            sender["language_code"] = "en"
        self._chats[chat_id] = chat
        creation = None if topic is None else self._topic_created(chat_id, topic, sender)
        message = self._inbound(chat_id, user_id, first_name, "group", message_id)
        message["from"] = sender
        message["chat"] = dict(chat)
        if topic is not None:
            message["message_thread_id"] = topic
            message["is_topic_message"] = True
        if sender_chat is not None:
            message["sender_chat"] = dict(sender_chat)
        if automatic_forward:
            message["is_automatic_forward"] = True
        if reply_to is not None:
            message["reply_to_message"] = self._replied(chat_id, reply_to)
        elif creation is not None:
            message["reply_to_message"] = _without_reply(creation)
        message["text"] = text
        if entities := _entities(text):
            message["entities"] = entities
        return self._update("message", message)

    def group_edited_update(self, chat_id: int, message_id: int, text: str) -> dict[str, Any]:
        """An ``edited_message``: the group message ``message_id`` (one built here) now reads
        ``text``, with the entities Telegram finds in it."""
        message = self._chat_messages[chat_id][message_id]
        edited = json.loads(json.dumps(message))
        edited["text"] = text
        edited.pop("entities", None)
        if entities := _entities(text):
            edited["entities"] = entities
        edited["edit_date"] = int(time.time())
        return self._update("edited_message", edited)

    def migrate(self, chat_id: int, to_chat_id: int, by: int = 1) -> list[dict[str, Any]]:
        """Upgrade the basic group ``chat_id`` to the supergroup ``to_chat_id``, as Telegram
        does: from now on every call about the old chat is answered 400 with
        ``parameters.migrate_to_chat_id``. Returns the two service messages Telegram posts,
        as updates: ``migrate_to_chat_id`` in the old group and ``migrate_from_chat_id`` in the
        new one (user ``by`` upgraded it)."""
        old = dict(self._chat(chat_id))
        new = {"id": to_chat_id, "title": old.get("title", "Test group"), "type": "supergroup"}
        self._chats[to_chat_id] = new
        self.fail_chat(
            chat_id,
            ScriptedError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": to_chat_id},
            ),
        )
        updates = []
        for chat, field, other in (
            (old, "migrate_to_chat_id", to_chat_id),
            (new, "migrate_from_chat_id", chat_id),
        ):
            message = self._inbound(chat["id"], by, "Ann", "group", None)
            message["chat"] = dict(chat)
            message[field] = other
            updates.append({"update_id": next(self._update_ids), "message": message})
        return updates

    # Media builders: a message refers to a file by the id add_file returned; without one it
    # gets a made-up id that getFile does not know (enough for a bot that ignores media).

    def sticker_update(
        self,
        chat_id: int,
        user_id: int,
        emoji: str = "\N{THUMBS UP SIGN}",
        message_id: int | None = None,
        first_name: str = "Ann",
        *,
        file_id: str | None = None,
        is_animated: bool = False,
        is_video: bool = False,
    ) -> dict[str, Any]:
        """A sticker; Telegram allows it no caption."""

        def sticker(mid: int) -> dict[str, Any]:
            return {
                **self._file_fields(file_id or f"sticker-{mid}"),
                "type": "regular",
                "width": 512,
                "height": 512,
                "is_animated": is_animated,
                "is_video": is_video,
                "emoji": emoji,
            }

        return self._media_update(chat_id, user_id, first_name, message_id, "sticker", sticker)

    def photo_update(
        self,
        chat_id: int,
        user_id: int,
        caption: str | None = None,
        message_id: int | None = None,
        first_name: str = "Ann",
        *,
        photo: str | Sequence[str] | None = None,
        width: int = 1280,
        height: int = 960,
        media_group_id: str | None = None,
    ) -> dict[str, Any]:
        """A photo as Telegram sends it: one PhotoSize per size it keeps, smallest first, the
        last ``width`` x ``height``. ``photo`` is the file id of the largest (the fake adds a
        registered thumbnail below it) or the ids of every size, smallest first. Messages
        sharing a ``media_group_id`` are one album; see :meth:`album_updates`.
        """

        def sizes(mid: int) -> list[dict[str, Any]]:
            ids = self._photo_ids(photo, mid)
            return [
                {
                    **self._file_fields(size_id),
                    "width": width * (i + 1) // len(ids),
                    "height": height * (i + 1) // len(ids),
                }
                for i, size_id in enumerate(ids)
            ]

        return self._media_update(
            chat_id, user_id, first_name, message_id, "photo", sizes, caption, media_group_id
        )

    def album_updates(
        self,
        chat_id: int,
        user_id: int,
        photos: Sequence[str | Sequence[str]],
        caption: str | None = None,
        first_name: str = "Ann",
        *,
        media_group_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """An album: one photo message per entry of ``photos`` (each what
        :meth:`photo_update` takes as ``photo``), all with one ``media_group_id``. Telegram
        delivers them as separate updates, the album's caption on the first only.
        """
        group = media_group_id or str(13_000_000_000_000_000 + next(self._media_group_ids))
        return [
            self.photo_update(
                chat_id,
                user_id,
                caption if i == 0 else None,
                first_name=first_name,
                photo=photo,
                media_group_id=group,
            )
            for i, photo in enumerate(photos)
        ]

    def voice_update(
        self,
        chat_id: int,
        user_id: int,
        duration: int = 3,
        message_id: int | None = None,
        first_name: str = "Ann",
        *,
        file_id: str | None = None,
        caption: str | None = None,
    ) -> dict[str, Any]:
        """A voice note: Telegram records them as Opus in Ogg."""

        def voice(mid: int) -> dict[str, Any]:
            return {
                **self._file_fields(file_id or f"voice-{mid}"),
                "duration": duration,
                "mime_type": "audio/ogg",
            }

        return self._media_update(chat_id, user_id, first_name, message_id, "voice", voice, caption)

    def audio_update(
        self,
        chat_id: int,
        user_id: int,
        duration: int = 180,
        message_id: int | None = None,
        first_name: str = "Ann",
        *,
        file_id: str | None = None,
        caption: str | None = None,
        file_name: str = "song.mp3",
        mime_type: str = "audio/mpeg",
        title: str | None = "Song",
        performer: str | None = "Artist",
    ) -> dict[str, Any]:
        """An audio file (music, sent as such rather than as a voice note or a document)."""

        def audio(mid: int) -> dict[str, Any]:
            fields: dict[str, Any] = {
                **self._file_fields(file_id or f"audio-{mid}"),
                "duration": duration,
                "file_name": file_name,
                "mime_type": mime_type,
            }
            if title is not None:
                fields["title"] = title
            if performer is not None:
                fields["performer"] = performer
            return fields

        return self._media_update(chat_id, user_id, first_name, message_id, "audio", audio, caption)

    def document_update(
        self,
        chat_id: int,
        user_id: int,
        file_name: str = "notes.pdf",
        caption: str | None = None,
        message_id: int | None = None,
        first_name: str = "Ann",
        *,
        file_id: str | None = None,
        mime_type: str | None = None,
        media_group_id: str | None = None,
    ) -> dict[str, Any]:
        """A file sent as a document; ``mime_type`` defaults to the one ``file_name`` suggests,
        as Telegram's clients send it."""
        if mime_type is None:
            mime_type = mimetypes.guess_type(file_name)[0] or "application/octet-stream"

        def document(mid: int) -> dict[str, Any]:
            return {
                **self._file_fields(file_id or f"doc-{mid}"),
                "file_name": file_name,
                "mime_type": mime_type,
            }

        return self._media_update(
            chat_id,
            user_id,
            first_name,
            message_id,
            "document",
            document,
            caption,
            media_group_id,
        )

    def _photo_ids(self, photo: str | Sequence[str] | None, message_id: int) -> list[str]:
        """The file ids of a photo's sizes, smallest first."""
        if photo is None:
            return [f"photo-{message_id}-s", f"photo-{message_id}-m"]
        if isinstance(photo, str):
            data = b"thumbnail of " + photo.encode()
            thumbnail = self._store_file(data, None, None, lambda n: f"photos/file_{n}.jpg")
            return [thumbnail, photo]
        if not photo:
            raise ValueError("a photo has at least one size")
        return list(photo)

    def _media_update(
        self,
        chat_id: int,
        user_id: int,
        first_name: str,
        message_id: int | None,
        field: str,
        content: Callable[[int], Any],
        caption: str | None = None,
        media_group_id: str | None = None,
    ) -> dict[str, Any]:
        """A private message carrying `field` (built from the message id), and a caption;
        a `media_group_id` makes it part of an album."""
        message = self._inbound(chat_id, user_id, first_name, "private", message_id)
        message[field] = content(message["message_id"])
        if caption is not None:
            message["caption"] = caption
        if media_group_id is not None:
            message["media_group_id"] = media_group_id
        return self._update("message", message)

    def _inbound(
        self, chat_id: int, user_id: int, first_name: str, chat_type: str, message_id: int | None
    ) -> dict[str, Any]:
        if message_id is None:
            message_id = self._next_message_id(chat_id)
        else:
            self._message_ids[chat_id] = max(self._message_ids.get(chat_id, 0), message_id)
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        return {
            "message_id": message_id,
            "from": {
                "id": user_id,
                "is_bot": False,
                "first_name": first_name,
                "language_code": "en",
            },
            "chat": chat,
            "date": int(time.time()),
        }

    def _update(self, kind: str, message: dict[str, Any]) -> dict[str, Any]:
        if kind in ("message", "edited_message"):
            self._remember(message)
        return {"update_id": next(self._update_ids), kind: message}

    def _remember(self, message: dict[str, Any]) -> None:
        """Keep a copy of a user's message (an edit replaces it) and its chat, as shown."""
        chat = message["chat"]
        kept = json.loads(json.dumps(message))
        self._chat_messages.setdefault(chat["id"], {})[int(message["message_id"])] = kept
        self._chats[chat["id"]] = dict(kept["chat"])

    def _replied(self, chat_id: int | str, message_id: int) -> dict[str, Any]:
        """What a ``reply_to_message`` shows of ``message_id``: the message as remembered
        (Telegram nests no reply in it), or a minimal one if the fake knows none."""
        known = self._chat_messages.get(chat_id, {}).get(message_id)
        if known is not None:
            return _without_reply(known)
        return {
            "message_id": message_id,
            "chat": dict(self._chat(chat_id)),
            "date": int(time.time()),
        }

    def _topic_created(
        self, chat_id: int | str, topic: int, creator: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The service message that created forum topic ``topic`` (its id is the topic's): the
        one remembered, or a new one (by ``creator``), remembered from now on."""
        known = self._chat_messages.get(chat_id, {}).get(topic)
        if known is not None and "forum_topic_created" in known:
            return known
        created: dict[str, Any] = {
            "message_id": topic,
            "chat": dict(self._chat(chat_id)),
            "date": int(time.time()),
            "message_thread_id": topic,
            "is_topic_message": True,
            # PTB requires the colour: 0x6FB9F0, the first of Telegram's topic colours.
            "forum_topic_created": {"name": "Topic", "icon_color": 0x6FB9F0},
        }
        if creator is not None:
            created["from"] = dict(creator)
        if known is None:
            self._chat_messages.setdefault(chat_id, {})[topic] = created
            self._message_ids[chat_id] = max(self._message_ids.get(chat_id, 0), topic)
        return created

    def _chat(self, chat_id: int | str) -> dict[str, Any]:
        """The chat as the users' messages last showed it, or what its id suggests."""
        known = self._chats.get(chat_id)
        if known is not None:
            return known
        if isinstance(chat_id, int) and chat_id < 0:
            return {"id": chat_id, "type": "group", "title": "Test group"}
        return {"id": chat_id, "type": "private"}

    def _next_message_id(self, chat_id: int | str) -> int:
        message_id = self._message_ids.get(chat_id, 0) + 1
        self._message_ids[chat_id] = message_id
        return message_id

    # -- webhook delivery --------------------------------------------------------------------

    async def deliver(self, update: dict[str, Any]) -> int:
        """POST ``update`` to the registered webhook with its secret, as Telegram would.
        Raises ValueError for an update of a kind the webhook did not ask for."""
        if self.webhook is None:
            raise RuntimeError("no webhook is set")
        if not self.delivers(update):
            raise ValueError(f"Telegram would not send {sorted(set(update) - {'update_id'})}")
        return await post_update(self.webhook.url, update, self.webhook.secret_token)

    # -- observation -------------------------------------------------------------------------

    @property
    def sent_messages(self) -> list[RecordedCall]:
        """The ``sendMessage`` calls that succeeded, in order."""
        return [c for c in self.calls if c.method == "sendMessage" and c.ok]

    def messages_in(self, chat_id: int | str) -> list[dict[str, Any]]:
        """Every message of the chat the fake knows, by id: the users' it built (as last
        built: an edit replaces one), topic creations, and the bot's it sent (as edited; not
        those it deleted). Copies: changing them changes nothing."""
        kept = self._chat_messages.get(chat_id, {})
        return [json.loads(json.dumps(kept[mid])) for mid in sorted(kept)]

    def bot_replies_in(self, chat_id: int | str, thread: int | None = None) -> list[RecordedCall]:
        """The ``sendMessage`` calls to ``chat_id`` that succeeded, in order; only those in
        forum topic ``thread`` if given."""
        return [
            c
            for c in self.sent_messages
            if c.chat_id == chat_id and (thread is None or c.thread_id == thread)
        ]

    async def wait_for_bot_replies(
        self,
        chat_id: int | str,
        count: int = 1,
        thread: int | None = None,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[RecordedCall]:
        """Wait until :meth:`bot_replies_in` has at least ``count`` calls; return them."""
        return await self._wait(lambda: self.bot_replies_in(chat_id, thread), count, timeout)

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Queued updates not yet confirmed by a ``getUpdates`` offset."""
        return list(self._pending)

    @property
    def get_updates_in_flight(self) -> int:
        return len(self._polls)

    def calls_to(self, method: str) -> list[RecordedCall]:
        return [c for c in self.calls if c.method == method]

    @property
    def get_file_calls(self) -> list[RecordedCall]:
        """Every ``getFile`` call, answered or failed, in order; ``.file_id`` says which."""
        return self.calls_to("getFile")

    async def wait_for_calls(
        self,
        method: str,
        count: int = 1,
        # A plain parameter rather than asyncio.timeout() at the call site, as in FakeOpenAI.
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[RecordedCall]:
        """Wait until at least ``count`` calls of ``method`` arrived; return all of them.

        A call counts on arrival, before it is answered (so a long poll counts while it waits).
        Raises TimeoutError after ``timeout`` seconds.
        """
        return await self._wait(lambda: self.calls_to(method), count, timeout)

    async def wait_for_sent(
        self,
        count: int = 1,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[RecordedCall]:
        """Wait until at least ``count`` ``sendMessage`` calls succeeded; return all of them."""
        return await self._wait(lambda: self.sent_messages, count, timeout)

    async def wait_for_downloads(
        self,
        count: int = 1,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[RecordedDownload]:
        """Wait until at least ``count`` downloads were answered (any status); return all."""
        return await self._wait(lambda: self.downloads, count, timeout)

    async def wait_for_confirmed(
        self,
        update_id: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> None:
        """Wait until a ``getUpdates`` offset above ``update_id`` confirmed it."""
        async with asyncio.timeout(timeout):
            while self._confirmed_below <= update_id:
                await self._changed.wait()

    async def _wait(self, current: Callable[[], list[_T]], count: int, limit_s: float) -> list[_T]:
        async with asyncio.timeout(limit_s):
            while True:
                found = current()
                if len(found) >= count:
                    return found
                await self._changed.wait()

    def _notify(self) -> None:
        changed = self._changed
        self._changed = asyncio.Event()
        changed.set()

    # -- handlers ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.match_info["tail"]
        token, _, method_name = path.partition("/")
        if not token.startswith("bot") or not method_name or "/" in method_name:
            return _envelope(ScriptedError(404, "Not Found").body(), 404)
        if token[len("bot") :] != self.token:
            return _envelope(ScriptedError(401, "Unauthorized").body(), 401)
        method = _CANONICAL.get(method_name.lower())
        if method is None:
            return _envelope(ScriptedError(404, "Not Found").body(), 404)
        try:
            params = await _read_params(request)
        except ValueError:
            return _envelope(ScriptedError(400, "Bad Request: invalid request body").body(), 400)

        call = RecordedCall(method=method, params=params, at=time.monotonic(), path=request.path)
        self.calls.append(call)
        self._notify()

        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)
        try:
            scripted = self._over_limit(call) or self._scripted(call)
            if scripted is not None:
                raise _CallError(scripted)
            if (gate := self._hung.get(method)) is not None:
                await gate.wait()
            result = await self._perform(call)
        except _CallError as failure:
            call.status = failure.error.status
            call.description = failure.error.description
            self._notify()
            return _envelope(failure.error.body(), failure.error.status)
        finally:
            if task is not None:
                self._handler_tasks.discard(task)
        call.status = 200
        call.result = result
        self._notify()
        return _envelope({"ok": True, "result": result}, 200)

    def _over_limit(self, call: RecordedCall) -> ScriptedError | None:
        """Telegram's 429 if the call breaks one of the limits, else None (and it counts)."""
        if self.limits is None:
            return None
        violation = self.limits.check(call.method, call.params, call.at)
        return None if violation is None else self.too_many_requests(retry_after(violation))

    def _scripted(self, call: RecordedCall) -> ScriptedError | None:
        if self._token_refused:
            return self.unauthorized()
        queued = self._errors.get(call.method)
        if queued:
            return queued.pop(0)
        phases = self._phases.get(call.method, [])
        while phases:
            phase = phases[0]
            if phase.began is None:
                phase.began = call.at
            if call.at - phase.began < phase.seconds:
                return phase.error
            phases.pop(0)
        chat_id = call.chat_id
        if chat_id is None:
            return None
        return self._chat_errors.get((chat_id, call.method)) or self._chat_errors.get(
            (chat_id, None)
        )

    async def _perform(self, call: RecordedCall) -> Any:
        p = call.params
        match call.method:
            case "getMe":
                return self.bot_user
            case "setWebhook":
                url = p.get("url")
                if not isinstance(url, str):
                    raise _bad_request("bad webhook: URL must be provided")
                if not url:
                    self.webhook = None
                    return True
                drop = bool(p.get("drop_pending_updates", False))
                allowed = p.get("allowed_updates")
                self.webhook = WebhookConfig(
                    url=url,
                    secret_token=_opt_str(p.get("secret_token")),
                    allowed_updates=list(allowed) if isinstance(allowed, list) else None,
                    max_connections=_opt_int(p.get("max_connections")),
                    drop_pending_updates=drop,
                )
                if drop:
                    self._pending.clear()
                return True
            case "deleteWebhook":
                self.webhook = None
                if p.get("drop_pending_updates"):
                    self._pending.clear()
                return True
            case "getWebhookInfo":
                info: dict[str, Any] = {
                    "url": self.webhook.url if self.webhook else "",
                    "has_custom_certificate": False,
                    "pending_update_count": len(self._pending),
                }
                if self.webhook is not None:
                    if self.webhook.max_connections is not None:
                        info["max_connections"] = self.webhook.max_connections
                    if self.webhook.allowed_updates is not None:
                        info["allowed_updates"] = self.webhook.allowed_updates
                return info
            case "getUpdates":
                return await self._get_updates(call)
            case "sendMessage":
                return self._send_message(p)
            case "sendChatAction":
                _require_chat(p)
                if not isinstance(p.get("action"), str):
                    raise _bad_request("wrong parameter action in request")
                _thread_of(p)  # recorded (see RecordedCall.thread_id), checked, nothing else
                return True
            case "sendMessageDraft":
                # An ephemeral preview in a private chat; nothing is stored as a message.
                # Telegram refuses one anywhere else (a group, a supergroup, a channel).
                chat_id = _require_chat(p)
                if not isinstance(chat_id, int) or chat_id < 0:
                    raise _bad_request("TEXTDRAFT_PEER_INVALID")
                if _require_int(p, "draft_id") == 0:
                    raise _bad_request("draft_id must be non-zero")
                return True
            case "editMessageText":
                return self._edit_message_text(p)
            case "deleteMessage":
                key = (_require_chat(p), _require_int(p, "message_id"))
                if self._bot_messages.pop(key, None) is None:
                    raise _bad_request("message to delete not found")
                self._chat_messages.get(key[0], {}).pop(key[1], None)
                return True
            case "getFile":
                return self._get_file(p)
            case "setMyCommands":
                self.menus[_menu_scope(p)] = _menu_commands(p)
                return True
            case "getMyCommands":
                return self.menus.get(_menu_scope(p), [])
            case "deleteMyCommands":
                self.menus.pop(_menu_scope(p), None)
                return True
        raise AssertionError(f"unhandled method {call.method}")  # pragma: no cover

    async def _get_updates(self, call: RecordedCall) -> list[dict[str, Any]]:
        if self.webhook is not None:
            raise _CallError(
                ScriptedError(
                    409,
                    "Conflict: can't use getUpdates method while webhook is active; "
                    "use deleteWebhook to delete the webhook first",
                )
            )
        allowed = call.params.get("allowed_updates")
        if isinstance(allowed, list):
            # Kept for the updates to come, until a later getUpdates gives another list.
            self._poll_allowed = [str(kind) for kind in allowed]
        offset = _opt_int(call.params.get("offset")) or 0
        limit = min(max(_opt_int(call.params.get("limit")) or 100, 1), 100)
        timeout = max(_opt_int(call.params.get("timeout")) or 0, 0)
        # The offset confirms everything below it, whatever becomes of this request.
        if offset > 0:
            self._confirmed_below = max(self._confirmed_below, offset)
            self._pending = [u for u in self._pending if int(u["update_id"]) >= offset]
        elif offset < 0:
            self._pending = self._pending[offset:]
        self._notify()

        # Like Telegram, a newer getUpdates terminates the ones already waiting with 409.
        for older in self._polls:
            older.terminated = True
        poll = _Poll(call)
        self._polls.append(poll)
        self.max_concurrent_get_updates = max(self.max_concurrent_get_updates, len(self._polls))
        self._notify()
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            while True:
                if self._token_refused:
                    raise _CallError(self.unauthorized())
                if poll.terminated:
                    raise _CallError(
                        ScriptedError(
                            409,
                            "Conflict: terminated by other getUpdates request; "
                            "make sure that only one bot instance is running",
                        )
                    )
                batch = self._pending[:limit]
                remaining = deadline - asyncio.get_running_loop().time()
                if batch or remaining <= 0:
                    return batch
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await changed.wait()
        finally:
            self._polls.remove(poll)
            self._notify()

    def _get_file(self, p: dict[str, Any]) -> dict[str, Any]:
        file_id = p.get("file_id")
        stored = self._files.get(file_id) if isinstance(file_id, str) else None
        if stored is None:
            raise _bad_request("wrong file identifier/HTTP URL specified")
        if stored.size > MAX_DOWNLOAD_SIZE:
            raise _bad_request("file is too big")
        return {
            "file_id": stored.file_id,
            "file_unique_id": stored.file_unique_id,
            "file_size": stored.size,
            "file_path": stored.file_path,
        }

    async def _download(self, request: web.Request) -> web.Response:
        """``GET /file/bot<token>/<file_path>``: the bytes, or 404 for a wrong token, a path
        nothing was stored at, or a file made unreachable, as Telegram's file server does."""
        file_path = request.match_info["file_path"]
        stored = self._files_by_path.get(file_path)
        token_ok = request.match_info["token"] == f"bot{self.token}"
        served = stored if token_ok and stored is not None and stored.reachable else None
        self.downloads.append(
            RecordedDownload(
                path=request.path,
                file_path=file_path,
                file_id=None if stored is None else stored.file_id,
                at=time.monotonic(),
                status=404 if served is None else 200,
            )
        )
        self._notify()
        if served is None:
            return _envelope(ScriptedError(404, "Not Found").body(), 404)
        return web.Response(body=served.data, content_type="application/octet-stream")

    def _send_message(self, p: dict[str, Any]) -> dict[str, Any]:
        chat_id = _require_chat(p)
        text = p.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _bad_request("message text is empty")
        if _visible_length(text, p.get("parse_mode")) > self.max_message_length:
            raise _bad_request("message is too long")
        thread = _thread_of(p)
        reply_to = _reply_to(p)
        replied: dict[str, Any] | None = None
        if reply_to is not None:
            known = self._chat_messages.get(chat_id, {}).get(reply_to)
            if known is not None:
                replied = _without_reply(known)
            elif not _may_send_without_reply(p):
                raise _bad_request("message to be replied not found")
        message = self._bot_message(chat_id, self._next_message_id(chat_id), text)
        if thread is not None:
            message["message_thread_id"] = thread
            message["is_topic_message"] = True
            if replied is None and message["chat"].get("is_forum"):
                # As for the users' messages: in a topic, a message that replies to nothing
                # replies to the topic's creation.
                replied = _without_reply(self._topic_created(chat_id, thread, None))
        if replied is not None:
            message["reply_to_message"] = replied
        self._bot_messages[(chat_id, message["message_id"])] = message
        self._chat_messages.setdefault(chat_id, {})[message["message_id"]] = message
        return message

    def _edit_message_text(self, p: dict[str, Any]) -> dict[str, Any]:
        key = (_require_chat(p), _require_int(p, "message_id"))
        text = p.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _bad_request("message text is empty")
        if _visible_length(text, p.get("parse_mode")) > self.max_message_length:
            raise _bad_request("MESSAGE_TOO_LONG")
        message = self._bot_messages.get(key)
        if message is None:
            raise _bad_request("message to edit not found")
        if message["text"] == text:
            raise _bad_request(
                "message is not modified: specified new message content and reply markup are "
                "exactly the same as a current content and reply markup of the message"
            )
        message["text"] = text
        message["edit_date"] = int(time.time())
        return message

    def _bot_message(self, chat_id: int | str, message_id: int, text: str) -> dict[str, Any]:
        return {
            "message_id": message_id,
            "from": {k: self.bot_user[k] for k in ("id", "is_bot", "first_name", "username")},
            "chat": dict(self._chat(chat_id)),
            "date": int(time.time()),
            "text": text,
        }


async def post_update(
    url: str,
    update: dict[str, Any],
    secret: str | None = None,
    *,
    timeout: float = 10.0,  # noqa: ASYNC109
) -> int:
    """Deliver ``update`` to a webhook as Telegram does; return the HTTP status.

    The secret, when given, goes in the ``X-Telegram-Bot-Api-Secret-Token`` header.
    """
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.post(url, data=json.dumps(update), headers=headers) as response,
    ):
        await response.read()
        return response.status


def telegram_limits(
    per_second: int = 30, chat_per_second: int = 1, group_per_minute: int = 20
) -> Limits:
    """Telegram's limits, as its Bot API FAQ gives them: about 30 calls a second from one bot
    (every sending method: messages, edits, deletions, drafts, typing), about one message a
    second in one chat, and at most 20 messages a minute in one group (a chat with a negative
    id, as Telegram gives groups)."""
    return Limits(
        [
            Limit("bot", per_second, 1.0, _bot_wide),
            Limit("chat", chat_per_second, 1.0, _message_chat),
            Limit("group", group_per_minute, 60.0, _message_group),
        ]
    )


def _bot_wide(method: str, params: Mapping[str, Any]) -> str | None:
    return "bot" if method in _SENDING else None


def _message_chat(method: str, params: Mapping[str, Any]) -> str | None:
    chat_id = params.get("chat_id")
    if method != "sendMessage" or not isinstance(chat_id, int | str):
        return None
    return str(chat_id)


def _message_group(method: str, params: Mapping[str, Any]) -> str | None:
    chat_id = params.get("chat_id")
    if method != "sendMessage" or not isinstance(chat_id, int) or chat_id >= 0:
        return None
    return str(chat_id)


def _envelope(body: dict[str, Any], status: int) -> web.Response:
    return web.json_response(body, status=status)


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Parameters from the query string and the body: JSON, urlencoded or multipart."""
    raw: dict[str, Any] = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            body = json.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("JSON body must be an object")
            raw.update(body)
            return raw
        form = await request.post()
        for key, value in form.items():
            # File uploads (multipart parts with a filename) are recorded by name only.
            if isinstance(value, str):
                raw[key] = value
            elif isinstance(value, web.FileField):
                raw[key] = f"<file {value.filename}>"
            else:
                raw[key] = bytes(value).decode(errors="replace")
    return {key: _coerce(key, value) for key, value in raw.items()}


def _coerce(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if key in _INT_FIELDS:
        with contextlib.suppress(ValueError):
            return int(value)
        return value
    if key in _BOOL_FIELDS:
        return value.lower() in ("true", "1")
    if key in _JSON_FIELDS:
        with contextlib.suppress(ValueError):
            return json.loads(value)
    return value


def _menu_scope(p: dict[str, Any]) -> str | None:
    """The key a menu is kept under: its scope, as sent (None: the default scope)."""
    scope = p.get("scope")
    if scope is None or scope == {"type": "default"}:
        return None
    if not isinstance(scope, dict) or not isinstance(scope.get("type"), str):
        raise _bad_request("can't parse BotCommandScope JSON object")
    return json.dumps(scope, sort_keys=True)


def _menu_commands(p: dict[str, Any]) -> list[dict[str, str]]:
    """The commands of a setMyCommands, checked as Telegram checks them."""
    commands = p.get("commands")
    if not isinstance(commands, list):
        raise _bad_request("can't parse commands JSON object")
    if len(commands) > _MENU_MAX_COMMANDS:
        raise _bad_request("too many commands specified")
    found: list[dict[str, str]] = []
    for item in commands:
        name = item.get("command") if isinstance(item, dict) else None
        description = item.get("description") if isinstance(item, dict) else None
        if not isinstance(name, str) or not _MENU_COMMAND_RE.fullmatch(name):
            raise _bad_request("BOT_COMMAND_INVALID")
        if not isinstance(description, str) or not description.strip():
            raise _bad_request("command description is empty")
        if len(description) > _MENU_DESCRIPTION_CHARS:
            raise _bad_request("command description is too long")
        found.append({"command": name, "description": description})
    return found


def _visible_length(text: str, parse_mode: Any) -> int:
    # Telegram's limit counts the text after entity parsing, so tags and escapes are free.
    if isinstance(parse_mode, str) and parse_mode.lower() == "html":
        return len(html.unescape(_TAG_RE.sub("", text)))
    return len(text)


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _require_chat(p: dict[str, Any]) -> int | str:
    chat_id = p.get("chat_id")
    if isinstance(chat_id, int) and not isinstance(chat_id, bool):
        return chat_id
    if isinstance(chat_id, str) and chat_id.startswith("@"):
        return chat_id
    raise _bad_request("chat_id is empty" if chat_id in (None, "") else "chat not found")


def _require_int(p: dict[str, Any], key: str) -> int:
    value = _opt_int(p.get(key))
    if value is None:
        raise _bad_request(f"{key} is empty")
    return value


def _json_object(value: Any) -> dict[str, Any] | None:
    """A JSON object parameter, whether decoded already or still a JSON string (a JSON body
    may carry one either way); None if it is neither."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    return value if isinstance(value, dict) else None


def _reply_to(p: Mapping[str, Any]) -> int | None:
    """The message a call replies to: ``reply_parameters.message_id`` (an object or its JSON
    text), else the legacy ``reply_to_message_id``."""
    params = _json_object(p.get("reply_parameters"))
    if params is not None:
        return _as_int(params.get("message_id"))
    return _as_int(p.get("reply_to_message_id"))


def _may_send_without_reply(p: Mapping[str, Any]) -> bool:
    """Whether the call lets the message go out when the one it replies to is not found."""
    params = _json_object(p.get("reply_parameters"))
    allowed = (
        p.get("allow_sending_without_reply")
        if params is None
        else params.get("allow_sending_without_reply")
    )
    return allowed is True or (isinstance(allowed, str) and allowed.lower() in ("true", "1"))


def _as_int(value: Any) -> int | None:
    """An int, or the digits of one (a JSON body is not typed by field name)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return int(value)
        return None
    return _opt_int(value)


def _thread_of(p: Mapping[str, Any]) -> int | None:
    """The ``message_thread_id`` a call gave, if any; 400 if it is no number."""
    if p.get("message_thread_id") is None:
        return None
    thread = _as_int(p.get("message_thread_id"))
    if thread is None:
        raise _bad_request("message thread not found")
    return thread


def _without_reply(message: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``message`` as a ``reply_to_message`` shows it: Telegram nests no reply."""
    shown: dict[str, Any] = json.loads(json.dumps(message))
    shown.pop("reply_to_message", None)
    return shown


def _utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


# What Telegram takes for a username in a mention (2-32 of these after the @, between
# non-word characters) and for a command (1-64, maybe @ and 3-32 naming the bot; nothing
# of a word, a slash or an angle bracket on either side): tdlib's match_mentions and
# match_bot_commands, which the Bot API server shares.
_NAME_RUN = re.compile(r"[A-Za-z0-9_]*")


def _entities(text: str) -> list[dict[str, Any]]:
    """The ``mention`` and ``bot_command`` entities Telegram finds in a message's text, by
    offset; offsets and lengths in UTF-16 code units."""
    found: list[tuple[int, int, str]] = []
    for start, char in enumerate(text):
        if char not in "@/":
            continue
        before = text[start - 1] if start else ""
        if char == "@":
            if before and _is_word(before):
                continue
            end = _name_end(text, start + 1)
            if not 2 <= end - start - 1 <= 32 or _word_at(text, end):
                continue
        else:
            if before and (_is_word(before) or before in "/<>"):
                continue
            end = _name_end(text, start + 1)
            if not 1 <= end - start - 1 <= 64:
                continue
            if end < len(text) and text[end] == "@":
                bot_end = _name_end(text, end + 1)
                if not 3 <= bot_end - end - 1 <= 32:
                    continue
                end = bot_end
            if _word_at(text, end) or (end < len(text) and text[end] in "/<>"):
                continue
        found.append((start, end, "mention" if char == "@" else "bot_command"))
    return [
        {
            "type": kind,
            "offset": _utf16_length(text[:start]),
            "length": _utf16_length(text[start:end]),
        }
        for start, end, kind in found
    ]


def _name_end(text: str, start: int) -> int:
    """Where the run of username characters from ``start`` ends."""
    match = _NAME_RUN.match(text, start)
    return start if match is None else match.end()


def _word_at(text: str, index: int) -> bool:
    return index < len(text) and _is_word(text[index])

"""The platform-free message types: what adapters hand to the core, and what they must do back.

Adapters turn each platform event into one `InboundMessage`; the core never sees a platform
object. The core answers through `Outbound`, which every adapter implements.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class Attachment:
    """A file the user sent, by reference: the store keeps this, never the bytes. Whichever
    replica answers fetches them through `Outbound.fetch`, so any replica can answer."""

    kind: str  # "photo", "document", "voice", "audio", "video", "sticker", ...
    # The platform's handle: Telegram's file id, Discord's attachment URL. Never a URL that
    # carries a secret (Telegram's file URLs contain the bot token).
    ref: str
    mime: str = ""  # as the platform declared it; "" if it did not
    size: int = 0  # bytes, as the platform declared them; 0 if it did not
    name: str = ""  # the file's name; a sticker's emoji
    # Stable across redeliveries and re-uploads of the same file (Telegram's file_unique_id,
    # Discord's attachment id): what a transcript is cached by.
    file_key: str = ""
    # Where the message's text sits: True, before the media (Discord's text, then its
    # attachments); False, after it (Telegram's caption under the photo).
    text_first: bool = False

    def label(self) -> str:
        """How the model and the history name it: `[photo]`, `[document: notes.py]`,
        `[sticker: 😀]`, `[voice note]`."""
        if self.kind == "voice":
            return "[voice note]"  # its file name is the platform's, not the user's
        kind = self.kind.replace("_", " ")
        return f"[{kind}: {self.name}]" if self.name else f"[{kind}]"

    def cleaned(self) -> Attachment:
        v = _valid_utf8
        return replace(
            self,
            kind=v(self.kind),
            ref=v(self.ref),
            mime=v(self.mime),
            name=v(self.name),
            file_key=v(self.file_key),
        )


# What parts a group conversation's id, which a chat id must not contain: a DM's id is
# "<platform>:<chat>", a group's "<platform>:<chat>|<topic>|<sender>".
GROUP_MARK = "|"


@dataclass(frozen=True)
class Place:
    """Where a message was said and who said it: the platform, the chat (a DM channel, a
    group, a Discord channel or thread), the topic inside it (a Telegram forum topic; ""
    for none) and the sender. Adapters build it; the core reads it without knowing any
    platform. A DM is the place where chat and sender are one conversation: one person per
    chat. In a group each sender is a conversation of their own, with its own version, window
    and lease, so every guarantee holds per person."""

    platform: str
    chat: str
    sender: str
    topic: str = ""
    group: bool = False

    @property
    def conversation(self) -> str:
        """The conversation's id, derived here and nowhere else: ``telegram:12345`` for a
        DM, ``telegram:-100123|7|42`` for sender 42 in topic 7 of group -100123."""
        if not self.group:
            return f"{self.platform}:{self.chat}"
        return GROUP_MARK.join((f"{self.platform}:{self.chat}", self.topic, self.sender))

    @property
    def room(self) -> str:
        """The group and topic, whose messages to others are the conversation's context."""
        return GROUP_MARK.join((f"{self.platform}:{self.chat}", self.topic))

    @classmethod
    def of(cls, conversation: str) -> Place:
        """The place a conversation id names (a DM's sender is not in its id: "")."""
        head, mark, rest = conversation.partition(GROUP_MARK)
        platform, _, chat = head.partition(":")
        if not mark:
            return cls(platform, chat, "")
        topic, _, sender = rest.partition(GROUP_MARK)
        return cls(platform, chat, sender, topic, group=True)


@dataclass(frozen=True)
class Said:
    """A message said in a group's room to others, as the room's context keeps it: who said
    it (their id, so /forget finds it, and name) and what, when (ms, server clock)."""

    id: str
    user: str
    name: str
    text: str
    at: int = 0

    @classmethod
    def of(cls, message: InboundMessage, max_chars: int) -> Said:
        text = message.prompt_text()
        if len(text) > max_chars:
            text = text[: max_chars - 1] + "…"
        return cls(message.message_id, message.user_id, message.display_name, text)

    def to_json(self) -> str:
        # `at` is left to the store, which stamps it with the server's clock.
        return json.dumps({k: v for k, v in vars(self).items() if k != "at"}, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Said:
        data = json.loads(raw)
        return cls(
            str(data["id"]), str(data["user"]), str(data["name"]), str(data["text"]), data["at"]
        )


# An edited message's id in the store: the platform's id, this mark, and one value per edit
# (each edit is new input, so dedupe must keep each one).
EDIT_MARK = ":edit:"


def edited_id(message_id: str, edit: str) -> str:
    """The id an edit of `message_id` is taken in under: unique per edit, stable when the
    platform delivers the same edit again."""
    return f"{message_id}{EDIT_MARK}{edit}"


def platform_id(message_id: str) -> str:
    """The platform's own id of a message taken in as `message_id` (an edit's is the edited
    message's): what a reply may point at."""
    return message_id.partition(EDIT_MARK)[0]


@dataclass(frozen=True)
class Quote:
    """The message a group message replies to, as the platform delivered it with the reply:
    who said it (`by_bot`: this bot itself) and what, cut to `QUOTE_CHARS`. Shown to the model
    as data, never as anyone's instructions."""

    name: str
    text: str
    by_bot: bool = False

    def cleaned(self) -> Quote:
        text = _valid_utf8(self.text)
        if len(text) > QUOTE_CHARS:
            text = text[: QUOTE_CHARS - 1] + "…"
        return Quote(_valid_utf8(self.name), text, self.by_bot)


# The longest quoted message kept with a reply to it.
QUOTE_CHARS = 1000


def chat_of(conversation: str) -> str:
    """The part of a conversation id that names its chat ("<platform>:<chat>"): a group's
    people share it, and with it the store's shard."""
    return conversation.partition(GROUP_MARK)[0]


# InboundMessage's fields for a group only; a DM's are at their defaults ("", False).
GROUP_FIELDS = ("topic", "mentioned", "from_bot", "quoted")


@dataclass(frozen=True)
class InboundMessage:
    platform: str
    chat_id: str
    user_id: str
    message_id: str  # the platform's id; redelivery of the same id is dropped (I5)
    text: str
    display_name: str = ""
    timestamp: float = field(default_factory=time.time)
    reply_to_id: str | None = None
    attachments: tuple[Attachment, ...] = ()
    is_dm: bool = True
    # In a group: the forum topic ("": none), whether the adapter saw it addressed to the bot
    # (a mention, a reply to the bot, a command for it), and whether another bot sent it.
    topic: str = ""
    mentioned: bool = False
    from_bot: bool = False
    # In a group: the message this one replies to, as the platform delivered it (None: none,
    # or the platform did not say).
    quoted: Quote | None = None

    @classmethod
    def at(cls, place: Place, message_id: str, text: str, **fields: Any) -> InboundMessage:
        """A message said at `place`."""
        return cls(
            place.platform,
            place.chat,
            place.sender,
            message_id,
            text,
            is_dm=not place.group,
            topic=place.topic,
            **fields,
        )

    @property
    def place(self) -> Place:
        return Place(self.platform, self.chat_id, self.user_id, self.topic, not self.is_dm)

    @property
    def conversation(self) -> str:
        """One DM channel on one platform (``telegram:12345``), or one person in a group."""
        return self.place.conversation

    def to_json(self) -> str:
        # Not dataclasses.asdict, which deep-copies every value: this runs for every message
        # taken in, and the fields are plain values (the attachments' too).
        data = dict(vars(self))
        data["attachments"] = [vars(attachment) for attachment in self.attachments]
        if self.quoted is not None:
            data["quoted"] = vars(self.quoted)
        # A DM's message leaves out the group fields at their defaults, so a replica of the
        # version before groups, still running in a rolling upgrade, reads it.
        for name in GROUP_FIELDS:
            if not data[name]:
                del data[name]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> InboundMessage:
        data: dict[str, Any] = json.loads(raw)
        data["attachments"] = tuple(Attachment(**a) for a in data.get("attachments", ()))
        if data.get("quoted") is not None:
            data["quoted"] = Quote(**data["quoted"])
        return cls(**data)

    def cleaned(self, max_chars: int) -> InboundMessage:
        """The message made safe to store: valid UTF-8 in every field, and text past
        `max_chars` characters cut off with a note saying how much."""
        v = _valid_utf8
        return replace(
            self,
            chat_id=v(self.chat_id).replace(GROUP_MARK, ""),
            user_id=v(self.user_id).replace(GROUP_MARK, ""),
            topic=v(self.topic).replace(GROUP_MARK, ""),
            message_id=v(self.message_id),
            display_name=v(self.display_name),
            text=_cut(v(self.text), max_chars),
            reply_to_id=None if self.reply_to_id is None else v(self.reply_to_id),
            attachments=tuple(a.cleaned() for a in self.attachments),
            quoted=None if self.quoted is None else self.quoted.cleaned(),
        )

    def prompt_text(self) -> str:
        """The message as text: its words, with each attachment's label where it was sent."""
        return self.text_with(a.label() for a in self.attachments)

    def text_with(self, pieces: Iterable[str]) -> str:
        """The message's words with what its attachments said (labels, a file's text, a
        transcript) before them, or after them where the platform puts text first."""
        pieces = [p for p in pieces if p]
        if not pieces:
            return self.text
        first = any(a.text_first for a in self.attachments)
        ordered = [self.text, *pieces] if first else [*pieces, self.text]
        return " ".join(p for p in ordered if p)


def _valid_utf8(value: str) -> str:
    """Lone surrogates (from a lenient decoder, or a JSON escape) cannot be stored: replace them."""
    return value.encode("utf-8", "replace").decode("utf-8")


def _cut(text: str, max_chars: int) -> str:
    if len(text) > max_chars:
        cut = len(text) - max_chars
        text = text[:max_chars] + f"\n[… {cut} more characters were cut: the message was too long]"
    return text


class Unavailable(Exception):
    """The core cannot take the message in right now (its store is down). The adapter must
    not acknowledge it to the platform: retry, or let the platform redeliver."""


class SendFailed(Exception):
    """A reply part was not delivered, with the adapter's verdict on trying again.

    `permanent`: sending it again can never succeed (the channel is gone, the bot may not
    post there, the platform rejects the request as malformed); the core gives the reply up
    at once. Otherwise the failure is transient (a 5xx, a network error, a long 429): the core
    tries the reply again later, backed off across replicas, a bounded number of times. Any
    other exception from `send` counts as transient too.
    """

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


class Unreachable(SendFailed):
    """The user cannot get messages from the bot until they write again: they blocked it, or
    closed their DMs. The core counts the reply as delivered (nothing else can be done for it)
    and marks the conversation in the store, for every replica, until the user's next message.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason, permanent=True)


class Throttled(SendFailed):
    """The platform answered 429: nothing was delivered, and `scope` (one of the call's
    `Scope` names, chosen by the adapter: the whole bot when the platform does not say) takes
    no call before `retry_after_s` has passed. The core holds that scope for every replica
    and tries again in its turn. `inferred`: the platform did not say which limit it was
    (Telegram), so `scope` is the adapter's guess, the narrowest the call falls under; the
    core widens it to the bot once several such 429s come close together."""

    def __init__(self, retry_after_s: float, scope: str, *, inferred: bool = False) -> None:
        super().__init__(f"{scope} throttled for {retry_after_s:g} s")
        self.retry_after_s = retry_after_s
        self.scope = scope
        self.inferred = inferred


class FetchFailed(Exception):
    """An attachment could not be fetched: gone, expired, too large, or the platform failed.
    The reason is shown to the model and logged, so it names no secret."""


class Outbound(Protocol):
    """What the core asks of a platform. Implemented by every adapter."""

    # The platform's longest message; the core splits longer replies before calling send().
    max_message_chars: int
    # How often a typing indicator must be repeated to stay visible.
    typing_interval_s: float

    async def send(
        self, conversation: str, text: str, idempotency_key: str, reply_to: str | None = None
    ) -> None:
        """Deliver one part of a reply.

        `idempotency_key` is the same when a reply part is re-sent after a crash, so platforms
        that can deduplicate (Discord's nonce) deliver it once. `reply_to`, in a group only, is
        the platform id of the person's message the part answers (their burst's last): send it
        as a reply to that message, which tells the room whom it is for; an adapter that serves
        DMs only is never given one. Raises `Unreachable` when the
        user cannot be reached, and `SendFailed` with the adapter's verdict on other failures.
        """

    async def typing(self, conversation: str) -> None:
        """Show that the bot is working on a reply."""

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        """The bytes of a file the user sent, at most `max_bytes` of them.

        Called by whichever replica answers, inside its cycle. Raises `FetchFailed` with a
        reason fit for the model and the log (never a URL with a secret) when the file is
        gone, expired, larger than `max_bytes`, or the platform fails; the caller bounds the
        time.
        """


# The scope of a platform's limit on the bot as a whole, by convention.
BOT_SCOPE = "bot"
# The scope only previews (drafts, typing indicators) fall under: a 429 on a preview holds
# it, so previews are shed meanwhile and replies are not held at all.
PREVIEWS_SCOPE = "previews"
# What a platform call is, for the outbound budget: a message (a reply's part, a notice), a
# live draft, or a typing indicator. Messages come first; the other two are previews.
Call = Literal["message", "draft", "typing"]


@dataclass(frozen=True)
class Scope:
    """One rate limit a platform call falls under: at most `count` calls in any sliding
    `per_s` seconds. `name` is its subject, unique on the platform: the limit's own name
    ("bot"), or the limit's name and what it limits ("chat:42", "group:-100123"); metrics and
    logs group scopes by what comes before the colon (`kind_of`)."""

    name: str
    count: int
    per_s: float


def kind_of(scope: str) -> str:
    """The limit a scope's name belongs to: "chat" for "chat:42", "bot" for "bot"."""
    return scope.partition(":")[0]


@runtime_checkable
class Limited(Protocol):
    """What an outbound whose platform limits how fast the bot may call it adds to
    `Outbound`: the limits each call falls under. The core paces every call by them, across
    every replica (`bot.outbound.pacing`). Optional: an outbound without it (the console) is not
    paced."""

    def scopes(self, conversation: str, call: Call) -> tuple[Scope, ...]:
        """The limits a `call` in `conversation` counts against, e.g. the bot's and the
        chat's; () for none."""
        ...


@runtime_checkable
class SeesTyping(Protocol):
    """What an outbound whose platform tells the bot when a user is typing (Discord's
    `TYPING_START`, a terminal's keystrokes) adds to `Outbound`; its adapter reports each
    signal with `Sink.user_typing`. The core then holds the user's window open while they type, and
    closes it at the learned floor once they have stopped. Optional: without it (Telegram)
    nothing changes."""

    def sees_typing(self, place: Place) -> bool:
        """Whether the platform reports the typing of the person at `place` (Discord: in DMs,
        not in guild channels)."""
        ...


class NoFiles:
    """For an outbound whose platform carries no files (the console, test and benchmark
    stand-ins): any fetch fails with a clear reason."""

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        raise FetchFailed("this platform cannot fetch files")


@dataclass(frozen=True)
class MenuEntry:
    """One command as a platform's command menu offers it, from the registry that `/help`
    is made from (the core hands adapters the menu: `adapters.base.Sink.menu`), so the menu
    and `/help` never differ."""

    name: str
    help: str
    arguments: str  # as /help shows them, e.g. "<user id>" ("": none)
    admin: bool  # for LASTWORD_ACCESS__ADMINS only

    def description(self, limit: int) -> str:
        """What the menu says of it, as /help does after "/name ", cut to the platform's
        `limit` with an ellipsis."""
        text = f"{self.arguments}: {self.help}" if self.arguments else self.help
        return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"

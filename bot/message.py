"""The platform-free message types: what adapters hand to the core, and what they must do back.

Adapters turn each platform event into one `InboundMessage`; the core never sees a platform
object. The core answers through `Outbound`, which every adapter implements.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol


@dataclass(frozen=True)
class Attachment:
    kind: str  # "photo", "sticker", "voice", "document", ...
    ref: str  # the platform's file id or URL; never fetched by the core


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

    @property
    def conversation(self) -> str:
        """One DM channel on one platform, e.g. ``telegram:12345``."""
        return f"{self.platform}:{self.chat_id}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> InboundMessage:
        data: dict[str, Any] = json.loads(raw)
        data["attachments"] = tuple(Attachment(**a) for a in data.get("attachments", ()))
        return cls(**data)

    def cleaned(self, max_chars: int) -> InboundMessage:
        """The message made safe to store: valid UTF-8 in every field, and text past
        `max_chars` characters cut off with a note saying how much."""
        v = _valid_utf8
        return replace(
            self,
            chat_id=v(self.chat_id),
            user_id=v(self.user_id),
            message_id=v(self.message_id),
            display_name=v(self.display_name),
            text=_cut(v(self.text), max_chars),
            reply_to_id=None if self.reply_to_id is None else v(self.reply_to_id),
            attachments=tuple(Attachment(v(a.kind), v(a.ref)) for a in self.attachments),
        )

    def prompt_text(self) -> str:
        """The text the model sees: the message, plus a marker for each attachment."""
        markers = " ".join(f"[{a.kind}]" for a in self.attachments)
        return f"{self.text} {markers}".strip() if markers else self.text


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


class Outbound(Protocol):
    """What the core asks of a platform. Implemented by every adapter."""

    # The platform's longest message; the core splits longer replies before calling send().
    max_message_chars: int
    # How often a typing indicator must be repeated to stay visible.
    typing_interval_s: float

    async def send(self, conversation: str, text: str, idempotency_key: str) -> None:
        """Deliver one part of a reply.

        `idempotency_key` is the same when a reply part is re-sent after a crash, so platforms
        that can deduplicate (Discord's nonce) deliver it once. Raises `Unreachable` when the
        user cannot be reached, and `SendFailed` with the adapter's verdict on other failures.
        """

    async def typing(self, conversation: str) -> None:
        """Show that the bot is working on a reply."""

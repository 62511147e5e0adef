"""Builders for test data, so each test states only what matters to it."""

from __future__ import annotations

import itertools
import time

from bot.message import Attachment, InboundMessage
from bot.store import Acquired, Grant

_next_id = itertools.count(1)


def message(
    text: str | None = None,
    *,
    n: int | None = None,
    conversation: str = "test:1",
    user: str = "u1",
    message_id: str | None = None,
    display_name: str = "",
    attachments: tuple[Attachment, ...] = (),
    timestamp: float | None = None,
) -> InboundMessage:
    """A DM as an adapter hands it to the core, in `conversation` ("platform:chat").

    `n` numbers it: its id is "m<n>" and, unless `text` is given, its text "text <n>" (so a
    redelivery is `message(n=1)` again). Otherwise the id is `message_id`, or a fresh one.
    """
    if text is None:
        assert n is not None, "a message needs a text or a number"
        text = f"text {n}"
    if message_id is None:
        message_id = f"m{n}" if n is not None else f"auto-{next(_next_id)}"
    platform, chat = conversation.split(":", 1)
    return InboundMessage(
        platform,
        chat,
        user,
        message_id,
        text,
        display_name=display_name,
        timestamp=time.time() if timestamp is None else timestamp,
        attachments=attachments,
    )


def window_ms(grant: Grant) -> int:
    """How much longer a speculative grant's window stays open (ms); 0 for any other."""
    return grant.window.ms if isinstance(grant, Acquired) and grant.window else 0

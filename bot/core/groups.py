"""Groups: what the model is told of the room, and which message a reply in a group answers.

In a group each person is a conversation of their own (`bot.message.Place`), so a burst is
one person's, answered once, and only their newer words interrupt it. Whether a message there
is for the bot is `bot.core.admission`'s to say. What was said to the room is context the
model is shown as data (`bot.llm.others`), never anyone's history; a reply in a group points
at the message it answers (`replied`).
"""

from __future__ import annotations

from collections.abc import Sequence

from bot.llm.others import in_group
from bot.message import InboundMessage, Place, platform_id
from bot.store import Acquired


def replied(grant: Acquired) -> str | None:
    """The message a group reply answers: its burst's last (the person's newest taken in, for
    a resend). None in a DM, where a reply needs no pointer."""
    if not Place.of(grant.lease.conversation).group:
        return None
    last = grant.unanswered[-1].message_id if grant.unanswered else grant.last
    return platform_id(last) if last else None


def in_room(system: str, conversation: str, burst: Sequence[InboundMessage]) -> str:
    """The system prompt, told (in a group) that several people share the chat, whom it is
    answering (the sender of the `burst`, their name cleaned as data), and how what others
    said reaches it (`bot.llm.others`). Nothing anyone wrote but that name goes in it."""
    if not Place.of(conversation).group:
        return system
    return system + "\n\n" + in_group(burst[-1].display_name if burst else "")

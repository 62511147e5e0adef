"""Groups: what in a group is addressed to the bot, and what the model is told of the room.

In a group each person is a conversation of their own (`bot.message.Place`), so a burst is
one person's, answered once, and only their newer words interrupt it. A message there is
addressed to the bot when the adapter saw it mentioned or replied to (`mentioned`), when it
is one of the bot's commands, or when it holds a wake word; the store then decides, in the
same step as the rest of ingest, whether an unaddressed one follows up its sender's open
burst or was said to the room (`Heard`, ingest.lua). What was said to the room is context the
model is shown as data (`bot.llm.others`), never anyone's history. Another bot is never answered,
so two bots cannot talk to each other for ever.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Literal

from bot.commands import COMMANDS
from bot.commands.base import command_of
from bot.config.settings import GroupsSettings
from bot.llm.others import in_group
from bot.message import InboundMessage, Place, Said, platform_id
from bot.store import Acquired, Heard

# What the bot says when an admin allows or denies a group from inside it.
ALLOWED = "I answer in this group now: mention me, reply to me, or use a command."
DENIED = "I won't answer in this group any more. An admin can /allow it again."


def addressed(message: InboundMessage, wake_words: Sequence[str]) -> Literal["1", "0", "never"]:
    """Whether a group message is addressed to the bot ("1"), may follow up its sender's
    burst ("0"), or is never for the bot ("never": another bot's, or a command for one)."""
    if message.from_bot:
        return "never"
    if message.mentioned:
        return "1"
    text = message.text.strip()
    name = command_of(text)
    if name is not None:
        # "/help@OtherBot": an adapter marks a command for this bot as mentioned.
        if "@" in text.split(maxsplit=1)[0]:
            return "never"
        return "1" if name in COMMANDS else "0"
    if wake_words and _wake_pattern(tuple(wake_words)).search(text):
        return "1"
    return "0"


# Compiled once per list of words (a reload may change it), not once per message.
@functools.lru_cache(maxsize=8)
def _wake_pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def heard(message: InboundMessage, settings: GroupsSettings) -> Heard:
    """How ingest takes a message in (`Heard`): a DM's as it is; a group's by whether the
    settings allow the group, whether it is addressed, and its entry in the room."""
    if message.is_dm:
        return Heard()
    return Heard(
        group="allowed" if settings.allows(message.chat_id) else "ask",
        addressed=addressed(message, settings.wake_words),
        said=Said.of(message, settings.context_chars).to_json(),
    )


def group_switch(message: InboundMessage, wake_words: Sequence[str]) -> bool | None:
    """An admin's /allow (True) or /deny (False) with no argument, said in a group to the
    bot: it allows or denies that group. None for anything else. The caller checks that the
    sender is an admin; the group's allowance is checked after this, so an admin can allow a
    group the bot is silent in."""
    if message.is_dm or addressed(message, wake_words) != "1":
        return None
    words = message.text.split()
    name = command_of(message.text)
    if name not in ("allow", "deny") or len(words) != 1:
        return None
    return name == "allow"


def replied(grant: Acquired) -> str | None:
    """The message a group reply answers: its burst's last (the person's newest taken in, for
    a resend). None in a DM, where a reply needs no pointer."""
    if not Place.of(grant.lease.conversation if grant.lease else "").group:
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

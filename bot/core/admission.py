"""May this message be heard: the one place that decides it, before ingest.lua takes it in.

- **Who** (`verdict`): an admin (LASTWORD_ACCESS__ADMINS), someone allowed (everyone when
  LASTWORD_ACCESS__ALLOWED_USERS is empty), or refused. `/allow` and `/deny` of a user, kept
  in the store, are applied by ingest.lua on top of this.
- **Where** (`group_allowed`): in a group, whether the settings let the bot answer there; an
  admin's `/allow` or `/deny` said in the group itself (`group_switch`) overrides them.
- **Whether it is for the bot** (`addressed`, `heard`): in a group, a mention, a reply to the
  bot, one of its commands or a wake word addresses it; anything else may follow up its
  sender's open burst, or was said to the room (context only). Another bot is never answered,
  so two bots cannot talk to each other for ever.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Literal

from bot.commands import COMMANDS
from bot.commands.base import command_of
from bot.config.settings import AccessSettings, GroupsSettings, Verdict
from bot.message import InboundMessage, Said
from bot.store import Heard

# What the bot says when an admin allows or denies a group from inside it.
ALLOWED = "I answer in this group now: mention me, reply to me, or use a command."
DENIED = "I won't answer in this group any more. An admin can /allow it again."


def verdict(access: AccessSettings, user_id: str) -> Verdict:
    """Who `user_id` is to the settings: an admin, allowed, or refused."""
    if user_id in access.admins:
        return "admin"
    if not access.allowed_users or user_id in access.allowed_users:
        return "allowed"
    return "refused"


def group_allowed(groups: GroupsSettings, chat: str) -> bool:
    """Whether the settings let the bot answer in group `chat` (an admin's /allow or /deny,
    kept in the store, overrides them)."""
    return "*" in groups.allowed or chat in groups.allowed


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
        group="allowed" if group_allowed(settings, message.chat_id) else "ask",
        addressed=addressed(message, settings.wake_words),
        room_entry=Said.of(message, settings.context_chars).to_json(),
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

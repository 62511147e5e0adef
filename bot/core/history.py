"""The history as the model is shown it, and what /retry asks again.

The history keeps what the user saw: every message and every reply as sent. The model is
shown only the conversation, exchange by exchange: the user's messages a reply answered and
the model's own words in it. Commands, command answers, notices and apologies, and the
messages only they answered, are the user's dealings with the bot: left out
(docs/design.md, "What the model is shown").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from bot.commands.base import command_of
from bot.store import HistoryEntry


@dataclass(frozen=True)
class Retry:
    """What a /retry writes again: the last reply (its version), the user's messages it
    answered, the history before them, and the reply's turn (its tool record's id, so the
    calls it made are reused, never run again)."""

    before: tuple[HistoryEntry, ...]
    asked: tuple[HistoryEntry, ...]
    version: int
    turn: int


@dataclass(frozen=True)
class Exchange:
    """The user's messages a reply answered (commands left out), and that reply (None: none
    was delivered)."""

    asked: tuple[HistoryEntry, ...]
    reply: HistoryEntry | None

    @property
    def answered(self) -> bool:
        """Whether the model answered: a reply of its words (or one kept before they were
        told apart), not command answers, a notice or an apology alone."""
        reply = self.reply
        return reply is not None and (reply.words is None or bool(reply.words or reply.tools))

    def shown(self) -> tuple[HistoryEntry, ...]:
        """The exchange as the model is shown it: the messages, then its own words."""
        assert self.reply is not None
        words = self.reply.words
        return (*self.asked, self.reply if words is None else replace(self.reply, text=words))


def exchanges(history: Sequence[HistoryEntry]) -> list[Exchange]:
    """The history as exchanges, in the order of their replies. A reply answers the messages
    from its turn (the first version of its burst) to its own version: a /retry's reply
    comes last in the history, after any exchange since, yet answers what it answered before
    (a reply of turn 0 answers every message before it). Messages no reply
    answered are an exchange without one at the end if they came after every reply (a
    /retry asks them again), and are left out otherwise (a reply never delivered)."""
    found: list[Exchange] = []
    waiting: list[HistoryEntry] = []
    newest = 0
    for entry in history:
        if entry.role == "user":
            if entry.words is None or command_of(entry.words) is None:
                waiting.append(entry)
            continue
        asked = [u for u in waiting if entry.turn <= u.version <= entry.version]
        waiting = [u for u in waiting if not entry.turn <= u.version <= entry.version]
        found.append(Exchange(tuple(asked), entry))
        newest = max(newest, entry.version)
    trailing = tuple(u for u in waiting if u.version > newest)
    if trailing:
        found.append(Exchange(trailing, None))
    return found


def conversation_of(history: Sequence[HistoryEntry]) -> tuple[HistoryEntry, ...]:
    """The history as the model is shown it: the user's messages it answered, and its own
    words. Commands, what the bot said that the model did not (command answers, notices,
    apologies), and the messages they alone answered (stopped, set aside) are the user's
    dealings with the bot, not the conversation: left out, they neither cost every later
    request its tokens nor put words in the model's mouth."""
    return shown(exchanges(history))


def shown(found: Sequence[Exchange]) -> tuple[HistoryEntry, ...]:
    """The exchanges the model answered, as it is shown them (`conversation_of`)."""
    return tuple(e for x in found if x.answered for e in x.shown())


def last_reply(history: Sequence[HistoryEntry]) -> Retry | None:
    """What a /retry writes again: the last messages of the user's that a reply answered, or
    none did (a /stop, an apology), with the conversation before them; None if there are
    none. Commands are never asked again."""
    found = exchanges(history)
    for n in range(len(found) - 1, -1, -1):
        asked, reply = found[n].asked, found[n].reply
        if asked:
            # An entry from before replies kept their turn: the first message it answered.
            turn = reply.turn if reply is not None and reply.turn else asked[0].version
            return Retry(shown(found[:n]), asked, reply.version if reply is not None else 0, turn)
    return None

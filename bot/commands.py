"""Chat commands and access notices, shared by every platform.

Commands arrive as ordinary messages, so they are deduplicated, counted in `V` and answered
like any other: a cycle folds a burst into one `Plan`, and its one reply covers the commands
too (their answers first, then the model's answer to the rest). A `/reset` empties the history
when the reply is committed, and the messages of the burst before it are not answered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.message import InboundMessage

START = (
    "Hi! I'm an AI assistant. Write to me as you like, several messages in a row if you "
    "want: I wait until you have finished, then answer everything at once. /help lists "
    "what else I understand."
)
HELP = (
    "Commands:\n"
    "/start: what this bot does\n"
    "/help: this list\n"
    "/reset: forget our conversation so far and start afresh"
)
RESET = "Done: I've forgotten our conversation so far."
REFUSAL = "Sorry, this bot is private and can't talk to you."
OVER_BUDGET = (
    "You've used up today's allowance of answers from me. It renews at midnight UTC: "
    "write again then, and I'll answer everything."
)
RATE_LIMITED = (
    "You're sending messages faster than I can take them in, so I skipped some. "
    "Please wait a minute before writing again."
)

FIXED_ANSWERS = {"start": START, "help": HELP}


def command_of(text: str) -> str | None:
    """`"start"` for "/start", "/start@SomeBot" or "/START now"; None for anything else."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return None
    name = stripped[1:].split(maxsplit=1)[0].split("@", 1)[0].lower() if stripped[1:] else ""
    return name if name in ("start", "help", "reset") else None


@dataclass(frozen=True)
class Plan:
    """What one reply to a burst consists of."""

    reset: int  # version of the last /reset in the burst, 0 if none
    answers: tuple[str, ...]  # fixed answers to commands, in order
    for_model: tuple[InboundMessage, ...]  # what the model must answer, in order

    @property
    def keeps_history(self) -> bool:
        return self.reset == 0


def plan(watermark: int, unanswered: Sequence[InboundMessage]) -> Plan:
    """Sort the burst (W, V] into command answers and messages for the model.

    `unanswered[i]` has version `watermark + 1 + i`. Everything before the last /reset is
    dropped, as the user asked to start afresh.
    """
    reset = 0
    start = 0
    for index, message in enumerate(unanswered):
        if command_of(message.text) == "reset":
            reset = watermark + 1 + index
            start = index + 1
    answers: list[str] = [RESET] if reset else []
    for_model: list[InboundMessage] = []
    for message in unanswered[start:]:
        name = command_of(message.text)
        if name in FIXED_ANSWERS:
            answers.append(FIXED_ANSWERS[name])
        else:
            for_model.append(message)
    return Plan(reset, tuple(answers), tuple(for_model))

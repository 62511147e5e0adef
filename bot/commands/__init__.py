"""Chat commands and access notices, shared by every platform.

Every command is one `Command` in `COMMANDS`: its name, its /help line, whether it is for
admins, how it reads its arguments (misuse is answered with its usage line), what it answers
and what it changes once its reply is committed. `/help` is made from them, and `plan` sorts
a burst by them alone.

Commands arrive as ordinary messages, so they are deduplicated, counted in `V` and answered
like any other: a cycle folds a burst into one `Plan`, and its one reply covers the commands
too (their answers first, then the model's answer to the rest). A `/reset` empties the history
when the reply is committed, and the messages of the burst before it are not answered. A
`/stop` sent while the bot works moves the version, which cancels the generation under way
(the interrupt watch, whichever replica holds it); the messages before it are then not
answered either (a `/retry` answers them after all), and the reply is a short "Stopped." so
the user knows it was heard; a `/stop` with nothing before it to answer says there was
nothing to stop.

Admins (LASTWORD_ACCESS__ADMINS) have more (`bot.commands.admin`); anyone else who tries one is told
it is for admins only. What a command changes (`Change`) is carried out only once its reply has
passed the pre-send check, and travels in the outbox with it (`encoded`, `decoded`).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bot.blame import COMMAND, blamed
from bot.commands import admin, chat
from bot.commands.base import (
    AnyCommand,
    Ask,
    Change,
    Command,
    CommandContext,
    Decision,
    command_of,
)
from bot.commands.chat import (
    ECHO_MODEL_ANSWER,
    NOTHING_TO_RETRY,
    NOTHING_TO_STOP,
    RESET,
    START,
    STOPPED,
    WELCOME,
    ModelPick,
    budget_of,
    model_named,
)
from bot.commands.forget import FORGET, Asked, Erase
from bot.commands.memory import MEMORY, REMEMBER, Forgot, MemorySwitch, Remember
from bot.commands.persona import PERSONA, Persona
from bot.commands.tools import TOOLS
from bot.memory import Memory
from bot.message import InboundMessage
from bot.store import Store

__all__ = [
    "ECHO_MODEL_ANSWER",
    "NOTHING_TO_RETRY",
    "NOTHING_TO_STOP",
    "RESET",
    "START",
    "STOPPED",
    "WELCOME",
    "Ask",
    "CommandContext",
    "Decision",
    "budget_of",
    "command_of",
    "model_named",
]

REFUSAL = "Sorry, this bot is private and can't talk to you."
OVER_BUDGET = (
    "You've used up today's allowance of answers from me. It renews at midnight UTC: "
    "write again then, and I'll answer everything."
)
RATE_LIMITED = (
    "You're sending messages faster than I can take them in, so I skipped some. "
    "Please wait a minute before writing again."
)


async def _help(turn: CommandContext, ask: Ask, words: object) -> Decision:
    if ask.by in turn.settings.access.admins:
        return Decision(f"{HELP}\n\n{ADMIN_HELP}")
    return Decision(HELP)


HELP_COMMAND = Command[object](name="help", help="this list", run=_help)

# Every command, in the order /help lists them.
COMMANDS: dict[str, AnyCommand] = {
    c.name: c
    for c in (
        chat.START_COMMAND,
        HELP_COMMAND,
        chat.STOP,
        chat.USAGE,
        chat.MODEL,
        chat.RETRY,
        chat.RESET_COMMAND,
        FORGET,
        PERSONA,
        REMEMBER,
        MEMORY,
        TOOLS,
        admin.ALLOW,
        admin.DENY,
        admin.BUDGET,
        admin.STATS,
    )
}
# Every kind of change a reply can carry in the outbox, by its `kind`.
CHANGES: dict[str, type[Change]] = {
    c.kind: c
    for c in (admin.Change, ModelPick, Persona, Asked, Erase, Remember, Forgot, MemorySwitch)
}


def _listing(title: str, admins: bool) -> str:
    lines = [
        f"/{c.name}{' ' + c.shape if c.shape else ''}: {c.help}"
        for c in COMMANDS.values()
        if c.admin == admins
    ]
    return "\n".join([title, *lines])


HELP = _listing("Commands:", admins=False)
ADMIN_HELP = _listing("Admin commands:", admins=True)


def unknown(name: str) -> str:
    return f"I don't know /{name}. /help lists what I understand."


def admins_only(name: str) -> str:
    return f"Only the bot's admins can use /{name}."


async def decide(turn: CommandContext, ask: Ask) -> Decision:
    """The answer to one command of the burst, with what it will change."""
    with blamed(COMMAND):
        return await COMMANDS[ask.command].decide(turn, ask)


def encoded(changes: Sequence[Change]) -> str:
    """Changes as the outbox keeps them ("" for none)."""
    if not changes:
        return ""
    return json.dumps([{"kind": c.kind, **asdict(c)} for c in changes])  # type: ignore[call-overload]


def decoded(raw: str) -> tuple[Change, ...]:
    """The changes an outbox kept (`encoded`)."""
    found: list[dict[str, Any]] = json.loads(raw) if raw else []
    return tuple(CHANGES[c.pop("kind")](**c) for c in found)


async def apply(store: Store, conversation: str, changes: Sequence[Change], memory: Memory) -> None:
    """Carry the changes out, in order. Raises `Unavailable` if the store refused one; the
    reply is then not sent, and whoever re-sends it from the outbox applies them again."""
    for change in changes:
        await change.apply(store, conversation, memory)


@dataclass(frozen=True)
class Plan:
    """What one reply to a burst consists of."""

    reset: int  # version of the last /reset in the burst, 0 if none
    # Version of the last /retry in the burst, 0 if none: the last reply is written again for
    # the messages it answered, and replaces it in the history.
    retry: int
    # Answers to commands, in order; an `Ask` is answered by the cycle (`decide`).
    answers: tuple[str | Ask, ...]
    for_model: tuple[InboundMessage, ...]  # what the model must answer, in order

    @property
    def keeps_history(self) -> bool:
        return self.reset == 0


def _effect(message: InboundMessage) -> str:
    name = command_of(message.text)
    command = COMMANDS.get(name) if name is not None else None
    return command.effect if command is not None else ""


def plan(
    watermark: int, unanswered: Sequence[InboundMessage], admins: Collection[str] = ()
) -> Plan:
    """Sort the burst (W, V] into command answers and messages for the model.

    `unanswered[i]` has version `watermark + 1 + i`. Everything before the last /reset is
    dropped, as the user asked to start afresh; everything before the last /stop too, as the
    user asked not to be answered. A /stop with nothing before it (since the last /reset or
    /stop) stopped nothing, and says so. `admins` may use the admin commands.
    """
    reset = start = 0
    stopped = skipped = False
    for index, message in enumerate(unanswered):
        effect = _effect(message)
        if effect in ("reset", "stop"):
            skipped = skipped or (effect == "stop" and index > start)
            start, stopped = index + 1, effect == "stop"
            reset = watermark + 1 + index if effect == "reset" else reset
    answers: list[str | Ask] = [COMMANDS["reset"].text] if reset else []
    for_model: list[InboundMessage] = []
    retry = 0
    for index, message in enumerate(unanswered[start:], start):
        name = command_of(message.text)
        if name is None:
            for_model.append(message)
        elif _effect(message) == "retry":
            retry = watermark + 1 + index
        else:
            answers.append(_answer(name, message, watermark + 1 + index, admins))
    if stopped and not answers and not for_model and not retry:
        answers.append(COMMANDS["stop"].text if skipped else NOTHING_TO_STOP)
    return Plan(reset, retry, tuple(answers), tuple(for_model))


def _answer(name: str, message: InboundMessage, version: int, admins: Collection[str]) -> str | Ask:
    """A command's answer as far as the burst alone tells it: fixed, or to be decided."""
    command = COMMANDS.get(name)
    if command is None:
        return unknown(name)
    if command.admin and message.user_id not in admins:
        return admins_only(name)
    if command.text:
        return command.text
    argument = message.text.strip().split(maxsplit=1)[1:]
    words = argument[0].strip() if argument else ""
    return Ask(name, words, by=message.user_id, version=version)

"""Chat commands and access notices, shared by every platform.

Commands arrive as ordinary messages, so they are deduplicated, counted in `V` and answered
like any other: a cycle folds a burst into one `Plan`, and its one reply covers the commands
too (their answers first, then the model's answer to the rest). A `/reset` empties the history
when the reply is committed, and the messages of the burst before it are not answered. A
`/stop` sent while the bot works moves the version, which cancels the generation under way
(the interrupt watch, whichever replica holds it); the messages before it are then not
answered either, and the reply is a short "Stopped." so the user knows it was heard.

Admins (LASTWORD_ACCESS__ADMINS) have four more (`ADMIN_COMMANDS`, carried out by
`bot.admin`); anyone else who tries one is told it is for admins only.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from bot.message import InboundMessage
from bot.settings import LLMSettings, ModelChoice

START = (
    "Hi! I'm an AI assistant. Write to me as you like, several messages in a row if you "
    "want: I wait until you have finished, then answer everything at once. /help lists "
    "what else I understand."
)
HELP = (
    "Commands:\n"
    "/start: what this bot does\n"
    "/help: this list\n"
    "/stop: stop the answer I'm writing, and skip what you sent before it\n"
    "/usage: what you have used today and this month\n"
    "/model: the models you can pick from, and /model <name> to pick one\n"
    "/retry: write my last answer again\n"
    "/reset: forget our conversation so far and start afresh"
)
RESET = "Done: I've forgotten our conversation so far."
STOPPED = "Stopped."
NOTHING_TO_RETRY = "There is no answer of mine to write again yet."
REFUSAL = "Sorry, this bot is private and can't talk to you."
OVER_BUDGET = (
    "You've used up today's allowance of answers from me. It renews at midnight UTC: "
    "write again then, and I'll answer everything."
)
RATE_LIMITED = (
    "You're sending messages faster than I can take them in, so I skipped some. "
    "Please wait a minute before writing again."
)

ADMIN_HELP = (
    "Admin commands:\n"
    "/allow <user id>: let a user talk to me\n"
    "/deny <user id>: refuse a user's messages from now on\n"
    "/budget <user id> <tokens>: a user's daily token budget (0: no limit, default: the "
    "settings' budget)\n"
    "/stats: today's replies, tokens, users, interrupted and forced replies"
)
FIXED_ANSWERS = {"start": START, "help": HELP}
ASKS = ("usage", "model")
# Answered for the users in LASTWORD_ACCESS__ADMINS only (bot.admin); anyone else is told no.
ADMIN_COMMANDS = ("allow", "deny", "budget", "stats")
# A command's shape, as Telegram and Discord users type one: "/name", "/name@Bot", "/name args".
# "/etc/hosts is broken" is not one, and goes to the model.
COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?:@\w+)?(?:\s|$)")


@dataclass(frozen=True)
class Ask:
    """A command whose answer the cycle works out when it replies (it needs the store)."""

    command: str  # "usage", "model", or an admin's (`ADMIN_COMMANDS`)
    argument: str = ""
    by: str = ""  # the user id of who asked


def model_named(llm: LLMSettings, name: str) -> ModelChoice | None:
    """The model users call `name`; None for the default, or a name no longer offered."""
    return next((m for m in llm.models if m.name.lower() == name.lower()), None)


# /model where no model is configured: the offline echo model answers, whatever is listed.
ECHO_MODEL_ANSWER = (
    "I answer with the offline echo model, which repeats what you said: no AI model is set "
    "up, so there is none to pick."
)


def models_answer(llm: LLMSettings, current: str) -> str:
    """The answer to /model: what can be picked, and which one is the user's."""
    if not llm.models:
        return f"I answer with {llm.model}; there is no other model to pick."
    mine = model_named(llm, current)
    lines = ["Models you can pick with /model <name>:"]
    for m in llm.models:
        cost = f", each token counts {m.cost:g}x" if m.cost != 1 else ""
        lines.append(f"{m.name} ({m.model}{cost})" + (" - yours" if m is mine else ""))
    if mine is None:
        lines.append(f"You have the default, {llm.model}.")
    return "\n".join(lines)


def usage_answer(today: int, month: int, daily_budget: int) -> str:
    """The answer to /usage: tokens spent today and this month (UTC), and what is left."""
    lines = [f"Today: {today:,} tokens.", f"This month: {month:,} tokens."]
    if daily_budget:
        left = max(daily_budget - today, 0)
        lines.insert(1, f"Left today: {left:,} of {daily_budget:,} (renews at midnight UTC).")
    return "\n".join(lines)


def unknown(name: str) -> str:
    return f"I don't know /{name}. /help lists what I understand."


def admins_only(name: str) -> str:
    return f"Only the bot's admins can use /{name}."


def command_of(text: str) -> str | None:
    """`"start"` for "/start", "/start@SomeBot" or "/START now"; None for what is not shaped
    like a command."""
    found = COMMAND.match(text.strip())
    return found.group(1).lower() if found else None


@dataclass(frozen=True)
class Plan:
    """What one reply to a burst consists of."""

    reset: int  # version of the last /reset in the burst, 0 if none
    # Version of the last /retry in the burst, 0 if none: the last reply is written again for
    # the messages it answered, and replaces it in the history.
    retry: int
    # Answers to commands, in order; an `Ask` is filled in by the cycle.
    answers: tuple[str | Ask, ...]
    for_model: tuple[InboundMessage, ...]  # what the model must answer, in order

    @property
    def keeps_history(self) -> bool:
        return self.reset == 0


def plan(
    watermark: int, unanswered: Sequence[InboundMessage], admins: Collection[str] = ()
) -> Plan:
    """Sort the burst (W, V] into command answers and messages for the model.

    `unanswered[i]` has version `watermark + 1 + i`. Everything before the last /reset is
    dropped, as the user asked to start afresh; everything before the last /stop too, as the
    user asked not to be answered. `admins` may use the admin commands (and see them in /help).
    """
    reset = 0
    retry = 0
    start = 0
    stopped = False
    for index, message in enumerate(unanswered):
        name = command_of(message.text)
        if name == "reset":
            reset = watermark + 1 + index
            start, stopped = index + 1, False
        elif name == "stop":
            start, stopped = index + 1, True
    answers: list[str | Ask] = [RESET] if reset else []
    for_model: list[InboundMessage] = []
    for index, message in enumerate(unanswered[start:], start):
        name = command_of(message.text)
        if name is None:
            for_model.append(message)
        elif name == "help" and message.user_id in admins:
            answers.append(f"{HELP}\n\n{ADMIN_HELP}")
        elif name in FIXED_ANSWERS:
            answers.append(FIXED_ANSWERS[name])
        elif name == "retry":
            retry = watermark + 1 + index
        elif name in ASKS or (name in ADMIN_COMMANDS and message.user_id in admins):
            argument = message.text.strip().split(maxsplit=1)[1:]
            words = argument[0].strip() if argument else ""
            answers.append(Ask(name, words, by=message.user_id))
        elif name in ADMIN_COMMANDS:
            answers.append(admins_only(name))
        else:
            answers.append(unknown(name))
    if stopped and not answers and not for_model and not retry:
        answers.append(STOPPED)
    return Plan(reset, retry, tuple(answers), tuple(for_model))

"""Everyone's commands: /start, /stop, /usage, /model, /retry and /reset (/help, made from
the registry, is with it in `bot.commands`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bot.commands.base import Ask, Command, CommandContext, Decision
from bot.config.settings import LLMSettings, ModelChoice, Settings
from bot.memory import Memory
from bot.store import Spending, Store
from bot.tokens import WEIGHTED, spent

START = (
    "Hi! I'm an AI assistant. Write to me as you like, several messages in a row if you "
    "want: I wait until you have finished, then answer everything at once. /help lists "
    "what else I understand."
)
# What /start adds where memory is on (LASTWORD_MEMORY__ENABLED).
REMEMBERING = (
    "I remember what you tell me about yourself, in every conversation: /memory shows what "
    "I keep and lets you erase it, /memory off stops it."
)
WELCOME = f"{START}\n\n{REMEMBERING}"
RESET = "Done: I've forgotten our conversation so far."
STOPPED = "Stopped."
# /stop when no answer was owed: nothing was being written, so nothing was stopped.
NOTHING_TO_STOP = "There was nothing to stop: I wasn't writing anything."
NOTHING_TO_RETRY = "There is no answer of mine to write again yet."
# /model where no model is configured: the offline echo model answers, whatever is listed.
ECHO_MODEL_ANSWER = (
    "I answer with the offline echo model, which repeats what you said: no AI model is set "
    "up, so there is none to pick."
)


def budget_of(settings: Settings, spending: Spending) -> int:
    """A user's daily token budget: the one an admin set for them, else the settings'."""
    return settings.llm.daily_tokens_per_user if spending.budget is None else spending.budget


def model_named(llm: LLMSettings, name: str) -> ModelChoice | None:
    """The model users call `name`; None for the default, or a name no longer offered."""
    return next((m for m in llm.models if m.name.lower() == name.lower()), None)


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


def weighs(llm: LLMSettings, spending: Spending) -> bool:
    """Whether the budget counts other than the tokens as spent: some model's tokens cost
    more or less than 1, or did when they were spent (a model since taken out)."""
    as_spent = (spending.tokens_today.total, spending.tokens_month.total)
    return any(m.cost != 1 for m in llm.models) or (spending.today, spending.month) != as_spent


def usage_answer(spending: Spending, daily_budget: int, weighted: bool) -> str:
    """The answer to /usage: the tokens the person spent today and this month (UTC), in every
    place they talk to the bot, counted as /stats and `lastword status` count them (and this
    place's share, when some were spent elsewhere), and what is left of the daily budget,
    which counts them all. `weighted`: the budget counts each token times its model's cost,
    so it says so, with the weighed sums."""
    today, month = spending.tokens_today, spending.tokens_month
    lines = [
        f"Today: {spent(today.prompt, today.completion)}.",
        f"This month: {spent(month.prompt, month.completion)}.",
    ]
    here, here_month = spending.here_today, spending.here_month
    if (here, here_month) != (today, month):
        lines.append(
            f"Of these, here: {here.total:,} today and {here_month.total:,} this month; the "
            "rest where else you talk to me (your DMs, other groups and topics)."
        )
    if weighted:
        lines.append(
            f"Your daily budget counts {WEIGHTED} (each token times its model's cost, see "
            f"/model): {spending.today:,} today, {spending.month:,} this month."
        )
    if daily_budget:
        left = max(daily_budget - spending.today, 0)
        unit = WEIGHTED if weighted else "tokens"
        lines.append(f"Left today: {left:,} of {daily_budget:,} {unit} (renews at midnight UTC).")
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelPick:
    """The model a user picked, kept for every replica (`Store.pick_model`)."""

    kind: ClassVar[str] = "model"
    name: str

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await store.pick_model(conversation, self.name)


async def _usage(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    spending = await turn.store.spending(turn.conversation, ask.by)
    budget = budget_of(turn.settings, spending)
    weighted = weighs(turn.settings.llm, spending)
    return Decision(usage_answer(spending, budget, weighted))


async def _model(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    llm = turn.settings.llm
    if not turn.picks_models:
        return Decision(ECHO_MODEL_ANSWER)
    if not ask.argument:
        return Decision(models_answer(llm, turn.model))
    choice = model_named(llm, ask.argument)
    if choice is None:
        return Decision(
            f"There is no model called {ask.argument!r}.\n" + models_answer(llm, turn.model)
        )
    turn.model = choice.name
    return Decision(
        f"From now on I answer you with {choice.name} ({choice.model}).", (ModelPick(choice.name),)
    )


async def _start(turn: CommandContext, ask: Ask, words: object) -> Decision:
    return Decision(WELCOME if turn.settings.memory.enabled else START)


START_COMMAND = Command[object](name="start", help="what this bot does", run=_start)
# /retry after a /stop answers what the /stop skipped (`bot.core.history.last_reply`): their help
# lines say so, since a user who stops an answer by mistake, or to have it written anew,
# gets it back with /retry; what /stop skipped is never lost.
STOP = Command[object](
    name="stop",
    help="stop the answer I'm writing (/retry writes it after all)",
    text=STOPPED,
    effect="stop",
)
USAGE = Command(name="usage", help="what you have used today and this month", run=_usage)
MODEL = Command(
    name="model",
    help="the models you can pick from, or pick one",
    shape="[name]",
    run=_model,
)
RETRY = Command[object](
    name="retry", help="write my last answer again, or the one you stopped", effect="retry"
)
RESET_COMMAND = Command[object](
    name="reset",
    help="forget our conversation so far and start afresh",
    text=RESET,
    effect="reset",
)

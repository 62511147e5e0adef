"""/forget: erase what is kept about the user, once they confirm (the same command again
within a minute, `bot.store.FORGET_CONFIRM_MS`): the history, the messages it answers, the cached
transcripts and documents, the model and persona they picked. Counters without content stay:
usage totals (budgets count on them) and the ids that keep a redelivered message from being
answered twice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bot.command import Ask, Command, Decision, Turn, no_words
from bot.store import Store

CONFIRM = (
    "This erases everything I keep about you: our conversation, what your files said, and "
    "the model and persona you picked (your usage totals stay). Send /forget again within a "
    "minute to confirm."
)
FORGOTTEN = (
    "Done: I've erased our conversation, what your files said, and the model and persona "
    "you picked."
)


@dataclass(frozen=True)
class Asked:
    """/forget asked for its confirmation."""

    kind: ClassVar[str] = "forget_asked"

    async def apply(self, store: Store, conversation: str) -> None:
        await store.ask_forget(conversation)


@dataclass(frozen=True)
class Erase:
    """/forget confirmed: erase (`Store.forget`)."""

    kind: ClassVar[str] = "forget"

    async def apply(self, store: Store, conversation: str) -> None:
        await store.forget(conversation)


async def _forget(turn: Turn, ask: Ask, words: Sequence[str]) -> Decision:
    if turn.forget_asked or await turn.store.forget_asked(turn.conversation):
        turn.model, turn.persona, turn.forget_asked = "", "", False
        return Decision(FORGOTTEN, (Erase(),), reset=True)
    turn.forget_asked = True
    return Decision(CONFIRM, (Asked(),))


FORGET = Command(
    name="forget",
    help="erase everything I keep about you (I ask you to confirm)",
    usage="Usage: /forget, then /forget again within a minute to confirm",
    parse=no_words,
    run=_forget,
)

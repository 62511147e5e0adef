"""/forget: erase what is kept about the person, everywhere they wrote to me (their DM, every
group and topic), once they confirm (the same command again within a minute, in the same
place, `bot.store.FORGET_CONFIRM_MS`): the histories, the messages they answer, the cached
transcripts and documents, what they said in groups' rooms, their memory (`bot.memory`), the
models and personas they picked. Counters without content stay: usage totals (the daily
budget counts on today's, so a /forget never renews it) and the ids that keep a redelivered
message from being answered twice. /reset, by contrast, forgets one place's conversation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bot.commands.base import Ask, Command, CommandContext, Decision, no_words
from bot.memory import Memory, Person
from bot.message import Place
from bot.plural import counted
from bot.store import Store

CONFIRM = (
    "This erases everything I keep about you, here and in every other chat, group and topic: "
    "our conversations, what your files said, what you said in groups, what I remember "
    "about you, and the models and personas you picked (your usage totals stay). Send /forget "
    "again within a minute to confirm."
)


def forgotten(places: int) -> str:
    """What a confirmed /forget answers, having erased what was kept in `places` places."""
    if places <= 1:
        return (
            "Done: I've erased our conversation, what your files said, what I remembered "
            "about you, and the model and persona you picked."
        )
    return (
        f"Done: I've erased what I kept about you in {counted(places, 'place')} (here and "
        "wherever else you wrote to me): our conversations, what your files said, what you "
        "said in groups, what I remembered about you, and the models and personas you picked."
    )


# The answer where nothing was kept anywhere else.
FORGOTTEN = forgotten(1)


@dataclass(frozen=True)
class Asked:
    """/forget asked for its confirmation."""

    kind: ClassVar[str] = "forget_asked"

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await store.ask_forget(conversation)


@dataclass(frozen=True)
class Erase:
    """/forget confirmed: erase what is kept about the person `user` in every place
    (`Store.forget`; "": in this one, as a reply kept from before people had places says)."""

    kind: ClassVar[str] = "forget"
    user: str = ""

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await store.forget(conversation, self.user)
        if self.user:
            await memory.erase(Person(Place.of(conversation).platform, self.user))


async def _forget(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    if turn.forget_asked or await turn.store.forget_asked(turn.conversation):
        turn.model, turn.persona, turn.forget_asked = "", "", False
        places = await turn.store.places(turn.conversation, ask.by)
        return Decision(forgotten(len(places)), (Erase(ask.by),), reset=True)
    turn.forget_asked = True
    return Decision(CONFIRM, (Asked(),))


FORGET = Command(
    name="forget",
    help="erase everything I keep about you (I ask you to confirm)",
    usage="Usage: /forget, then /forget again within a minute to confirm",
    parse=no_words,
    run=_forget,
)

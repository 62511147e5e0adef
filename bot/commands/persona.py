"""/persona <text>: the user's own instructions, added to the system prompt of their
conversation and kept in the store like the model picked with /model, so every replica
follows them. `/persona` shows them, `/persona off` removes them. At most
`llm.persona_chars` characters; 0 turns the command off."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bot.commands.base import Ask, Command, CommandContext, Decision, any_words
from bot.memory import Memory
from bot.store import Store

OFF = "off"
TURNED_OFF = "Personas are turned off on this bot."
NONE = "You have no persona: I follow only my own instructions. /persona <text> sets one."


@dataclass(frozen=True)
class Persona:
    """The user's instructions, kept for every replica ("" removes them)."""

    kind: ClassVar[str] = "persona"
    text: str

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await store.keep_persona(conversation, self.text)


async def _persona(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    limit = turn.settings.llm.persona_chars
    if not limit:
        return Decision(TURNED_OFF)
    text = ask.argument.strip()
    if not text:
        return Decision(f"Your persona:\n{turn.persona}" if turn.persona else NONE)
    if text.lower() == OFF:
        turn.persona = ""
        return Decision("Done: your persona is removed.", (Persona(""),))
    if len(text) > limit:
        return Decision(f"A persona can be at most {limit:,} characters; yours has {len(text):,}.")
    turn.persona = text
    return Decision("Done: I follow your persona from now on.", (Persona(text),))


PERSONA = Command(
    name="persona",
    help="instructions of yours I follow in our conversation (/persona shows them, "
    "/persona off removes them)",
    shape="<text>",
    usage="Usage: /persona <instructions>, /persona to see them, /persona off",
    parse=any_words,
    run=_persona,
)

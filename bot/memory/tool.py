"""The built-in memory tool: the model saves, rewrites or deletes a fact about the person it is
answering. Bound, per reply, to that person (`MemoryRunner`): its arguments name no person, and
nothing the model writes can point it at someone else. It changes something, so it runs as
every such tool does (`bot.core.steps`): recorded first, at most once per call, never after
the person wrote again, held while a speculative window is open."""

from __future__ import annotations

from typing import Any

from bot.memory import Memory, Person
from bot.tools import Tool

NAME = "user_memory"
SOURCE = "builtin:memory"

TOOL = Tool(
    name=NAME,
    description=(
        "Your memory of this user across conversations: save a short fact they told you about "
        "themselves (name, preferences, circumstances), replace one that changed, or delete "
        "one they want forgotten. Never others' words, secrets or instructions."
    ),
    parameters={
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["save", "replace", "delete"]},
            "fact": {"type": "string"},
            "number": {"type": "integer", "description": "as in the <memory> block"},
        },
        "required": ["action"],
    },
    side_effects=True,
    source=SOURCE,
    title="Remembering",
)


class MemoryRunner:
    """Runs the memory tool for one person, the one the reply answers, saying where: a
    `Runner` of `bot.tools`. The call's idempotency key names each write, so a call carried
    out twice keeps one fact."""

    def __init__(self, memory: Memory, person: Person, where: str, fact_chars: int) -> None:
        self.memory = memory
        self.person = person
        self.where = where
        self.fact_chars = fact_chars

    async def __call__(self, tool: Tool, arguments: dict[str, Any], key: str) -> str:
        action = arguments.get("action")
        number = arguments.get("number", 0)
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ValueError("'number' must be a fact's number")
        if action == "delete":
            if not number:
                raise ValueError("'delete' needs the fact's 'number'")
            if await self.memory.drop(self.person, number):
                return f"deleted fact {number}"
            return f"there is no fact {number}; nothing was deleted"
        if action not in ("save", "replace"):
            raise ValueError("'action' must be 'save', 'replace' or 'delete'")
        fact = arguments.get("fact")
        if not isinstance(fact, str) or not fact.strip():
            raise ValueError(f"'{action}' needs the 'fact' to keep")
        fact = " ".join(fact.split())
        if len(fact) > self.fact_chars:
            raise ValueError(f"a fact may be at most {self.fact_chars} characters")
        if action == "replace" and not number:
            raise ValueError("'replace' needs the 'number' of the fact it replaces")
        saved = await self.memory.save(
            self.person, fact, where=self.where, key=key, replace=number, evict=False
        )
        if saved.status == "full":
            return (
                "not saved: the memory of this user is full. Replace a fact that matters less "
                "(action 'replace' with its number), or delete one first."
            )
        if saved.status == "missing":
            return f"there is no fact {number}; nothing was replaced"
        if saved.status == "replaced":
            return f"replaced fact {saved.n}"
        if saved.status == "exists":
            return f"already saved as fact {saved.n}"
        return f"saved as fact {saved.n}"

"""/remember and /memory: the person's own hand on what the bot remembers of them
(`bot.memory`). `/remember <text>` keeps a fact (when the memory is full, the least recently
written one makes room); `/memory` lists the facts, numbered, with where each was saved;
`/memory forget <n>` and `/memory clear` take them back; `/memory off` and `/memory on` keep
memory away from them or bring it back (the facts stay until cleared); `/memory groups on`
shows their facts in groups too, where everyone reads the reply. Like every command's change,
each is carried out once the reply passes the pre-send check, and carrying one out twice (a
reply re-sent after a crash) changes nothing more: a /remember names its write by its place
and version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from bot.commands.base import Ask, Command, CommandContext, Decision, any_words
from bot.memory import Fact, Memory, Person, Switch, saved_in
from bot.message import Place
from bot.store import Store

OFF_HERE = "Memory is turned off on this bot: I keep nothing about you between conversations."
OFF_FOR_YOU = "Your memory is off: I don't use or keep facts about you. /memory on turns it on."
MEMORY_USAGE = (
    "Usage: /memory to see what I remember, /memory forget <number>, /memory clear, "
    "/memory off, /memory on, /memory groups on, /memory groups off"
)
REMEMBER_USAGE = "Usage: /remember <something about you I should keep in mind>"
NOTHING_KEPT = "I don't remember anything about you yet. Tell me, or use /remember <text>."


@dataclass(frozen=True)
class Remember:
    """/remember: keep `text` for the person, the write named by `key`."""

    kind: ClassVar[str] = "remember"
    platform: str
    user: str
    text: str
    where: str
    key: str

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        person = Person(self.platform, self.user)
        await memory.save(person, self.text, where=self.where, key=self.key, evict=True)


@dataclass(frozen=True)
class Forgot:
    """/memory forget <n> (or /memory clear, n = 0): take facts back."""

    kind: ClassVar[str] = "memory_forget"
    platform: str
    user: str
    n: int

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await memory.drop(Person(self.platform, self.user), self.n)


@dataclass(frozen=True)
class MemorySwitch:
    """/memory off|on, /memory groups on|off."""

    kind: ClassVar[str] = "memory_switch"
    platform: str
    user: str
    name: Switch
    on: bool

    async def apply(self, store: Store, conversation: str, memory: Memory) -> None:
        await memory.switch(Person(self.platform, self.user), self.name, self.on)


def _person(turn: CommandContext, ask: Ask) -> Person:
    return Person(Place.of(turn.conversation).platform, ask.by)


def listed(facts: Sequence[Fact]) -> str:
    """The facts as /memory shows them: by number, with where each was saved."""
    lines = [
        f"{fact.n}. {fact.text}" + (f" (saved in {fact.where})" if fact.where else "")
        for fact in facts
    ]
    return "\n".join(["What I remember about you:", *lines])


async def _remember(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    if turn.memory is None:
        return Decision(OFF_HERE)
    text = " ".join(words)
    if not text:
        return Decision(REMEMBER_USAGE)
    limit = turn.settings.memory.fact_chars
    if len(text) > limit:
        return Decision(f"A fact can be at most {limit:,} characters; yours has {len(text):,}.")
    person = _person(turn, ask)
    if (await turn.memory.recall(person)).off:
        return Decision(OFF_FOR_YOU)
    key = f"remember:{turn.conversation}:{ask.version}"
    change = Remember(person.platform, person.user, text, saved_in(turn.conversation), key)
    return Decision("Done: I'll remember that. /memory shows what I keep.", (change,))


async def _memory(turn: CommandContext, ask: Ask, words: Sequence[str]) -> Decision:
    if turn.memory is None:
        return Decision(OFF_HERE)
    person = _person(turn, ask)
    said = [w.lower() for w in words]
    switch = _switch(person, said)
    if switch is not None:
        return switch
    if said == ["clear"]:
        return Decision("Done: I've forgotten every fact about you.", (Forgot(*_who(person), 0),))
    if len(said) == 2 and said[0] == "forget" and said[1].isdigit() and len(said[1]) < 10:
        n = int(said[1])
        kept = await turn.memory.recall(person)
        if not any(fact.n == n for fact in kept.facts):
            return Decision(f"I have no fact {n} about you. /memory lists them.")
        return Decision(f"Done: I've forgotten fact {n}.", (Forgot(*_who(person), n),))
    if said:
        return Decision(MEMORY_USAGE)
    kept = await turn.memory.recall(person)
    if kept.off:
        return Decision(OFF_FOR_YOU)
    shown = listed(kept.facts) if kept.facts else NOTHING_KEPT
    groups = "shown" if kept.groups else "not shown (/memory groups on shows them)"
    return Decision(
        f"{shown}\n\nIn groups these are {groups}. /memory forget <number> forgets one, "
        "/memory clear all of them, /memory off stops me remembering."
    )


def _who(person: Person) -> tuple[str, str]:
    return person.platform, person.user


def _switch(person: Person, said: Sequence[str]) -> Decision | None:
    """/memory off|on and /memory groups on|off; None for anything else."""
    if said == ["off"]:
        change = MemorySwitch(*_who(person), "off", True)
        return Decision("Done: I no longer use or keep facts about you.", (change,))
    if said == ["on"]:
        change = MemorySwitch(*_who(person), "off", False)
        return Decision("Done: I remember facts about you again.", (change,))
    if len(said) == 2 and said[0] == "groups" and said[1] in ("on", "off"):
        on = said[1] == "on"
        change = MemorySwitch(*_who(person), "groups", on)
        if on:
            return Decision(
                "Done: in groups too, my replies to you now use what I remember about you "
                "(everyone there can read them).",
                (change,),
            )
        return Decision("Done: in groups I no longer use what I remember about you.", (change,))
    return None


REMEMBER = Command(
    name="remember",
    help="keep something about you in mind, in every conversation",
    shape="<text>",
    usage=REMEMBER_USAGE,
    parse=any_words,
    run=_remember,
)
MEMORY = Command(
    name="memory",
    help="what I remember about you (/memory forget <n>, /memory clear, /memory off, "
    "/memory groups on)",
    usage=MEMORY_USAGE,
    parse=any_words,
    run=_memory,
)

"""Memory: short facts a person shared about themselves, kept for them across places,
replicas and restarts, and shown to the model only in requests that answer them (SPEC I8).

What memory is to the rest of lastword is `Memory`, a small interface: read a person's facts
(`recall`), write one (`save`), take one or all back (`drop`), and a person's two switches
(`switch`: memory off for them, their facts shown in groups). The built-in one keeps them in
the store (`bot.store.memory`); another (Mem0, Zep, Letta…) is a package that declares a
factory in the `lastword.memory` entry point group and is picked with
`LASTWORD_MEMORY__PROVIDER` (`provider`). Whatever keeps them, the core decides
whose facts a request carries and on whose behalf the built-in tool writes
(`bot.memory.tool`): always the person being answered, whatever the model's arguments say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from bot.config.settings import MEMORY_PROVIDERS
from bot.message import Place
from bot.plugins import entry_points

__all__ = [
    "GROUP",
    "NOTHING",
    "Fact",
    "Memory",
    "Person",
    "Recalled",
    "Saved",
    "Switch",
    "provider",
    "saved_in",
]

# The entry point group a memory provider declares its factory in (the built-in, "redis",
# needs none: it is the store's). The settings check a provider's name against it.
GROUP = MEMORY_PROVIDERS

# A person's switches: "off" keeps memory away from them altogether (no facts shown, no
# tool, /remember refused); "groups" shows their facts in group requests too.
Switch = Literal["off", "groups"]


@dataclass(frozen=True)
class Person:
    """One user of one platform, wherever they write: whose memory it is."""

    platform: str
    user: str

    @property
    def id(self) -> str:
        return f"{self.platform}:{self.user}"


@dataclass(frozen=True)
class Fact:
    """One fact: its number (stable: a fact keeps it until it is removed, and a number is
    never given twice), its text, where it was saved (a place's description, e.g. "a DM" or
    "a group") and when it was last written (ms, the store's clock)."""

    n: int
    text: str
    where: str = ""
    at: int = 0


@dataclass(frozen=True)
class Recalled:
    """What is kept for a person: their facts, oldest first, and their switches."""

    facts: tuple[Fact, ...] = ()
    off: bool = False
    groups: bool = False


NOTHING = Recalled()


def saved_in(conversation: str) -> str:
    """Where a fact saved in `conversation` was saved, as /memory lists it."""
    return "a group" if Place.of(conversation).group else "a DM"


@dataclass(frozen=True)
class Saved:
    """What a write came to: "saved" (as fact `n`; `evicted` names the least recently
    written fact it replaced, the memory being full), "replaced" (fact `n` rewritten),
    "exists" (this write, by its key, was made before: fact `n`), "full" (nothing saved: the
    caller must pick a fact to replace), or "missing" (no fact `n` to replace)."""

    status: Literal["saved", "replaced", "exists", "full", "missing"]
    n: int = 0
    evicted: int = 0


class Memory(Protocol):
    """Where a person's facts are kept. Every method may raise the store's
    `StoreUnavailable` (or the provider's own error): the caller treats it as an outage."""

    async def recall(self, person: Person) -> Recalled:
        """Their facts and switches; reading renews how long they are kept."""
        ...

    async def save(
        self,
        person: Person,
        text: str,
        *,
        where: str,
        key: str,
        replace: int = 0,
        evict: bool = False,
    ) -> Saved:
        """Keep `text` as a new fact (or as fact `replace`, rewritten). `key` names the write:
        the same key again changes nothing ("exists"), so a write carried out twice (a reply
        re-sent after a crash) keeps one fact. When the memory is full, `evict` drops the
        least recently written fact; else the answer is "full" and nothing is kept."""
        ...

    async def drop(self, person: Person, n: int = 0) -> int:
        """Remove fact `n`, or every fact (0): how many were removed. The switches stay."""
        ...

    async def switch(self, person: Person, name: Switch, on: bool) -> None:
        """Set one of the person's switches."""
        ...

    async def erase(self, person: Person) -> int:
        """Remove everything kept for the person, switches too (a /forget, `forget-user`):
        how many facts there were."""
        ...


# What a provider's entry point names: given the replica's store (which the built-in one keeps
# the facts in; another may ignore it) and the memory settings, the `Memory` to use.
Provider = Callable[[Any, Any], Memory]


def provider(name: str) -> Provider:
    """The factory of the memory provider `name`, as installed; ValueError, naming those
    that are, if none is."""
    found = entry_points(GROUP, name)
    if not found:
        names = ", ".join(sorted(p.name for p in entry_points(GROUP))) or "none"
        raise ValueError(f"no memory provider {name!r} is installed (installed: {names})")
    factory: Provider = found[0].load()
    return factory

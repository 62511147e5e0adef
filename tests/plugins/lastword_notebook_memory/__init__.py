"""A memory provider as a third party would write one (tests/memory/test_memory_provider.py):
`bot.memory.Memory` over a dict in the process, declared in the `lastword.memory` group. It
keeps nothing in lastword's store."""

from __future__ import annotations

from typing import Any

from bot.memory import Fact, Person, Recalled, Saved, Switch


class Notebook:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.facts: dict[str, dict[int, tuple[str, str, str]]] = {}
        self.switches: dict[str, set[str]] = {}
        self.numbers = 0

    async def recall(self, person: Person) -> Recalled:
        facts = self.facts.get(person.id, {})
        switches = self.switches.get(person.id, set())
        return Recalled(
            tuple(Fact(n, text, where) for n, (text, where, _) in sorted(facts.items())),
            off="off" in switches,
            groups="groups" in switches,
        )

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
        facts = self.facts.setdefault(person.id, {})
        for n, (_, _, written_by) in facts.items():
            if written_by == key:
                return Saved("exists", n)
        if replace:
            if replace not in facts:
                return Saved("missing", replace)
            facts[replace] = (text, where, key)
            return Saved("replaced", replace)
        evicted = 0
        if len(facts) >= self.cap:
            if not evict:
                return Saved("full")
            evicted = min(facts)
            del facts[evicted]
        self.numbers += 1
        facts[self.numbers] = (text, where, key)
        return Saved("saved", self.numbers, evicted)

    async def drop(self, person: Person, n: int = 0) -> int:
        facts = self.facts.get(person.id, {})
        if n:
            return int(facts.pop(n, None) is not None)
        count = len(facts)
        facts.clear()
        return count

    async def switch(self, person: Person, name: Switch, on: bool) -> None:
        switches = self.switches.setdefault(person.id, set())
        if on:
            switches.add(name)
        else:
            switches.discard(name)

    async def erase(self, person: Person) -> int:
        self.switches.pop(person.id, None)
        return len(self.facts.pop(person.id, {}))


def memory(store: Any, settings: Any) -> Notebook:
    """The provider's factory, as `lastword.memory` names it: lastword's store (unused here)
    and its memory settings."""
    return Notebook(settings.facts)

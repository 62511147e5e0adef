"""The built-in memory (`bot.memory.Memory`): a person's facts and switches in one hash of
theirs (`PersonKeys.memory`), in their slot, so every replica reads the same and each write is
one script (`memory_save.lua`, `memory_drop.lua`, `memory_switch.lua`). The hash is kept as
long as a conversation is (`retention_ms`), renewed by each write and each read, and a read
comes with every reply to the person, so memory lasts as long as they keep talking anywhere."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bot.memory import Fact, Person, Recalled, Saved, Switch
from bot.store import scripts
from bot.store.calls import Calls
from bot.store.replies import as_text

FACT_PREFIX = "f:"


class Facts(Calls):
    """The store's side of the built-in memory: one call per step, in the person's slot."""

    def _memory_key(self, person: Person) -> str:
        return self.layout.person_keys(person.platform, person.user).memory

    async def recall_facts(self, person: Person) -> Recalled:
        """The person's facts, oldest first, and switches: one round trip, which renews them."""
        key = self._memory_key(person)
        async with self._reaching(), self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(key)
            pipe.pexpire(key, self.settings.retention_ms)
            found, _ = await pipe.execute()
        return recalled(found)

    async def save_fact(
        self,
        person: Person,
        text: str,
        *,
        where: str,
        key: str,
        replace: int,
        cap: int,
        evict: bool,
    ) -> Saved:
        args: dict[str, str | int] = {
            "text": text,
            "where": where,
            "key": key,
            "replace": replace,
            "cap": cap,
            "evict": int(evict),
            "keep_ms": self.settings.retention_ms,
        }
        raw = await self._run(scripts.MEMORY_SAVE, {"memory": self._memory_key(person)}, args)
        said = json.loads(raw)
        return Saved(said["status"], int(said["n"]), int(said["evicted"]))

    async def drop_facts(self, person: Person, n: int = 0, *, erase: bool = False) -> int:
        keys = {"memory": self._memory_key(person)}
        return int(await self._run(scripts.MEMORY_DROP, keys, {"n": n, "erase": int(erase)}))

    async def switch_memory(self, person: Person, name: Switch, on: bool) -> None:
        args: dict[str, str | int] = {
            "name": name,
            "on": int(on),
            "keep_ms": self.settings.retention_ms,
        }
        await self._run(scripts.MEMORY_SWITCH, {"memory": self._memory_key(person)}, args)


def recalled(found: Mapping[Any, Any]) -> Recalled:
    """A memory hash as read (HGETALL) into its facts, by number, and switches."""
    fields = {as_text(name): value for name, value in found.items()}
    facts = []
    for name, raw in fields.items():
        if name.startswith(FACT_PREFIX):
            fact = json.loads(raw)
            n = int(name.removeprefix(FACT_PREFIX))
            facts.append(Fact(n, str(fact["text"]), str(fact.get("where", "")), int(fact["at"])))
    facts.sort(key=lambda fact: fact.n)
    return Recalled(tuple(facts), off="off" in fields, groups="groups" in fields)


class RedisMemory:
    """The built-in `Memory`, on the replica's store: at most `cap` facts a person."""

    def __init__(self, store: Facts, cap: int) -> None:
        self.store = store
        self.cap = cap

    async def recall(self, person: Person) -> Recalled:
        return await self.store.recall_facts(person)

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
        return await self.store.save_fact(
            person, text, where=where, key=key, replace=replace, cap=self.cap, evict=evict
        )

    async def drop(self, person: Person, n: int = 0) -> int:
        return await self.store.drop_facts(person, n)

    async def switch(self, person: Person, name: Switch, on: bool) -> None:
        await self.store.switch_memory(person, name, on)

    async def erase(self, person: Person) -> int:
        return await self.store.drop_facts(person, erase=True)

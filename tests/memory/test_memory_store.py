"""The built-in memory (`bot.store.memory`) and the memory tool's runner (`bot.memory.tool`),
against the real server: numbering, the bound, writes named by their key, switches, erasure,
retention, and a tool that acts on the person it is bound to whatever its arguments say."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.memory import Person
from bot.memory.tool import TOOL, MemoryRunner
from bot.store import RedisMemory, Store
from bot.store.keys import PersonKeys
from bot.tools import Toolbox, ToolCall

ANA, BO = Person("telegram", "1"), Person("telegram", "2")


@pytest.fixture
def memory(store: Store) -> RedisMemory:
    return RedisMemory(store, 3)


async def test_facts_are_numbered_kept_in_order_and_taken_back(memory: RedisMemory) -> None:
    for n, text in enumerate(["calls me Ana", "uses metric units"], 1):
        saved = await memory.save(ANA, text, where="a DM", key=f"k{n}")
        assert (saved.status, saved.n, saved.evicted) == ("saved", n, 0)
    kept = await memory.recall(ANA)
    assert [(f.n, f.text, f.where) for f in kept.facts] == [
        (1, "calls me Ana", "a DM"),
        (2, "uses metric units", "a DM"),
    ]
    assert (
        await memory.save(ANA, "calls me Anna", where="a group", key="k3", replace=1)
    ).status == "replaced"
    assert (await memory.save(ANA, "x", where="a DM", key="k4", replace=9)).status == "missing"
    assert [f.text for f in (await memory.recall(ANA)).facts] == [
        "calls me Anna",
        "uses metric units",
    ]
    assert await memory.drop(ANA, 2) == 1
    assert await memory.drop(ANA, 2) == 0
    # A number is never given twice: the next fact is 3, not 2.
    assert (await memory.save(ANA, "works nights", where="a DM", key="k5")).n == 3
    assert await memory.drop(ANA) == 2
    assert (await memory.recall(ANA)).facts == ()
    assert (await memory.recall(BO)).facts == ()


async def test_the_bound_refuses_or_makes_room_and_a_key_writes_once(memory: RedisMemory) -> None:
    for n in range(3):
        await memory.save(ANA, f"fact {n}", where="a DM", key=f"k{n}")
    full = await memory.save(ANA, "one more", where="a DM", key="k3", evict=False)
    assert full.status == "full"
    made_room = await memory.save(ANA, "one more", where="a DM", key="k3", evict=True)
    # The least recently written goes: fact 1 ("fact 0").
    assert (made_room.status, made_room.n, made_room.evicted) == ("saved", 4, 1)
    again = await memory.save(ANA, "one more", where="a DM", key="k3", evict=True)
    assert (again.status, again.n) == ("exists", 4)
    assert [f.text for f in (await memory.recall(ANA)).facts] == ["fact 1", "fact 2", "one more"]


async def test_switches_stay_with_a_clear_and_go_with_an_erase(
    memory: RedisMemory, redis: Redis
) -> None:
    await memory.save(ANA, "calls me Ana", where="a DM", key="k")
    await memory.switch(ANA, "groups", True)
    await memory.switch(ANA, "off", True)
    kept = await memory.recall(ANA)
    assert (kept.groups, kept.off) == (True, True)
    await memory.drop(ANA)
    kept = await memory.recall(ANA)
    assert (kept.groups, kept.off, kept.facts) == (True, True, ())
    await memory.switch(ANA, "off", False)
    assert not (await memory.recall(ANA)).off
    assert await memory.erase(ANA) == 0
    assert not await redis.exists(PersonKeys("telegram", "1").memory)


async def test_a_read_renews_the_retention(memory: RedisMemory, store: Store, redis: Redis) -> None:
    key = PersonKeys("telegram", "1").memory
    await memory.save(ANA, "calls me Ana", where="a DM", key="k")
    retention = store.settings.retention_ms
    assert retention - 5_000 < await redis.pttl(key) <= retention
    await redis.pexpire(key, 60_000)
    await memory.recall(ANA)
    assert await redis.pttl(key) > 60_000


async def run(runner: MemoryRunner, key: str, **arguments: Any) -> tuple[str, bool]:
    box = Toolbox(tools={TOOL.name: (TOOL, runner)})
    result = await box.run(ToolCall("c", TOOL.name, json.dumps(arguments)), key, 5, 4000, TOOL)
    return result.text, result.error


async def test_the_tool_acts_on_its_person_alone_whatever_it_is_told(memory: RedisMemory) -> None:
    runner = MemoryRunner(memory, ANA, "a group", fact_chars=20)
    # A person named in the arguments changes nothing: there is no such argument.
    said = await run(runner, "k1", action="save", fact="likes tea", user="2", person="telegram:2")
    assert said == ("saved as fact 1", False)
    assert [f.text for f in (await memory.recall(ANA)).facts] == ["likes tea"]
    assert (await memory.recall(BO)).facts == ()
    assert await run(runner, "k1", action="save", fact="likes tea") == (
        "already saved as fact 1",
        False,
    )
    assert await run(runner, "k2", action="replace", number=1, fact="likes  green\ntea") == (
        "replaced fact 1",
        False,
    )
    assert [f.text for f in (await memory.recall(ANA)).facts] == ["likes green tea"]
    for n in range(2, 4):
        await run(runner, f"k{n + 1}", action="save", fact=f"fact {n}")
    text, error = await run(runner, "k9", action="save", fact="one too many")
    assert text.startswith("not saved: the memory of this user is full") and not error
    assert await run(runner, "k10", action="delete", number=1) == ("deleted fact 1", False)
    assert await run(runner, "k11", action="delete", number=1) == (
        "there is no fact 1; nothing was deleted",
        False,
    )


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"action": "shout"}, "'action' must be"),
        ({"action": "save"}, "needs the 'fact'"),
        ({"action": "save", "fact": "   "}, "needs the 'fact'"),
        ({"action": "save", "fact": "x" * 21}, "at most 20 characters"),
        ({"action": "replace", "fact": "x"}, "needs the 'number'"),
        ({"action": "delete"}, "needs the fact's 'number'"),
        ({"action": "delete", "number": "1"}, "must be a fact's number"),
        ({"action": "delete", "number": True}, "must be a fact's number"),
        ({"action": "delete", "number": -1}, "must be a fact's number"),
    ],
)
async def test_bad_arguments_are_an_error_the_model_reads_and_write_nothing(
    memory: RedisMemory, arguments: dict[str, Any], says: str
) -> None:
    text, error = await run(MemoryRunner(memory, ANA, "a DM", fact_chars=20), "k", **arguments)
    assert error and says in text, text
    assert (await memory.recall(ANA)).facts == ()

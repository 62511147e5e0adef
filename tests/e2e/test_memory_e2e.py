"""Memory through `lastword run` (Telegram webhook, two replicas, the fake provider taught to
call the memory tool when a user says "remember …"): a fact is the person's, in every request
that answers them and in no other, kept across /reset, replicas and restarts, in groups only
once they opt in, bounded, written once (a /retry, a replica killed mid-save), never written
once the person vetoed it inside the window, and gone once they (or an admin) take it
back."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.memory.tool import NAME
from bot.store import Keys
from bot.store.keys import PersonKeys
from bot.store.replies import as_text
from tests.support.fakes.openai_server import RecordedRequest, ToolCalls
from tests.support.running import clean_environ
from tests.support.speculation_env import SPECULATION
from tests.support.waits import eventually, settled
from tests.support.world import CHAT, CONVERSATION, Bot, World

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

OTHER = 6262
GROUP = -100777
FACT = "allergic to peanuts"
GROUP_ENV = {"LASTWORD_GROUPS__ALLOWED": str(GROUP)}


def model(request: RecordedRequest) -> str | ToolCalls:
    """A model that saves what a user asks it to remember, and otherwise answers "ok"."""
    text = request.last_user_text
    if "remember that " in text and NAME in request.tool_names:
        if not request.tool_results(this_turn=True):
            fact = text.split("remember that ", 1)[1].strip()
            return ToolCalls([(NAME, json.dumps({"action": "save", "fact": fact}))])
        return "noted: " + request.tool_results(this_turn=True)[-1].text
    return "ok"


def carries(request: RecordedRequest, fact: str) -> bool:
    """Whether a request shows `fact` in its person's memory block."""
    return any(
        "<memory>" in str(m.get("content")) and fact in str(m.get("content"))
        for m in request.messages
        if m["role"] == "user"
    )


async def facts(redis: Redis, user: int) -> list[str]:
    """The facts the store keeps for a Telegram user."""
    kept = await redis.hgetall(PersonKeys("telegram", str(user)).memory)
    return sorted(json.loads(v)["text"] for k, v in kept.items() if as_text(k).startswith("f:"))


async def asked(world: World, bot: Bot, update: dict[str, Any]) -> RecordedRequest:
    """Post `update` and wait for the model's request it leads to."""
    before = len(world.provider.requests)
    await bot.post(update)

    async def request_made() -> bool:
        return len(world.provider.requests) > before

    await eventually(request_made, within_s=20)
    return world.provider.requests[-1]


async def replies(world: World, n: int) -> list[str]:
    await world.telegram.wait_for_sent(n, timeout=20)
    return [m.text or "" for m in world.telegram.sent_messages]


async def test_a_fact_reaches_only_its_person_everywhere_and_goes_when_taken_back(
    world: World,
) -> None:
    world.provider.reply = model
    tg = world.telegram
    dm = tg.private_text_update
    async with world.bot("a", **GROUP_ENV) as a, world.bot("b", **GROUP_ENV) as b:
        # Saved through one replica, by the model's tool call.
        await a.post(dm(CHAT, CHAT, f"please remember that {FACT}"))
        assert (await replies(world, 1))[-1] == "noted: saved as fact 1"
        assert await facts(world.redis, CHAT) == [FACT]
        # After a /reset, through the other replica: still there.
        await b.post(dm(CHAT, CHAT, "/reset"))
        await replies(world, 2)
        assert carries(await asked(world, b, dm(CHAT, CHAT, "hello")), FACT)
        # Another person's requests never carry it.
        assert not carries(await asked(world, a, dm(OTHER, OTHER, "hello")), FACT)
        # In a group, not until the person opts in; never for another member.
        group = tg.group_text_update
        request = await asked(world, b, group(GROUP, CHAT, "@fake_bot hi"))
        assert not carries(request, FACT)
        await a.post(dm(CHAT, CHAT, "/memory groups on"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert carries(await asked(world, a, group(GROUP, CHAT, "@fake_bot hi again")), FACT)
        request = await asked(world, b, group(GROUP, OTHER, "@fake_bot me too", first_name="Bo"))
        assert not carries(request, FACT)
        # A /retry of the reply that saved it runs nothing again: one fact.
        await a.post(dm(CHAT, CHAT, "please remember that I work nights"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert await facts(world.redis, CHAT) == ["I work nights", FACT]
        await b.post(dm(CHAT, CHAT, "/retry"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert await facts(world.redis, CHAT) == ["I work nights", FACT]
    # After a restart: still there.
    async with world.bot("c", **GROUP_ENV) as c:
        assert carries(await asked(world, c, dm(CHAT, CHAT, "hello")), FACT)
        # The person's own hand: list, forget one, clear, /forget.
        sent = len(tg.sent_messages)
        await c.post(dm(CHAT, CHAT, "/memory"))
        listing = (await replies(world, sent + 1))[-1]
        assert f"1. {FACT} (saved in a DM)" in listing, listing
        await c.post(dm(CHAT, CHAT, "/memory forget 1"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert await facts(world.redis, CHAT) == ["I work nights"]
        assert not carries(await asked(world, c, dm(CHAT, CHAT, "hi")), FACT)
        await c.post(dm(CHAT, CHAT, "/memory clear"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert await facts(world.redis, CHAT) == []
        await c.post(dm(CHAT, CHAT, f"/remember {FACT}"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert carries(await asked(world, c, dm(CHAT, CHAT, "hi")), FACT)
        for _ in range(2):  # /forget, confirmed
            await c.post(dm(CHAT, CHAT, "/forget"))
            await settled(world.redis, CONVERSATION, within_s=20)
        assert not await world.redis.exists(PersonKeys("telegram", str(CHAT)).memory)
        assert not carries(await asked(world, c, dm(CHAT, CHAT, "hi")), FACT)
        # An admin's erasure, from the command line.
        await c.post(dm(CHAT, CHAT, f"/remember {FACT}"))
        await settled(world.redis, CONVERSATION, within_s=20)
        assert await facts(world.redis, CHAT) == [FACT]
        said = await forget_user(world, "telegram", str(CHAT))
        assert f"erased telegram user {CHAT}" in said and "1 fact" in said, said
        assert await facts(world.redis, CHAT) == []
        assert not carries(await asked(world, c, dm(CHAT, CHAT, "hi")), FACT)


async def test_the_bound_holds_at_one_past_it(world: World) -> None:
    world.provider.reply = model
    dm = world.telegram.private_text_update
    async with world.bot("a", LASTWORD_MEMORY__FACTS="3") as a:
        for n in range(4):
            await a.post(dm(CHAT, CHAT, f"/remember fact {n}"))
            await settled(world.redis, CONVERSATION, version=n + 1, within_s=20)
        # /remember makes room: the least recently written goes.
        assert await facts(world.redis, CHAT) == ["fact 1", "fact 2", "fact 3"]
        # The model is told the memory is full, and nothing is saved.
        await a.post(dm(CHAT, CHAT, "please remember that one more"))
        await settled(world.redis, CONVERSATION, version=5, within_s=20)
        told = world.telegram.sent_messages[-1].text or ""
        assert told.startswith("noted: not saved: the memory"), told
        assert await facts(world.redis, CHAT) == ["fact 1", "fact 2", "fact 3"]


async def forget_user(world: World, platform: str, user: str) -> str:
    env = clean_environ() | {"LASTWORD_REDIS_URL": world.server.url}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "forget-user",
        platform,
        user,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, out.decode()
    return out.decode()


async def test_a_save_vetoed_inside_the_window_writes_nothing(world: World) -> None:
    def vetoed(request: RecordedRequest) -> str | ToolCalls:
        if "DON'T" in request.last_user_text:
            return "OK, I won't."
        return model(request)

    world.provider.reply = vetoed
    dm = world.telegram.private_text_update
    async with world.bot("a", **SPECULATION) as a, world.bot("b", **SPECULATION) as b:
        await a.post(dm(CHAT, CHAT, f"please remember that {FACT}"))
        # The speculative generation asked for the save; the window is still open, so it is
        # held. The person writes again, inside the window, through the other replica.
        await recorded_step(world)
        await b.post(dm(CHAT, CHAT, "wait, DON'T remember that"))
        await settled(world.redis, CONVERSATION, version=2, within_s=20)
    assert await facts(world.redis, CHAT) == []
    assert [m.text for m in world.telegram.sent_messages] == ["OK, I won't."]


async def test_a_replica_killed_mid_save_leaves_one_fact_at_most(world: World) -> None:
    world.provider.reply = model
    dm = world.telegram.private_text_update
    # `a` alone takes the burst in, so the save is surely its own; `b` starts once `a` is dead.
    async with world.bot("a", LASTWORD_LEASE__TTL_MS="1500") as a:
        await a.post(dm(CHAT, CHAT, f"please remember that {FACT}"))
        await recorded_step(world)
        await a.running.kill()
    async with world.bot("b", LASTWORD_LEASE__TTL_MS="1500") as b:
        await settled(world.redis, CONVERSATION, version=1, within_s=20)
        # Written before the kill, or never (its outcome unknown, so not made again): once.
        assert len(await facts(world.redis, CHAT)) <= 1
        await b.post(dm(CHAT, CHAT, "/retry"))
        await settled(world.redis, CONVERSATION, version=2, within_s=20)
    assert len(await facts(world.redis, CHAT)) <= 1
    assert len(world.telegram.sent_messages) == 2


async def recorded_step(world: World) -> None:
    """Wait until a generation has recorded a tool step."""

    async def recorded() -> bool:
        fields = await world.redis.hkeys(Keys(CONVERSATION).tools)
        return any(as_text(field).startswith("s:") for field in fields)

    await eventually(recorded, 10, what="a recorded tool step")

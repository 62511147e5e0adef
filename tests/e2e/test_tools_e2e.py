"""Tools through `lastword run` (Telegram webhook, the OpenAI client on the fake provider taught
to call tools, a real server, real MCP servers over stdio): a tool with side effects runs
exactly once per call the model asked for, whatever the user and the fleet do meanwhile.

- mcp-server-time, a server nobody here wrote, answers a user who asks for the time;
- an interrupt storm (a message every 300 ms while the tool runs), with the messages spread
  over two replicas: the tool's side effect happens once, the newer messages are folded into
  the turn, and one reply covers everything;
- `kill -9` of the replica mid-call: a replica started after it takes over, never runs the call
  and the model is told its outcome is unknown;
- the step limit ends a model that would call tools for ever with one text reply;
- a call with side effects held while the window is open never runs once the user, through
  the other replica, writes "don't" inside the window.
The side effect is a line the test MCP server (tests/support/fakes/mcp_append_server.py) appends to
a file: the file counts the times the tool really ran.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.core.steps import NOT_RUN
from bot.store import Keys
from bot.store.replies import as_text
from tests.support.drafts import FAST_DRAFTS, FIXED_WINDOW, draft_text, drafts
from tests.support.fakes.openai_server import RecordedRequest, ToolCalls, ToolPolicy
from tests.support.mcp_runs import append_server, appended, lines, servers
from tests.support.speculation_env import SPECULATION
from tests.support.waits import eventually, settled
from tests.support.world import CHAT, CONVERSATION, World

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

# Storm messages, 300 ms apart, while the tool runs.
STORM = 5
STORM_GAP_S = 0.3
TOOL_S = 2.0
# The call the test kills its replica in the middle of.
KILLED_TOOL_S = 30.0


def append_calls(request: RecordedRequest) -> list[str]:
    return [json.dumps({"text": "booked", "delay_s": TOOL_S})]


async def test_mcp_server_time_answers_a_user_who_asks_the_time(world: World) -> None:
    world.provider.reply = ToolPolicy(
        "get_current_time", '{"timezone": "UTC"}', answer="It is {result}"
    )
    time_server = {"command": sys.executable, "args": ["-m", "mcp_server_time"]}
    async with world.bot("a", **servers(time=time_server)) as bot:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "what time is it?"))
        reply = await world.one_reply()
    assert reply.startswith("It is "), reply
    said = json.loads(reply.removeprefix("It is "))
    # The server's own answer: the time now, in the zone asked for.
    assert said["timezone"] == "UTC", said
    assert abs(datetime.fromisoformat(said["datetime"]) - datetime.now(UTC)) < timedelta(minutes=1)
    asked, answered = world.provider.requests
    assert "get_current_time" in asked.tool_names and not asked.tool_calls(this_turn=True)
    assert [c.name for c in answered.tool_calls(this_turn=True)] == ["get_current_time"]


async def test_an_interrupt_storm_over_two_replicas_runs_the_side_effect_once(
    world: World, short_dir: Path
) -> None:
    effects = short_dir / "effects.txt"
    world.provider.reply = ToolPolicy("append", append_calls, answer="Done: {result}")
    config = servers(booking=append_server(effects))
    async with world.bot("a", **config) as a, world.bot("b", **config) as b:
        await a.post(world.telegram.private_text_update(CHAT, CHAT, "book a table"))
        await appended(effects, 1)
        # The tool is running: the user writes on, through either replica, every 300 ms.
        for n in range(STORM):
            bot = (b, a)[n % 2]
            await bot.post(world.telegram.private_text_update(CHAT, CHAT, f"also {n}"))
            await asyncio.sleep(STORM_GAP_S)
        await settled(world.redis, CONVERSATION, version=1 + STORM, within_s=30)
    [line] = lines(effects)
    # Its idempotency key: the conversation, the record's random id, the step, the call.
    assert re.fullmatch(f"booked\t{CONVERSATION}:[0-9a-f]{{16}}:0:0", line), line
    [reply] = world.telegram.sent_messages
    assert reply.text == "Done: appended booked", reply.text
    # Every newer message was folded into the turn the reply answered.
    last = world.provider.requests[-1]
    assert all(f"also {n}" in last.last_user_text for n in range(STORM)), last.last_user_text


async def test_a_replica_killed_mid_call_is_not_run_again_and_the_model_hears_unknown(
    world: World, short_dir: Path
) -> None:
    effects = short_dir / "effects.txt"
    world.provider.reply = ToolPolicy(
        "append",
        # Long enough that the kill lands mid-call however loaded the machine is.
        lambda _: [json.dumps({"text": "booked", "delay_s": KILLED_TOOL_S})],
        answer="Outcome: {result}",
    )
    config = servers(booking=append_server(effects)) | {"LASTWORD_LEASE__TTL_MS": "1500"}
    # `a` alone takes the burst in, so the call is surely its own; `b` starts once `a` is dead.
    async with world.bot("a", **config) as a:
        await a.post(world.telegram.private_text_update(CHAT, CHAT, "book a table"))
        await appended(effects, 1)
        await a.running.kill()
    async with world.bot("b", **config) as b:
        await settled(world.redis, CONVERSATION, version=1, within_s=20)
        assert b.running.said("outcome is unknown")
    assert len(lines(effects)) == 1, "the call ran again after the kill"
    [reply] = world.telegram.sent_messages
    assert reply.text is not None and reply.text.startswith("Outcome: error: the outcome")


async def test_the_step_limit_ends_a_model_that_calls_tools_for_ever(
    world: World, short_dir: Path
) -> None:
    effects = short_dir / "effects.txt"
    world.provider.reply = ToolPolicy(
        "read_only_echo", '{"text": "again"}', steps=100, answer="Gave up after {results}"
    )
    config = servers(echo=append_server(effects)) | {"LASTWORD_TOOLS__STEP_LIMIT": "2"}
    async with world.bot("a", **config) as bot:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "loop"))
        reply = await world.one_reply()
    steps = [r for r in world.provider.requests if r.tool_calls(this_turn=True) or r.tools]
    # Two steps that called the tool, then one that could not: text.
    assert [r.tool_choice for r in steps] == ["auto", "auto", "none"]
    assert reply == "Gave up after again\nagain", reply


async def test_the_draft_says_which_tool_is_running(world: World, short_dir: Path) -> None:
    world.provider.reply = ToolPolicy("slow", '{"seconds": 1.5}', answer="Waited: {result}")
    config = servers(waiting=append_server(short_dir / "effects.txt")) | FAST_DRAFTS | FIXED_WINDOW
    async with world.bot("a", **config) as bot:
        await bot.post(world.telegram.private_text_update(CHAT, CHAT, "take your time"))
        reply = await world.one_reply()
    assert reply == "Waited: slept 1.5 s"
    assert "Slow…" in [draft_text(call) for call in drafts(world.telegram)]


async def test_a_call_held_in_the_window_never_runs_after_the_user_says_not_to(
    world: World, short_dir: Path
) -> None:
    effects = short_dir / "effects.txt"
    sends = ToolPolicy("append", '{"text": "email to bob"}', answer="Sent: {result}")

    def model(request: RecordedRequest) -> str | ToolCalls:
        if "DON'T" in request.last_user_text:
            return "OK, I will not send it."
        return sends(request)

    world.provider.reply = model
    config = servers(mail=append_server(effects)) | SPECULATION
    async with world.bot("a", **config) as a, world.bot("b", **config) as b:
        await a.post(world.telegram.private_text_update(CHAT, CHAT, "email bob the report"))
        # The speculative generation asked for the call; the window is still open, so it is
        # held. The user writes again, inside the window, through the other replica.
        await recorded_step(world)
        await b.post(world.telegram.private_text_update(CHAT, CHAT, "wait, DON'T send it"))
        await settled(world.redis, CONVERSATION, version=2, within_s=20)
    assert lines(effects) == [], "the held call ran after the user said not to"
    [reply] = world.telegram.sent_messages
    assert reply.text == "OK, I will not send it."
    # The model heard why the call it had asked for never ran.
    last = world.provider.requests[-1]
    assert [r.text for r in last.tool_results(this_turn=True)] == [NOT_RUN]


async def recorded_step(world: World) -> None:
    """Wait until a generation has recorded a tool step."""

    async def recorded() -> bool:
        fields = await world.redis.hkeys(Keys(CONVERSATION).tools)
        return any(as_text(field).startswith("s:") for field in fields)

    await eventually(recorded, 10, what="a recorded tool step")

"""Tools in a cycle, on a real server with the OpenAI client on the fake provider, the tools
Python functions: who is offered what (/tools, admin-only tools), a tool that fails or is not
offered becomes an error the model reads (never a failed reply), and the calls of a reply join
the history, so a follow-up question can use them. The processes' side (MCP servers, storms,
kills, replicas) is in test_tools_e2e.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from bot.core.steps import MAX_CALLS_PER_STEP, NOT_RUN, OUT_OF_TIME
from bot.store import Keys
from bot.tools.python import PythonRunner, PythonTool
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica, say
from tests.support.counted_tools import SLOW_S, TEXT, Counted
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, RecordedRequest, ToolCalls, ToolPolicy
from tests.support.waits import eventually, settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)

ADMIN = "admin-1"


async def test_tools_lists_what_each_user_is_offered(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    runtime, outbound = await runtime_factory(access={"admins": [ADMIN]}, toolbox=counted.toolbox())
    assert await runtime.ingest(message("/tools", n=1, user="user-1"))
    assert await runtime.ingest(message("/tools", n=2, user=ADMIN, conversation="test:2"))
    await settled(runtime, CONV)
    await settled(runtime, "test:2")
    [user], [admin] = outbound.texts(CONV), outbound.texts("test:2")
    assert "echo: Say the text back. (only looks things up)" in user
    assert "book" not in user
    assert "book: Book a table. (changes things, admins only)" in admin
    assert counted.runs == []


async def test_a_tool_the_user_is_not_offered_never_runs(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    # A model that calls the admin-only tool whatever it was offered.
    fake.answer_next(ToolCalls([("book", '{"text": "for two"}')]))
    fake.reply = ToolPolicy("never", answer="", otherwise=lambda r: last_result(r))
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "book a table")
    assert counted.runs == []
    [reply] = outbound.texts(CONV)
    assert reply == "error: there is no tool named 'book' available to this user"
    assert "book" not in fake.requests[0].tool_names


async def test_a_failing_tool_is_an_error_the_model_reads_and_the_reply_still_comes(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    fake.reply = ToolPolicy("broken", '{"text": "x"}', answer="Sorry: {result}")
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "try it")
    assert counted.runs == ["broken x"]
    [reply] = outbound.texts(CONV)
    assert reply == "Sorry: error: the tool failed: ValueError: the database is on fire"


async def test_a_replys_calls_join_the_history_for_the_next_question(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    fake.reply = ToolPolicy("echo", '{"text": "42"}', answer="It said {result}")
    runtime, _ = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "ask the tool")
    fake.reply = lambda request: "no tool this time"
    await say(runtime, 2, "what did it say?")
    assert counted.runs == ["echo 42"]
    # The calls come back as the tool's data, not as the bot's own words.
    _, asked, called, result, said, question = fake.requests[-1].messages
    assert (asked["role"], said, question["role"]) == (
        "user",
        {"role": "assistant", "content": "It said echo: 42"},
        "user",
    )
    [call] = called["tool_calls"]
    assert call["function"] == {"name": "echo", "arguments": '{"text": "42"}'}
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": "echo: 42"}


def last_result(request: Any) -> str:
    results = request.tool_results(this_turn=True)
    return results[-1].text if results else "no result"


async def test_a_step_runs_at_most_sixteen_calls(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    many = [json.dumps({"text": str(i)}) for i in range(MAX_CALLS_PER_STEP + 4)]
    fake.reply = ToolPolicy("echo", many, answer="{results}")
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "many")
    assert counted.runs == [f"echo {i}" for i in range(MAX_CALLS_PER_STEP)]
    _, answered = fake.requests
    assert len(answered.tool_calls(this_turn=True)) == MAX_CALLS_PER_STEP
    [reply] = outbound.texts(CONV)
    assert reply.splitlines() == [f"echo: {i}" for i in range(MAX_CALLS_PER_STEP)]


async def test_a_replys_tools_end_by_the_llm_deadline_and_the_model_answers_with_what_it_has(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    letters = [json.dumps({"text": c}) for c in "abcd"]
    fake.reply = ToolPolicy("slow", letters, steps=10, answer="{results}")
    runtime, outbound = await replica(
        runtime_factory, fake, toolbox=counted.toolbox(), deadline_s=2.0
    )
    began = time.monotonic()
    await say(runtime, 1, "take your time")
    # a and b take 1.6 s; c starts with 0.4 s left and gets its 1 s minimum; d is not run.
    assert counted.runs == ["slow a", "slow b", "slow c"]
    assert time.monotonic() - began < 2.0 + 2 * SLOW_S
    _, answered = fake.requests
    assert answered.tool_choice == "none", "asked for more tools past the deadline"
    [reply] = outbound.texts(CONV)
    assert reply.splitlines() == ["slow: a", "slow: b", "slow: c", OUT_OF_TIME]


async def test_retry_after_reset_and_retry_storms_reuse_the_turns_calls(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    fake.reply = ToolPolicy("note", '{"text": "x"}', answer="Done: {result}")
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    # The burst begins with /reset: the reply's turn is the /reset's version, not its first
    # answered message's.
    await say(runtime, 1, "/reset", "note it down")
    for n in range(3, 6):
        await say(runtime, n, "/retry")
    assert counted.runs == ["note x"], "a /retry ran the side effect again"
    assert outbound.texts(CONV)[-1] == "Done: noted"
    assert runtime.stats.tool_calls_reused == 3


async def test_a_call_never_starts_once_its_lease_has_moved(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, redis: Redis
) -> None:
    counted = Counted()

    async def steal(text: str) -> str:
        """Looks something up while another replica takes the lease (as after a pause)."""
        await redis.hset(Keys(CONV).lease, "token", "another-replica")
        return "looked"

    box = counted.toolbox()
    thief = PythonTool(function=steal, parameters=TEXT, side_effects=False)
    box.offer([[*box.tools.values(), (thief.tool("python:test"), PythonRunner(thief))]])
    fake.reply = lambda r: ToolCalls([("steal", '{"text": "a"}'), ("note", '{"text": "b"}')])
    runtime, outbound = await replica(runtime_factory, fake, toolbox=box)
    assert await runtime.ingest(message("look it up, then note it", n=1))

    async def lost() -> bool:
        return runtime.stats.lost >= 1

    await eventually(lost, 10, what="the cycle losing its lease")
    assert counted.runs == [], "the side effect ran without the lease"
    assert outbound.texts(CONV) == []


async def test_a_mangled_tool_name_is_an_error_the_model_reads(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    fake.answer_next(ToolCalls([("functions.echo", '{"text": "x"}')]))
    fake.reply = lambda request: f"Sorry: {last_result(request)}"
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "echo x")
    assert counted.runs == []
    [reply] = outbound.texts(CONV)
    assert reply == "Sorry: error: there is no tool named 'functions.echo' available to this user"
    called = fake.requests[-1].tool_calls(this_turn=True)
    assert [c.name for c in called] == ["functions_echo"], "echoed back as the provider takes it"


async def test_a_steps_results_are_cut_to_fit_the_context(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    # Sixteen results of 4,000 characters would need about 16,000 tokens on their own.
    many = [json.dumps({"text": f"{i % 10}"}) for i in range(MAX_CALLS_PER_STEP)]
    fake.context_tokens = 16_000
    fake.reply = ToolPolicy("big", many, answer="Read them all.")
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    await say(runtime, 1, "many big ones")
    assert fake.rejected == [], "a request went over the context"
    assert len(counted.runs) == MAX_CALLS_PER_STEP
    assert outbound.texts(CONV) == ["Read them all."]
    results = fake.requests[-1].tool_results(this_turn=True)
    assert len(results) == MAX_CALLS_PER_STEP
    assert all("cut to fit the context" in r.text for r in results)


async def test_a_stop_while_a_steps_first_call_runs_starts_none_of_the_rest(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI
) -> None:
    counted = Counted()
    step = ToolCalls(
        [("slow", '{"text": "a"}'), ("note", '{"text": "b"}'), ("note", '{"text": "c"}')]
    )

    def model(request: RecordedRequest) -> str | ToolCalls:
        if "stop" in request.last_user_text:
            return f"Stopped: {[r.text for r in request.tool_results(this_turn=True)]}"
        return step

    fake.reply = model
    runtime, outbound = await replica(runtime_factory, fake, toolbox=counted.toolbox())
    assert await runtime.ingest(message("look it up, then note it twice", n=1))

    async def slow_running() -> bool:
        return counted.runs == ["slow a"]

    await eventually(slow_running, 10, what="the first call running")
    assert await runtime.ingest(message("stop", n=2))
    await settled(runtime, CONV)
    assert counted.runs == ["slow a"], "a call started after the user said stop"
    [reply] = outbound.texts(CONV)
    assert reply == f"Stopped: {['slow: a', NOT_RUN, NOT_RUN]}"

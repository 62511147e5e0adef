"""Tool calls through the model client: the real `openai` client's HTTP layer and `OpenAILLM`
against the loopback fake provider, which streams `tool_calls` as OpenAI does (or as the
scripted shapes of other servers). What comes back is an `Answer` whose calls are whole,
in order and within bounds; what goes out carries the tools, the choice and the steps."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from bot.llm.base import Answer, LLMError, Usage, generate
from bot.llm.openai import OpenAILLM
from bot.llm.prompt import Prompt
from bot.llm.wire import MAX_ARGUMENT_BYTES, MAX_CALLS
from bot.tools import Tool, ToolCall
from tests.support.chatting import fake
from tests.support.fakes.openai_server import FakeOpenAI, RawReply, ToolCalls, ToolPolicy
from tests.support.provider import llm_settings

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(60)

chunk = RawReply.chunk

CLOCK = Tool(
    "get_current_time",
    "The current time in a timezone.",
    {"type": "object", "properties": {"timezone": {"type": "string"}}},
    side_effects=False,
)
NOTE = Tool(
    "append_note",
    "Append a line to the notes.",
    {"type": "object", "properties": {"line": {"type": "string"}}},
    side_effects=True,
)
UTC = '{"timezone": "UTC"}'


def asking(*unanswered: str, **fields: Any) -> Prompt:
    """A prompt offering both tools unless `tools` says otherwise."""
    fields.setdefault("tools", (CLOCK.spec(), NOTE.spec()))
    fields.setdefault("tool_choice", "auto")
    return Prompt("Be brief.", (), unanswered or ("what time is it?",), **fields)


class Client:
    """One `OpenAILLM`, closed at the end of the test; what it showed as drafts."""

    def __init__(self, fake: FakeOpenAI, **overrides: Any) -> None:
        self.settings = llm_settings(fake, **overrides)
        self.llm = OpenAILLM(self.settings)
        self.drafts: list[str] = []
        self.usage = Usage(on_text=self.drafts.append)

    async def complete(self, prompt: Prompt) -> Answer:
        return await self.llm.complete(prompt, self.usage)

    async def refused(self, prompt: Prompt) -> LLMError:
        with pytest.raises(LLMError) as caught:
            await self.complete(prompt)
        assert caught.value.kind == "transient"
        return caught.value


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[Client]:
    made = Client(fake)
    yield made
    await made.llm.close()


@pytest.fixture
async def plain(fake: FakeOpenAI) -> AsyncIterator[Client]:
    made = Client(fake, stream=False)
    yield made
    await made.llm.close()


def step(answer: Answer, *results: str) -> tuple[dict[str, Any], ...]:
    """The prompt's steps after `answer`: its calls, then a result for each."""
    asked: dict[str, Any] = {"role": "assistant", "content": answer.text or None}
    asked["tool_calls"] = [call.message() for call in answer.calls]
    told = [
        {"role": "tool", "tool_call_id": call.id, "content": result}
        for call, result in zip(answer.calls, results, strict=True)
    ]
    return (asked, *told)


# -- calls as OpenAI streams them -------------------------------------------------------------


async def test_a_streamed_call_is_assembled_and_the_request_offers_the_tools(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.answer_next(ToolCalls([("get_current_time", UTC)], ids=["call_a1"]))
    answer = await client.complete(asking())
    assert answer == Answer("", (ToolCall("call_a1", "get_current_time", UTC),))
    [request] = fake.requests
    assert request.tools == [CLOCK.spec(), NOTE.spec()] and request.tool_choice == "auto"
    assert request.tool_names == ["get_current_time", "append_note"]
    # The arguments came in pieces, each a chunk the provider generated.
    assert request.pieces_streamed == 1 + math.ceil(len(UTC) / 4)
    # No text, no draft: what the draft says while tools run is the cycle's business.
    assert client.drafts == []
    [attempt] = client.usage.attempts
    assert attempt.reported and attempt.completion_tokens > 0


async def test_tool_call_chunks_count_as_tokens_when_usage_is_not_reported(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.refuse_stream_options = True
    fake.answer_next(ToolCalls([("get_current_time", UTC)]), ToolCalls([], text="one two"))
    await client.complete(asking())
    await client.complete(asking())
    calls, text = client.usage.attempts
    assert not calls.reported and calls.completion_tokens == fake.requests[0].pieces_streamed
    assert not text.reported and text.completion_tokens == fake.requests[1].pieces_streamed == 2


@pytest.mark.parametrize("interleave", [False, True], ids=["in-turn", "interleaved"])
async def test_several_calls_in_one_step_come_whole_and_in_order(
    fake: FakeOpenAI, client: Client, interleave: bool
) -> None:
    calls = [
        ("append_note", json.dumps({"line": "first, a longer line " * 3})),
        ("get_current_time", UTC),
        ("append_note", json.dumps({"line": "ünïcødé 🙂 third"}, ensure_ascii=False)),
    ]
    ids = ["call_x", "call_y", "call_z"]
    fake.answer_next(ToolCalls(calls, ids=ids, interleave=interleave, piece_chars=3))
    answer = await client.complete(asking())
    assert answer.calls == tuple(
        ToolCall(call_id, name, arguments)
        for call_id, (name, arguments) in zip(ids, calls, strict=True)
    )
    assert answer.text == ""


async def test_text_before_the_calls_is_the_answers_text_and_the_draft(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.answer_next(ToolCalls([("get_current_time", UTC)], text="Let me look.", ids=["c1"]))
    answer = await client.complete(asking())
    assert answer == Answer("Let me look.", (ToolCall("c1", "get_current_time", UTC),))
    assert client.drafts == ["Let ", "Let me ", "Let me look."]


async def test_calls_not_streamed_come_from_the_message(fake: FakeOpenAI, plain: Client) -> None:
    calls = [("get_current_time", UTC), ("append_note", '{"line": "x"}')]
    fake.answer_next(ToolCalls(calls, ids=["c1", "c2"]), ToolCalls(calls[:1], text="Looking."))
    answer = await plain.complete(asking())
    assert answer == Answer("", (ToolCall("c1", *calls[0]), ToolCall("c2", *calls[1])))
    with_text = await plain.complete(asking())
    assert with_text.text == "Looking." and [c.name for c in with_text.calls] == [calls[0][0]]
    assert [r.stream for r in fake.requests] == [False, False]
    [attempt, _] = plain.usage.attempts
    assert attempt.reported and attempt.completion_tokens == ToolCalls(calls).tokens()


# -- the loop: call, result, text -------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_the_text_after_a_tool_result_answers_with_it(fake: FakeOpenAI, stream: bool) -> None:
    fake.reply = ToolPolicy("get_current_time", UTC, answer="It is {result}.")
    chosen = llm_settings(fake, stream=stream)
    llm = OpenAILLM(chosen)
    try:
        first = await generate(llm, asking(), chosen, Usage())
        [call] = first.calls
        assert (call.name, call.arguments, first.text) == ("get_current_time", UTC, "")
        then = asking(steps=step(first, "12:00 UTC"))
        answer = await generate(llm, then, chosen, Usage())
    finally:
        await llm.close()
    assert answer == Answer("It is 12:00 UTC.")
    asked, told = fake.requests
    # The steps went out after the user turn, as the fake checked OpenAI would want them.
    assert told.messages == then.messages() and told.messages[-3]["role"] == "user"
    assert [r.text for r in told.tool_results()] == ["12:00 UTC"]
    assert told.tool_calls(this_turn=True)[0].id == call.id
    # Billed: the step's call and result are part of the second prompt.
    assert told.prompt_tokens > asked.prompt_tokens


async def test_tool_choice_none_goes_out_and_no_tools_none_at_all(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.reply = ToolPolicy("get_current_time", UTC)
    answer = await client.complete(asking(tool_choice="none"))
    assert answer == Answer("You said: what time is it?") and not answer.calls
    await client.complete(asking(tools=(), tool_choice=None))
    offered, bare = fake.requests
    assert offered.body["tool_choice"] == "none" and offered.tool_names == [CLOCK.name, NOTE.name]
    assert "tools" not in bare.body and "tool_choice" not in bare.body


async def test_reasoning_is_stripped_from_the_text_beside_calls(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.answer_next(ToolCalls([("get_current_time", UTC)], text="<think>hmm</think>"))
    answer = await generate(client.llm, asking(), client.settings, Usage())
    assert answer.text == "" and [c.name for c in answer.calls] == ["get_current_time"]
    # All reasoning and no call is still no answer: asked again.
    fake.answer_next(RawReply.events(chunk({"content": "<think>only this</think>"})))
    again = await generate(client.llm, asking(), client.settings, Usage())
    assert again == Answer("You said: what time is it?") and len(fake.requests) == 3


# -- shapes of other servers ------------------------------------------------------------------


def call_piece(**fields: Any) -> dict[str, Any]:
    return chunk({"tool_calls": [fields]})


async def test_calls_without_ids_get_stable_ones(fake: FakeOpenAI, client: Client) -> None:
    stream = RawReply.events(
        call_piece(index=0, function={"name": "get_current_time", "arguments": ""}),
        call_piece(index=0, function={"arguments": UTC}),
        call_piece(index=1, id="", function={"name": "append_note", "arguments": "{}"}),
        chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
    )
    fake.answer_next(stream, stream)
    first, again = await client.complete(asking()), await client.complete(asking())
    assert [c.id for c in first.calls] == ["call_0", "call_1"] and first == again


async def test_calls_with_stop_pieces_in_one_delta_and_arguments_as_objects(
    fake: FakeOpenAI, client: Client
) -> None:
    both = {
        "tool_calls": [
            {"index": 1, "id": "b", "function": {"name": "append_note", "arguments": ""}},
            {"index": 0, "id": "a", "function": {"name": "get_current_time", "arguments": ""}},
        ]
    }
    stream = RawReply.events(
        chunk(both),
        call_piece(index=1, function={"arguments": {"line": "x"}}),
        call_piece(index=0, function={"arguments": '{"timezone"'}),
        call_piece(index=0, function={"arguments": ': "UTC"}'}),
        chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
    )
    fake.answer_next(stream)
    answer = await client.complete(asking())
    assert answer.calls == (
        ToolCall("a", "get_current_time", UTC),
        ToolCall("b", "append_note", '{"line": "x"}'),
    )


async def test_calls_sent_whole_without_an_index_are_told_apart_by_their_ids(
    fake: FakeOpenAI, client: Client
) -> None:
    def whole(call_id: str, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    stream = RawReply.events(
        chunk({"tool_calls": [whole("a", "append_note", '{"line": ')]}),
        # The id again with the rest of the same call, as some servers repeat it.
        chunk({"tool_calls": [whole("a", "append_note", '"one"}')]}),
        chunk({"tool_calls": [whole("b", "append_note", '{"line": "two"}')]}),
        chunk({"tool_calls": [{"function": {"arguments": ""}}]}),
    )
    fake.answer_next(stream)
    answer = await client.complete(asking())
    assert answer.calls == (
        ToolCall("a", "append_note", '{"line": "one"}'),
        ToolCall("b", "append_note", '{"line": "two"}'),
    )


async def test_a_call_with_no_arguments_and_ids_taken_twice(
    fake: FakeOpenAI, client: Client
) -> None:
    stream = RawReply.events(
        call_piece(index=0, id="same", function={"name": "get_current_time"}),
        call_piece(index=1, id="same", function={"name": "get_current_time", "arguments": " "}),
    )
    fake.answer_next(stream)
    answer = await client.complete(asking())
    assert answer.calls == (
        ToolCall("same", "get_current_time", "{}"),
        ToolCall("call_1", "get_current_time", "{}"),
    )


NAMES = st.text("abcxyz_-0123456789", min_size=1, max_size=64)
ARGUMENTS = st.text(max_size=300).map(lambda line: json.dumps({"line": line}, ensure_ascii=False))


@examples(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    calls=st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=6),
    text=st.text(max_size=20),
    piece_chars=st.integers(1, 40),
    interleave=st.booleans(),
    stream=st.booleans(),
)
async def test_any_calls_however_split_come_back_as_sent(
    fake: FakeOpenAI,
    calls: list[tuple[str, str]],
    text: str,
    piece_chars: int,
    interleave: bool,
    stream: bool,
) -> None:
    fake.raw_replies.clear()
    ids = [f"id{n}" for n in range(len(calls))]
    fake.answer_next(ToolCalls(calls, text, ids, interleave, piece_chars=piece_chars))
    client = Client(fake, stream=stream)
    try:
        answer = await client.complete(asking())
    finally:
        await client.llm.close()
    assert answer.calls == tuple(ToolCall(i, *call) for i, call in zip(ids, calls, strict=True))
    assert answer.text == text


# -- bounds -----------------------------------------------------------------------------------


async def test_at_most_max_calls_in_one_step(fake: FakeOpenAI, client: Client) -> None:
    calls = [("get_current_time", UTC)] * MAX_CALLS
    fake.answer_next(ToolCalls(calls), ToolCalls([*calls, ("append_note", "{}")]))
    assert len((await client.complete(asking())).calls) == MAX_CALLS
    error = await client.refused(asking())
    assert f"over {MAX_CALLS} tool calls" in str(error)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_arguments_longer_than_the_bound_are_refused(fake: FakeOpenAI, stream: bool) -> None:
    wrapper = '{"line": ""}'
    fits = json.dumps(
        {"line": "é" * ((MAX_ARGUMENT_BYTES - len(wrapper)) // 2)}, ensure_ascii=False
    )
    too_long = json.dumps({"line": "x" * (MAX_ARGUMENT_BYTES - len(wrapper) + 1)})
    assert len(fits.encode()) == MAX_ARGUMENT_BYTES == len(too_long.encode()) - 1
    fake.answer_next(
        ToolCalls([("append_note", fits)], piece_chars=4096),
        ToolCalls([("append_note", too_long)], piece_chars=4096),
    )
    client = Client(fake, stream=stream)
    try:
        [call] = (await client.complete(asking())).calls
        assert call.arguments == fits
        error = await client.refused(asking())
    finally:
        await client.llm.close()
    assert "arguments over 64 KiB" in str(error)


@pytest.mark.parametrize(
    ("name", "echoed"),
    [
        ("get time", "get_time"),
        ("functions.get_time", "functions_get_time"),
        ("x" * 65, "x" * 64),
        ("naïve", "na_ve"),
        ("get_current_time\n", "get_current_time_"),
    ],
    ids=["space", "prefixed", "too-long", "not-ascii", "newline"],
)
async def test_a_call_with_a_mangled_name_is_kept_for_the_toolbox_to_refuse(
    fake: FakeOpenAI, client: Client, name: str, echoed: str
) -> None:
    stream = RawReply.events(
        call_piece(index=0, id="c", function={"name": "get_current_time", "arguments": UTC}),
        call_piece(index=1, id="d", function={"name": name, "arguments": "{}"}),
    )
    fake.answer_next(stream)
    _, mangled = (await client.complete(asking())).calls
    # As written, so no tool matches it by accident; echoed back as the provider takes it.
    assert mangled.name == name
    assert mangled.message()["function"]["name"] == echoed


async def test_a_call_with_an_empty_name_is_refused(fake: FakeOpenAI, client: Client) -> None:
    stream = RawReply.events(
        call_piece(index=0, id="c", function={"name": "", "arguments": "{}"}),
    )
    fake.answer_next(stream)
    assert "without a name" in str(await client.refused(asking()))


async def test_a_call_without_a_name_is_refused_and_retried(
    fake: FakeOpenAI, client: Client
) -> None:
    fake.answer_next(
        RawReply.events(call_piece(index=0, id="c", function={"arguments": UTC})),
        ToolCalls([("get_current_time", UTC)]),
    )
    answer = await generate(client.llm, asking(), client.settings, Usage())
    assert [c.name for c in answer.calls] == ["get_current_time"] and len(fake.requests) == 2


# -- cancellation -----------------------------------------------------------------------------


async def test_a_cancelled_tool_call_stream_closes_the_connection(
    fake: FakeOpenAI, client: Client
) -> None:
    # Spread over the chunks: the stream is still going when the generation is cut.
    fake.delay_s = 5.0
    fake.answer_next(ToolCalls([("append_note", json.dumps({"line": "x" * 200}))]))
    generation = asyncio.create_task(client.complete(asking()))
    started = await fake.wait_for_request(lambda r: r.pieces_streamed >= 2, timeout=5)
    assert not generation.done()
    generation.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await generation
    await fake.wait_for_request(lambda r: r is started and r.cancelled, timeout=2)
    assert not started.finished

"""A model or provider that refuses tools still answers: a runtime with Python tools, on the
test's real store, talking through the real OpenAI client to a loopback fake provider that
refuses any request offering tools (400 "does not support tools", as Ollama's small models
answer), or one tool's schema (a `"format": "date-time"`). The reply is the model's answer,
never the apology; the refusal is learnt once per model (one WARNING, one refused request),
not once per burst; a refused tool is left out for everyone, the other tools still offered.
How providers word such refusals, and what the replica remembers, is at the end."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from bot.core.cycle import APOLOGY
from bot.llm.base import LLMError, Usage
from bot.llm.openai import MAX_TOOL_REFUSALS, OpenAILLM
from bot.llm.prompt import Prompt
from bot.llm.tool_refusals import MAX_MODELS, NO_TOOLS_FIX, TOOL_FIX, Refusal, Refusals, refusal
from bot.tools import Toolbox
from bot.tools.python import PythonRunner, PythonTool
from tests.support.builders import message
from tests.support.chatting import CONV, fake, replica, say
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FAKE_MODEL_ID, FakeOpenAI, ScriptedError
from tests.support.provider import llm_settings
from tests.support.waits import settled

__all__ = ["fake"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}}
WHEN = {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}
OTHER = "test:2"


async def echo(text: str) -> str:
    """Say the text back."""
    return text


async def remind(when: str) -> str:
    """Set a reminder."""
    return f"reminded at {when}"


async def shout(text: str) -> str:
    """Say the text back, loudly."""
    return text.upper()


def toolbox() -> Toolbox:
    """Three tools; `remind`'s schema uses `"format": "date-time"`."""
    declared = (
        PythonTool(function=echo, parameters=TEXT, side_effects=False),
        PythonTool(function=remind, parameters=WHEN, side_effects=True),
        PythonTool(function=shout, parameters=TEXT, side_effects=False),
    )
    box = Toolbox()
    box.offer([[(tool.tool("python:test"), PythonRunner(tool)) for tool in declared]])
    return box


def seen(fake: FakeOpenAI) -> int:
    """Every chat request the provider saw: answered, and refused."""
    return len(fake.requests) + len(fake.rejected)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bot.llm.tool_refusals"]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_model_that_takes_no_tools_answers_every_burst_and_is_told_once(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.refuse_tools = True
    runtime, outbound = await replica(runtime_factory, fake, toolbox=toolbox())
    for n in (1, 2, 3):
        await say(runtime, n, f"burst {n}")
    assert outbound.texts(CONV) == [f"You said: burst {n}" for n in (1, 2, 3)]
    # One refused request to learn it, then each burst asks once, without tools.
    assert seen(fake) == 3 + 1, [r.tool_names for r in fake.requests]
    [refused] = fake.rejected
    # The memory tool too: memory is on by default.
    names = ["echo", "remind", "shout", "user_memory"]
    assert [t["function"]["name"] for t in refused["tools"]] == names
    assert all(not r.tools and r.tool_choice is None for r in fake.requests)
    [warning] = warnings(caplog)
    assert f"model {FAKE_MODEL_ID} does not take tools" in warning
    assert "does not support tools" in warning and NO_TOOLS_FIX in warning
    assert errors(caplog) == []


async def test_a_tool_whose_schema_is_refused_is_left_out_and_everyone_is_answered(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.refuse_format = "date-time"
    runtime, outbound = await replica(runtime_factory, fake, toolbox=toolbox())
    await say(runtime, 1, "from the first user")
    assert await runtime.ingest(message("from another", n=10, conversation=OTHER, user="u2"))
    await settled(runtime, OTHER)
    await say(runtime, 2, "again")
    assert outbound.texts(CONV) == ["You said: from the first user", "You said: again"]
    assert outbound.texts(OTHER) == ["You said: from another"]
    # Refused once; every request after offers the other two tools.
    [refused] = fake.rejected
    assert "remind" in [t["function"]["name"] for t in refused["tools"]]
    assert [r.tool_names for r in fake.requests] == [["echo", "shout", "user_memory"]] * 3
    assert seen(fake) == 3 + 1
    [warning] = warnings(caplog)
    assert f"model {FAKE_MODEL_ID} refuses tool remind" in warning and TOOL_FIX in warning
    assert "date-time" in warning
    assert errors(caplog) == []


async def test_a_schema_refusal_that_names_no_tool_goes_without_tools(
    runtime_factory: RuntimeFactory, fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.refuse_format = "date-time"
    fake.schema_refusal_names_tool = False
    runtime, outbound = await replica(runtime_factory, fake, toolbox=toolbox())
    await say(runtime, 1, "hello")
    await say(runtime, 2, "still there?")
    assert outbound.texts(CONV) == ["You said: hello", "You said: still there?"]
    assert APOLOGY not in outbound.texts(CONV)
    assert [r.tool_names for r in fake.requests] == [[], []] and len(fake.rejected) == 1
    [warning] = warnings(caplog)
    assert "does not take tools" in warning


# -- the model client alone -------------------------------------------------------------------


def offering(*names: str, parameters: dict[str, Any] = TEXT) -> Prompt:
    """A prompt offering a tool of each name, each with `parameters`."""
    tools = tuple(
        PythonTool(function=echo, name=name, parameters=parameters, side_effects=False)
        .tool("python:test")
        .spec()
        for name in names
    )
    return Prompt("Be brief.", (), ("hi",), tools=tools, tool_choice="auto")


async def test_a_provider_that_names_one_bad_tool_after_another_costs_bounded_requests(
    fake: FakeOpenAI,
) -> None:
    # Every tool's schema is refused, one named at a time.
    fake.refuse_format = "date-time"
    dated = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}
    names = [f"t{n}" for n in range(10)]
    prompt = offering(*names, parameters=dated)
    llm = OpenAILLM(llm_settings(fake))
    usage = Usage()
    try:
        answer = await llm.complete(prompt, usage)
    finally:
        await llm.close()
    assert answer.text == "You said: hi"
    # MAX_TOOL_REFUSALS tools named and left out, then one request without any.
    assert len(fake.rejected) == MAX_TOOL_REFUSALS
    [answered] = fake.requests
    assert answered.tools == [] and "tool_choice" not in answered.body
    # The refused requests cost no tokens.
    assert len(usage.attempts) == 1
    model = llm.settings.model
    assert llm.refusals.refused(model) == (False, frozenset(names[:MAX_TOOL_REFUSALS]))


async def test_a_refusal_is_remembered_for_a_while_then_the_tools_are_offered_again(
    fake: FakeOpenAI,
) -> None:
    fake.refuse_tools = True
    now = [0.0]
    llm = OpenAILLM(llm_settings(fake))
    llm.refusals = Refusals(remember_s=60, clock=lambda: now[0])
    try:
        await llm.complete(offering("echo"), Usage())
        await llm.complete(offering("echo"), Usage())
        assert (len(fake.rejected), len(fake.requests)) == (1, 2)
        now[0] = 61.0
        await llm.complete(offering("echo"), Usage())
    finally:
        await llm.close()
    # Past the minute the tools are asked with again: one more refusal, learnt again.
    assert (len(fake.rejected), len(fake.requests)) == (2, 3)


async def test_a_model_that_refuses_tools_is_remembered_apart_from_another(
    fake: FakeOpenAI,
) -> None:
    fake.refuse_tools = True
    llm = OpenAILLM(llm_settings(fake))
    try:
        await llm.complete(offering("echo"), Usage())
        fake.refuse_tools = False
        # A model the user picked (/model) is asked with the tools all the same.
        await llm.complete(replace(offering("echo"), model="other-model"), Usage())
        await llm.complete(offering("echo"), Usage())
    finally:
        await llm.close()
    model = llm.settings.model
    assert [(r.model, r.tool_names) for r in fake.requests] == [
        (model, []),
        ("other-model", ["echo"]),
        (model, []),
    ]


def test_refusals_are_bounded() -> None:
    refusals = Refusals()
    for n in range(MAX_MODELS + 5):
        refusals.learn(f"model-{n}", Refusal("", "does not support tools"))
    assert refusals.refused("model-0") == (False, frozenset())
    assert refusals.refused(f"model-{MAX_MODELS + 4}") == (True, frozenset())


SENT = ["get_time", "when_is", "search"]


@pytest.mark.parametrize(
    ("status", "message", "param", "expected"),
    [
        # Ollama, through its OpenAI-compatible API and its own.
        (400, "registry.ollama.ai/library/gemma:2b does not support tools", None, ""),
        (400, "Groq: tool calling is not supported with this model", None, ""),
        (400, "deepseek-reasoner does not support Function Calling", None, ""),
        (400, '"auto" tool choice requires --enable-auto-tool-choice to be set', None, ""),
        (400, "tools param requires --jinja flag", None, ""),
        (400, "Unrecognized request argument supplied: tools", None, ""),
        (404, "No endpoints found that support tool use.", None, ""),
        (
            400,
            "Invalid schema for function 'when_is': 'format' 'date-time' is not supported.",
            "tools[1].function.parameters",
            "when_is",
        ),
        (400, "Invalid schema for function 'search': bad 'format'.", None, "search"),
        (
            400,
            'Invalid JSON payload received. Unknown name "format" at '
            "'tools[0].function_declarations[2].parameters.properties[0].value'",
            None,
            "search",
        ),
        (400, "Invalid schema: 'format' is not supported in function parameters.", None, ""),
    ],
)
def test_what_providers_say_when_they_refuse_tools(
    status: int, message: str, param: str | None, expected: str
) -> None:
    found = refusal(status, message, param, SENT)
    assert found is not None and found.tool == expected


@pytest.mark.parametrize(
    ("status", "message", "param"),
    [
        (400, "This model's maximum context length is 8192 tokens.", "messages"),
        (
            400,
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            "messages.[3].role",
        ),
        (400, "Invalid schema for response_format 'answer': 'format' is not permitted.", None),
        (404, "The model `gpt-9` does not exist or you do not have access to it.", "model"),
        (500, "tools param requires --jinja flag", None),
    ],
)
def test_other_errors_are_no_refusal_of_tools(status: int, message: str, param: str | None) -> None:
    assert refusal(status, message, param, SENT) is None
    # And without tools sent nothing can be a refusal of them.
    assert refusal(400, "does not support tools", None, []) is None


async def test_tools_too_long_for_the_context_are_no_refusal_of_them(fake: FakeOpenAI) -> None:
    too_long = (
        "This model's maximum context length is 8192 tokens. However, your messages resulted "
        "in 9000 tokens (1000 in the messages, 8000 in the functions). Please reduce the "
        "length of the messages or functions."
    )
    body = {"error": {"message": too_long, "type": "invalid_request_error", "param": None}}
    fake.fail_next(ScriptedError(400, body | {"code": "context_length_exceeded"}))
    llm = OpenAILLM(llm_settings(fake))
    try:
        with pytest.raises(LLMError) as caught:
            await llm.complete(offering("echo"), Usage())
    finally:
        await llm.close()
    # The prompt is shrunk for it (`generate`); the tools are still offered.
    assert caught.value.kind == "context"
    assert llm.refusals.refused(llm.settings.model) == (False, frozenset())

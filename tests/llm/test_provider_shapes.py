"""Replies of any shape a provider may send, read by the real `openai` client through
`OpenAILLM` and `generate` against the loopback fake: content as a list of parts (Mistral),
odd usage, choices and deltas of the wrong type, junk between events, a proxy's HTML page
with a 200, bodies cut short. What is usable is read; the rest is the retryable
`LLMError(kind="transient")`, never a TypeError or a KeyError out of the reader.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.llm.base import LLMError, Usage, generate
from bot.llm.openai import OpenAILLM
from bot.llm.prompt import Prompt
from bot.llm.wire import JUNK_LIMIT, MAX_TOOL_NAME_CHARS, TAIL_S
from bot.tools import ToolCall
from tests.support.fakes.openai_server import AfterDone, FakeOpenAI, RawReply
from tests.support.provider import llm_settings

pytestmark = pytest.mark.timeout(60)

chunk = RawReply.chunk
completion = RawReply.completion


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        server.reply = lambda request: "the plain answer"
        yield server


PROMPT = Prompt(system="Be brief.", history=(), unanswered=("hi",))


class Asked:
    """One `complete` call's outcome: the text or the error, the drafts it showed, its usage."""

    def __init__(self) -> None:
        self.drafts: list[str] = []
        self.usage = Usage(on_text=self.drafts.append)
        self.text: str | None = None
        self.calls: tuple[ToolCall, ...] = ()
        self.error: LLMError | None = None

    @property
    def attempt(self) -> tuple[bool, int, int]:
        [attempt] = self.usage.attempts
        return attempt.reported, attempt.prompt_tokens, attempt.completion_tokens


async def ask(fake: FakeOpenAI, *raw: RawReply, stream: bool = True) -> Asked:
    """`OpenAILLM.complete` once, answered with `raw`; an LLMError is kept, any other
    exception fails the test."""
    fake.answer_next(*raw)
    llm = OpenAILLM(llm_settings(fake, stream=stream))
    asked = Asked()
    try:
        answer = await llm.complete(PROMPT, asked.usage)
        asked.text, asked.calls = answer.text, answer.calls
    except LLMError as exc:
        asked.error = exc
    finally:
        await llm.client.close()
    return asked


async def answered(fake: FakeOpenAI, *raw: RawReply, stream: bool = True) -> Asked:
    asked = await ask(fake, *raw, stream=stream)
    assert asked.error is None, asked.error
    return asked


async def refused(fake: FakeOpenAI, *raw: RawReply, stream: bool = True) -> LLMError:
    asked = await ask(fake, *raw, stream=stream)
    assert asked.error is not None, f"read {asked.text!r}"
    assert asked.error.kind == "transient"
    return asked.error


def text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


# -- content ----------------------------------------------------------------------------------


async def test_mistral_content_parts_give_the_text_without_the_thinking(fake: FakeOpenAI) -> None:
    thinking = {"type": "thinking", "thinking": [text_part("the secret plan")]}
    stream = RawReply.events(
        chunk({"role": "assistant", "content": [thinking]}),
        chunk({"content": [text_part("Hello ")]}),
        chunk({"content": [{"type": "reference", "reference_ids": [1]}, text_part("world")]}),
        chunk({"content": ""}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
    )
    asked = await answered(fake, stream)
    assert asked.text == "Hello world"
    assert asked.drafts == ["Hello ", "Hello world"]
    # No usage reported: one token per chunk that generated something, the thinking included.
    assert asked.attempt == (False, 0, 3)


async def test_content_of_any_type_gives_what_is_text(fake: FakeOpenAI) -> None:
    stream = RawReply.events(
        chunk({"content": "a"}),
        chunk({"content": None}),
        chunk({"content": 5}),
        chunk({"content": True}),
        chunk({"content": text_part("b")}),
        chunk({"content": ["c", 7, None, {"text": "d"}, {"type": "text", "text": 8}]}),
        chunk({"content": {"type": "image_url", "image_url": {"url": "x"}}}),
        chunk({"content": [[text_part("nested")]]}),
        chunk({"content": "e"}),
    )
    assert (await answered(fake, stream)).text == "abcde"


async def test_an_emoji_split_across_events_is_joined_and_a_lone_half_replaced(
    fake: FakeOpenAI,
) -> None:
    # JSON escapes a character beyond the BMP as two surrogates; a server that cuts between
    # them sends each in an event of its own, and a broken one sends half only.
    stream = RawReply.events(
        b'data: {"choices": [{"delta": {"content": "smile \\ud83d"}}]}\n\n',
        b'data: {"choices": [{"delta": {"content": "\\ude00!"}}]}\n\n',
        b'data: {"choices": [{"delta": {"content": " half \\udc00"}}]}\n\n',
    )
    text = (await answered(fake, stream)).text
    assert text == "smile \U0001f600! half \ufffd"
    text.encode("utf-8")  # what the store and every platform need of it
    plain = RawReply([b'{"choices": [{"message": {"content": "\\ud83d"}}]}'], "application/json")
    assert (await answered(fake, plain, stream=False)).text == "\ufffd"


async def test_reasoning_fields_are_billed_and_never_shown(fake: FakeOpenAI) -> None:
    stream = RawReply.events(
        chunk({"reasoning_content": "musing"}),
        chunk({"reasoning": "more musing"}),
        chunk({"content": "The answer."}),
    )
    asked = await answered(fake, stream)
    assert asked.text == "The answer." and asked.attempt == (False, 0, 3)


async def test_a_reply_of_thinking_only_is_retried_and_the_next_one_answers(
    fake: FakeOpenAI,
) -> None:
    thinking = RawReply.events(chunk({"content": [{"type": "thinking", "thinking": "hm"}]}))
    settings = llm_settings(fake)
    fake.answer_next(thinking)
    usage = Usage()
    answer = await generate(OpenAILLM(settings), PROMPT, settings, usage)
    assert answer.text == "the plain answer" and len(fake.requests) == 2


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "read"),
    [
        ({"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, (12, 3)),
        ({"prompt_tokens": "12", "completion_tokens": " 3 "}, (12, 3)),
        ({"prompt_tokens": 12.0, "completion_tokens": 3.9}, (12, 3)),
        (7, None),
        ("lots", None),
        ([12, 3], None),
        (None, None),
        ({}, None),
        ({"prompt_tokens": None, "completion_tokens": None}, None),
        ({"prompt_tokens": 12}, None),
        ({"prompt_tokens": -1, "completion_tokens": 3}, None),
        ({"prompt_tokens": "twelve", "completion_tokens": 3}, None),
        ({"prompt_tokens": True, "completion_tokens": 3}, None),
        ({"prompt_tokens": 10**30, "completion_tokens": 3}, None),
        ({"prompt_tokens": float("nan"), "completion_tokens": float("inf")}, None),
        ({"prompt_tokens": "9" * 5000, "completion_tokens": 3}, None),
        ({"prompt_tokens": {"n": 1}, "completion_tokens": [3]}, None),
    ],
    ids=lambda value: repr(value)[:40],
)
async def test_usage_is_read_where_usable_else_counted_by_chunk(
    fake: FakeOpenAI, usage: object, read: tuple[int, int] | None
) -> None:
    stream = RawReply.events(
        chunk({"content": "one "}),
        chunk({"content": "two"}),
        chunk({}, choices=[], usage=usage),
    )
    asked = await answered(fake, stream)
    assert asked.text == "one two"
    assert asked.attempt == ((True, *read) if read else (False, 0, 2))
    plain = await answered(
        fake, RawReply.json(completion({"content": "x"}, usage=usage)), stream=False
    )
    assert plain.attempt == ((True, *read) if read else (False, 0, 0))


# -- choices and deltas -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "odd",
    [
        {"choices": []},
        {"choices": None},
        {"choices": "none"},
        {"choices": {"0": {"delta": {"content": "x"}}}},
        {"choices": ["a string choice"]},
        {"choices": [None, 3, []]},
        {"choices": [{"index": 0}]},
        {"choices": [{"delta": None}]},
        {"choices": [{"delta": "x"}]},
        {"choices": [{"delta": ["x"]}]},
        {"object": "chat.completion.chunk"},
        {},
    ],
    ids=repr,
)
async def test_odd_choices_and_deltas_are_skipped(fake: FakeOpenAI, odd: dict[str, Any]) -> None:
    stream = RawReply.events(chunk({"content": "before "}), odd, chunk({"content": "after"}))
    assert (await answered(fake, stream)).text == "before after"


async def test_a_stream_of_nothing_usable_is_a_transient_error(fake: FakeOpenAI) -> None:
    stream = RawReply.events({"choices": "none"}, chunk(None), chunk({"content": None}))
    assert "empty reply" in str(await refused(fake, stream))


# -- junk between events ----------------------------------------------------------------------


JUNK = [
    b"data: ping\n\n",
    b"data:\n\n",
    b"data: 42\n\n",
    b'data: "keep-alive"\n\n',
    b"data: [1, 2]\n\n",
    b"data: null\n\n",
    b"data: \xff\xfe not utf-8\n\n",
    b"data: " + b"[" * 100_000 + b"\n\n",
    b"<html>not an event at all</html>\n\n",
    b"event: ping\nid: 3\nretry: 10\n\n",
    b": a comment\n\n",
]


async def test_junk_between_events_is_skipped(fake: FakeOpenAI) -> None:
    stream = RawReply.events(chunk({"content": "one "}), *JUNK, chunk({"content": "two"}))
    assert (await answered(fake, stream)).text == "one two"


async def test_past_the_junk_limit_the_stream_is_given_up_and_retried(fake: FakeOpenAI) -> None:
    junk = [b"data: ping\n\n"] * (JUNK_LIMIT + 1)
    settings = llm_settings(fake)
    fake.answer_next(RawReply.events(chunk({"content": "lost"}), *junk))
    answer = await generate(OpenAILLM(settings), PROMPT, settings, Usage())
    assert answer.text == "the plain answer" and len(fake.requests) == 2
    # Up to the limit, it is read.
    kept = RawReply.events(chunk({"content": "kept"}), *junk[:JUNK_LIMIT])
    assert (await answered(fake, kept)).text == "kept"


@pytest.mark.parametrize(
    "broken",
    [b'data: {"choices": [{"delta": {"content": "x"\n\n', b"data: {" + b"{" * 100_000 + b"\n\n"],
    ids=["cut-short", "nested-too-deep"],
)
async def test_an_object_event_that_does_not_parse_is_a_transient_error(
    fake: FakeOpenAI, broken: bytes
) -> None:
    # It may hold a piece of the answer: a retry is better than a reply with a hole in it.
    stream = RawReply.events(chunk({"content": "one "}), broken, chunk({"content": "two"}))
    assert "malformed event" in str(await refused(fake, stream))


async def test_an_event_too_long_to_be_one_is_a_transient_error(fake: FakeOpenAI) -> None:
    endless = b"data: " + b"x" * (1 << 20) + b"\n"
    stream = RawReply.events(chunk({"content": "one "}), endless, chunk({"content": "two"}))
    assert "too long" in str(await refused(fake, stream))


# -- the end of a stream ----------------------------------------------------------------------


def finishing(**fields: object) -> dict[str, object]:
    """The chunk that finishes the one choice."""
    return chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}], **fields)


async def complete_held(fake: FakeOpenAI, *raw: RawReply) -> tuple[Asked, float]:
    """`complete` against a stream held open after its answer (`raw`, else the fake's own
    stream as `fake.after_done` holds it), with a read timeout far above what the answer may
    wait: the answer, and how long after its last byte it came. The client must hang up on
    the held stream rather than leave the connection open or pool it."""
    fake.answer_next(*raw)
    llm = OpenAILLM(llm_settings(fake, timeout_s=10.0, deadline_s=20.0))
    asked = Asked()
    try:
        answer = await llm.complete(PROMPT, asked.usage)
        returned = time.monotonic()
        asked.text = answer.text
        [request] = fake.requests
        await fake.wait_for_request(lambda r: r.hung_up, timeout=5)
    finally:
        await llm.client.close()
    assert request.ended_at is not None
    return asked, returned - request.ended_at


@pytest.mark.parametrize("after", ["keep-alive", "silent"])
async def test_a_stream_held_open_after_done_is_answered_at_done(
    fake: FakeOpenAI, after: AfterDone
) -> None:
    # Proxies and self-hosted servers do both; reading on to the end of the body waited for a
    # read timeout (silent) or the whole deadline (keep-alives), and threw the answer away.
    fake.after_done = after
    asked, waited = await complete_held(fake)
    assert asked.text == "the plain answer" and asked.attempt[0]
    assert waited < 3.0, f"the answer came {waited:.1f}s after its [DONE]"


@pytest.mark.parametrize("after", ["keep-alive", "silent"])
async def test_the_finishing_chunk_and_its_usage_end_a_stream_without_done(
    fake: FakeOpenAI, after: AfterDone
) -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    with_usage = RawReply.events(
        chunk({"content": "all "}),
        chunk({"content": "here"}),
        finishing(),
        chunk({}, choices=[], usage=usage),
        done=False,
        after=after,
    )
    asked, waited = await complete_held(fake, with_usage)
    assert asked.text == "all here" and asked.attempt == (True, 7, 2)
    assert waited < 3.0, f"the answer came {waited:.1f}s after its usage"


async def test_usage_that_never_comes_after_the_finishing_chunk_is_waited_for_briefly(
    fake: FakeOpenAI,
) -> None:
    # Usage was asked for, and the server ignored the ask: the answer is whole at the
    # finishing chunk, and its tokens are counted by chunk.
    without_usage = RawReply.events(
        chunk({"content": "counted"}), finishing(), done=False, after="keep-alive"
    )
    asked, waited = await complete_held(fake, without_usage)
    assert asked.text == "counted" and asked.attempt == (False, 0, 1)
    assert TAIL_S <= waited < 3.0


# -- bodies that are no stream ----------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_an_html_page_with_a_200_is_a_transient_error(fake: FakeOpenAI, stream: bool) -> None:
    error = await refused(fake, RawReply.html(), stream=stream)
    assert ("web page" if stream else "<html>") in str(error)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_an_html_error_page_with_a_502_is_retried(fake: FakeOpenAI, stream: bool) -> None:
    settings = llm_settings(fake, stream=stream)
    fake.answer_next(RawReply.html(status=502))
    answer = await generate(OpenAILLM(settings), PROMPT, settings, Usage())
    assert answer.text == "the plain answer"


async def test_a_whole_completion_to_a_stream_request_is_read(fake: FakeOpenAI) -> None:
    # A server that ignores `stream`: the answer comes at once, as one draft.
    body = completion({"content": [text_part("all "), text_part("at once")]})
    asked = await answered(
        fake, RawReply.json(body | {"usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    )
    assert asked.text == "all at once" and asked.drafts == ["all at once"]
    assert asked.attempt == (True, 4, 2)


@pytest.mark.parametrize("cut", [0, 40, 200])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_body_cut_short_is_a_transient_error(
    fake: FakeOpenAI, stream: bool, cut: int
) -> None:
    events = [chunk({"content": f"word{n} "}) for n in range(5)]
    raw = (
        RawReply.events(*events, cut_after=cut)
        if stream
        else RawReply.json(completion({"content": "whole"}), cut_after=cut)
    )
    assert "broke" in str(await refused(fake, raw, stream=stream))


# -- whole (not streamed) completions ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (completion({"role": "assistant", "content": "plain"}), "plain"),
        (
            completion({"content": [{"type": "thinking", "thinking": "hm"}, text_part("parts")]}),
            "parts",
        ),
        (completion({"content": text_part("one part")}), "one part"),
        (completion({"content": "kept", "reasoning_content": "not shown"}), "kept"),
        (
            completion({"content": "first"})
            | {"choices": ["odd", {"message": {"content": "first"}}]},
            "first",
        ),
    ],
    ids=["string", "parts", "one-part", "reasoning", "odd-choice-first"],
)
async def test_a_whole_completion_of_any_shape_gives_its_text(
    fake: FakeOpenAI, body: dict[str, Any], text: str
) -> None:
    assert (await answered(fake, RawReply.json(body), stream=False)).text == text


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (completion(None), "empty reply"),
        (completion("a string message"), "empty reply"),
        (completion({"content": None}), "empty reply"),
        (completion({"content": 42}), "empty reply"),
        ({"choices": []}, "empty reply"),
        ({"choices": "none"}, "empty reply"),
        ({"id": "x"}, "empty reply"),
        ([completion({"content": "in a list"})], "not a completion"),
        ("a string", "not a completion"),
        (None, "not a completion"),
        ({"error": {"message": "upstream overloaded"}}, "upstream overloaded"),
        ({"error": "quota"}, "quota"),
    ],
    ids=[
        "no-message",
        "string-message",
        "null-content",
        "number-content",
        "no-choices",
        "string-choices",
        "no-choices-key",
        "a-list",
        "a-string",
        "null",
        "error-object",
        "error-string",
    ],
)
async def test_a_whole_body_without_an_answer_is_a_transient_error(
    fake: FakeOpenAI, body: object, said: str
) -> None:
    assert said in str(await refused(fake, RawReply.json(body), stream=False))


async def test_a_plain_body_that_is_no_json_is_a_transient_error(fake: FakeOpenAI) -> None:
    raw = RawReply([b"Service Unavailable"], "text/plain")
    assert "Service Unavailable" in str(await refused(fake, raw, stream=False))


# -- any shape at all -------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
CONTENT = JSON | st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "thinking", "reference"]), "text": JSON}
    ),
    max_size=3,
)
# Pieces of tool calls, usable or not: an index, an id, a name and arguments of any type.
TOOL_PIECES = JSON | st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "index": JSON | st.integers(-1, 3),
            "id": JSON,
            "function": JSON
            | st.fixed_dictionaries(
                {},
                optional={
                    "name": JSON | st.sampled_from(["get_time", "a bad name"]),
                    "arguments": JSON,
                },
            ),
        },
    ),
    max_size=3,
)
CHUNKS = st.one_of(
    JSON,
    st.builds(lambda pieces: chunk({"tool_calls": pieces}), TOOL_PIECES),
    st.builds(
        chunk, st.fixed_dictionaries({}, optional={"content": CONTENT, "reasoning_content": JSON})
    ),
    st.builds(lambda usage: chunk({}, usage=usage), JSON),
    st.builds(lambda choices: chunk({}, choices=choices), JSON),
    st.sampled_from(JUNK[:7]),
)


BODIES = st.one_of(
    JSON,
    st.builds(lambda calls: completion({"tool_calls": calls}), TOOL_PIECES),
    st.builds(completion, JSON | st.fixed_dictionaries({"content": CONTENT})),
    st.builds(lambda usage: completion({"content": "x"}, usage=usage), JSON),
    st.builds(lambda choices: completion({}, choices=choices), JSON),
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    events=st.lists(CHUNKS, max_size=8),
    body=BODIES,
    stream=st.booleans(),
    cut=st.none() | st.integers(0, 400),
)
async def test_any_reply_is_read_or_is_a_transient_error(
    fake: FakeOpenAI, events: list[object], body: object, stream: bool, cut: int | None
) -> None:
    fake.raw_replies.clear()
    raw = RawReply.events(*events, cut_after=cut) if stream else RawReply.json(body, cut_after=cut)
    asked = await ask(fake, raw, stream=stream)
    if asked.error is not None:
        assert asked.error.kind == "transient"
    else:
        assert isinstance(asked.text, str) and (asked.text or asked.calls)
        assert all(0 < len(call.name) <= MAX_TOOL_NAME_CHARS for call in asked.calls)
        # Whatever name the model wrote, what goes back to the provider is one it takes.
        names = [call.message()["function"]["name"] for call in asked.calls]
        assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name) for name in names)

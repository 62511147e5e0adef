"""The LLM layer: the prompt a cycle builds, the echo model, the OpenAI client against a loopback
fake of the provider, the retry policy, and the apology a cycle sends when the model fails.

The OpenAI tests drive the real `openai` client over HTTP, so status codes, timeouts and error
bodies reach `OpenAILLM` exactly as a real provider's would.
"""

from __future__ import annotations

import itertools
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from bot.config.settings import LLMSettings
from bot.core.cycle import APOLOGY
from bot.core.runtime import Runtime
from bot.llm.base import Answer, LLMError, Usage, generate
from bot.llm.echo import EchoLLM
from bot.llm.openai import OpenAILLM
from bot.llm.prompt import FOLD_HEADER, Image, Prompt, Turn
from bot.llm.wire import DRAIN_S, TAIL_S, sse_events
from tests.support.builders import message
from tests.support.factories import RuntimeFactory
from tests.support.fakes.openai_server import FakeOpenAI, RawReply, ScriptedError
from tests.support.fakes.outbound import RecordingOutbound
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.waits import settled

# Distinctive, so that finding it anywhere in logs or errors cannot be a coincidence.
KEY = "sk-test-9f3a-DO-NOT-LOG-71c2"
MODEL = "test-model"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


def llm_config(fake: FakeOpenAI, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "provider": "openai",
        "base_url": fake.base_url,
        "api_key": KEY,
        "model": MODEL,
        "timeout_s": 5.0,
        "retries": 2,
        "retry_base_s": 0.01,
    }
    values.update(overrides)
    return values


def openai_llm(fake: FakeOpenAI, **overrides: Any) -> OpenAILLM:
    return OpenAILLM(LLMSettings(**llm_config(fake, **overrides)))


def prompt(*unanswered: str) -> Prompt:
    return Prompt(system="Be brief.", history=(), unanswered=unanswered)


def assert_key_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    # Something must have been captured, or the check below would pass vacuously.
    assert caplog.records
    assert KEY not in caplog.text
    assert all(KEY not in repr(record.args) for record in caplog.records)


# -- Prompt and echo ------------------------------------------------------------------------


def test_prompt_merges_history_and_folds_unanswered_into_one_user_turn() -> None:
    history = (
        Turn("user", "hi"),
        Turn("user", "are you there?"),
        Turn("assistant", "Yes."),
        Turn("assistant", "How can I help?"),
        Turn("user", "weather?"),
        Turn("assistant", "Sunny."),
    )
    messages = Prompt("sys", history, ("A", "B", "C")).messages()
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi\n\nare you there?"},
        {"role": "assistant", "content": "Yes.\n\nHow can I help?"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": f"{FOLD_HEADER}\n1. A\n2. B\n3. C"},
    ]


def test_prompt_single_message_is_not_wrapped() -> None:
    messages = Prompt("sys", (), ("just this",)).messages()
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "just this"},
    ]


def test_prompt_roles_alternate_even_after_a_trimmed_history() -> None:
    # A history cut short can start on a reply and end on a user turn: the reply goes (a
    # request may not open with the assistant) and the user turn joins the fold, so the roles
    # alternate, as strict chat templates insist.
    messages = Prompt("sys", (Turn("assistant", "old"), Turn("user", "q")), ("A", "B")).messages()
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": f"q\n\n{FOLD_HEADER}\n1. A\n2. B"},
    ]


async def test_echo_answers_with_the_folded_messages_deterministically() -> None:
    llm = EchoLLM()
    first = await llm.complete(prompt("A", "B", "C"), Usage())
    assert first == Answer("You said: A / B / C")
    assert await llm.complete(prompt("A", "B", "C"), Usage()) == first
    assert await EchoLLM(delay_ms=20).complete(prompt("solo"), Usage()) == Answer("You said: solo")


# -- OpenAILLM against the fake provider -----------------------------------------------------


async def test_plain_completion_returns_the_text(fake: FakeOpenAI) -> None:
    fake.reply = lambda request: "Hello from the model."
    asked = Prompt("Be brief.", (Turn("user", "earlier"), Turn("assistant", "ok")), ("A", "B"))
    usage = Usage()
    answer = await openai_llm(fake, stream=False).complete(asked, usage)
    assert answer == Answer("Hello from the model.")
    [request] = fake.requests
    assert request.model == MODEL
    assert request.api_key == KEY
    assert request.messages == asked.messages()
    assert request.stream is False
    assert request.body["max_tokens"] == 1024
    # The provider's own count, as it reported it.
    [attempt] = usage.attempts
    assert attempt.reported and attempt.prompt_tokens > 0 and attempt.completion_tokens > 0


async def test_streamed_completion_returns_the_text_and_the_reported_usage(
    fake: FakeOpenAI,
) -> None:
    fake.reply = lambda request: "one two three, four five six"
    usage = Usage()
    answer = await openai_llm(fake).complete(prompt("count"), usage)
    assert answer == Answer("one two three, four five six")
    [request] = fake.requests
    assert request.stream and request.body["stream_options"] == {"include_usage": True}
    assert request.finished and not request.cancelled
    # The usage chunk at the end of the stream (the fake counts characters / 4 + 1), not
    # the one-per-piece count.
    [attempt] = usage.attempts
    assert attempt.reported and attempt.prompt_tokens > 0
    assert attempt.completion_tokens == 8 != request.pieces_streamed


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_generations_reuse_one_connection_to_the_provider(
    fake: FakeOpenAI, stream: bool
) -> None:
    # A new connection to a real provider costs a TLS handshake on every reply.
    llm = openai_llm(fake, stream=stream)
    try:
        for n in range(3):
            assert await llm.complete(prompt(f"hi {n}"), Usage())
    finally:
        await llm.client.close()
    assert len({r.connection for r in fake.requests}) == 1 and fake.requests[0].connection


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_the_request_carries_the_settings_and_the_provider_quirks(
    fake: FakeOpenAI, stream: bool
) -> None:
    llm = openai_llm(
        fake,
        stream=stream,
        temperature=0.3,
        max_tokens=99,
        extra_headers={"HTTP-Referer": "https://example.org/bot", "X-Title": "lastword"},
        extra_body={"top_k": 40, "max_tokens": 77},
    )
    try:
        assert await llm.complete(prompt("hi"), Usage())
    finally:
        await llm.client.close()
    [request] = fake.requests
    assert request.api_key == KEY and request.model == MODEL
    assert request.headers["http-referer"] == "https://example.org/bot"
    assert request.headers["x-title"] == "lastword"
    assert request.headers["content-type"] == "application/json"
    # The extra body is merged in last, as the client merges it: it wins over a setting.
    assert request.body["top_k"] == 40 and request.body["max_tokens"] == 77
    assert request.body["temperature"] == 0.3 and request.body["stream"] is stream
    assert request.messages == prompt("hi").messages()


@pytest.mark.parametrize("bypassed", [False, True], ids=["proxied", "no_proxy"])
async def test_requests_go_through_the_proxy_the_environment_names(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, bypassed: bool
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    upstream = urllib.parse.urlsplit(fake.base_url)
    async with TcpProxy(("127.0.0.1", upstream.port or 80)) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        if bypassed:
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        llm = openai_llm(fake)
        try:
            assert await llm.complete(prompt("hi"), Usage())
        finally:
            await llm.client.close()
        assert proxy.accepted == (0 if bypassed else 1)
    assert len(fake.requests) == 1


async def test_a_provider_that_refuses_stream_options_still_streams(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.refuse_stream_options = True
    fake.reply = lambda request: "one two three four"
    llm = openai_llm(fake)
    first, second = Usage(), Usage()
    try:
        assert (await llm.complete(prompt("hi"), first)).text == "one two three four"
        assert (await llm.complete(prompt("again"), second)).text == "one two three four"
    finally:
        await llm.client.close()
    # Refused once, then asked without it, and not again for the next reply.
    [refused] = fake.rejected
    assert refused["stream"] is True and "stream_options" in refused
    assert [r.stream for r in fake.requests] == [True, True]
    assert all("stream_options" not in r.body for r in fake.requests)
    # No usage chunk without it: the tokens are counted by chunk, and the refusal costs none.
    for usage, request in ((first, fake.requests[0]), (second, fake.requests[1])):
        [attempt] = usage.attempts
        assert not attempt.reported and attempt.completion_tokens == request.pieces_streamed
    [warning] = [r for r in caplog.records if r.name == "bot.llm.openai"]
    assert "stream_options" in warning.getMessage()


async def test_a_provider_that_refused_stream_options_is_not_waited_on_for_usage(
    fake: FakeOpenAI,
) -> None:
    # Usage was not asked for, so the answer is whole at its finishing chunk, even from a
    # stream held open after it, with usage coming anyway: the reply never waits for it.
    # Each piece comes after a pause that ends after the client's read of what follows the
    # answer (DRAIN_S) and before the wait for an asked-for usage would end (TAIL_S).
    fake.refuse_stream_options = True
    finishing = RawReply.chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
    counts = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    late_usage = RawReply.chunk({}, choices=[], usage=counts)
    fake.answer_next(
        RawReply.events(
            RawReply.chunk({"content": "whole"}),
            finishing,
            late_usage,
            done=False,
            pause_s=(DRAIN_S + TAIL_S) / 2,
            after="silent",
        )
    )
    llm = openai_llm(fake)
    usage = Usage()
    try:
        answer = await llm.complete(prompt("hi"), usage)
        [request] = fake.requests
        streamed = request.pieces_streamed
    finally:
        await llm.client.close()
    assert answer.text == "whole"
    assert "stream_options" in fake.rejected[0] and "stream_options" not in request.body
    # Back at the finishing chunk: the usage after it was neither waited for nor read.
    assert streamed == 2
    [attempt] = usage.attempts
    assert not attempt.reported and attempt.completion_tokens == 1


@pytest.mark.parametrize("how", ["error", "drop"])
async def test_a_stream_that_breaks_midway_is_retried(
    fake: FakeOpenAI, how: Literal["error", "drop"], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake.reply = lambda request: " ".join(f"word{i}" for i in range(40))
    fake.break_next_stream(how)
    settings = LLMSettings(**llm_config(fake))
    usage = Usage()
    answer = await generate(OpenAILLM(settings), prompt("hi"), settings, usage)
    assert answer.text == fake.reply(fake.requests[-1])
    first, second = fake.requests
    assert (first.dropped, first.finished) == ((True, False) if how == "drop" else (False, True))
    assert second.finished and not second.dropped
    # The broken attempt's tokens were generated, so they are counted too.
    broken, whole = usage.attempts
    assert not broken.reported and broken.completion_tokens == first.pieces_streamed > 0
    assert whole.reported
    [retried] = [r for r in caplog.records if r.name == "bot.llm.base"]
    assert ("overloaded" if how == "error" else "the stream broke") in retried.getMessage()


async def test_events_are_read_as_the_sse_format_has_them() -> None:
    lines = [
        ": a comment, as proxies send to keep the connection open",
        "event: message",
        'data: {"a":',
        "data: 1}",
        "",
        "",
        'data:{"b": 2}',
        "id: 7",
        "",
        "data: [DONE]",
        "",
        'data: {"after": "done"}',
        "",
    ]

    async def source() -> AsyncIterator[str]:
        for line in lines:
            yield line

    assert [event async for event in sse_events(source())] == [{"a": 1}, {"b": 2}]


async def test_timeout_is_transient_and_hangs_up(fake: FakeOpenAI) -> None:
    fake.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(LLMError) as caught:
        await openai_llm(fake, timeout_s=0.2).complete(prompt("slow?"), Usage())
    assert caught.value.permanent is False
    assert time.monotonic() - started < 2.0
    # The client gave up on the request rather than waiting for the tokens.
    await fake.wait_for_request(lambda r: r.cancelled, timeout=5)


@pytest.mark.parametrize(
    "error",
    [FakeOpenAI.server_error(), FakeOpenAI.rate_limited(0)],
    ids=["500", "429"],
)
async def test_server_errors_and_rate_limits_are_transient(
    fake: FakeOpenAI, error: ScriptedError, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail_next(error)
    with pytest.raises(LLMError) as caught:
        await openai_llm(fake, retries=0).complete(prompt("hi"), Usage())
    assert caught.value.permanent is False
    assert len(fake.requests) == 1
    assert KEY not in str(caught.value)
    assert_key_not_logged(caplog)


def key_echoing_401() -> ScriptedError:
    # Real providers quote (part of) the key they were given; it must not reach our logs.
    return ScriptedError(
        status=401,
        body={
            "error": {
                "message": f"Incorrect API key provided: {KEY}.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
    )


def key_echoing_400() -> ScriptedError:
    return ScriptedError(
        status=400,
        body={
            "error": {
                "message": f"Invalid request made with key {KEY}: context too long.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
        },
    )


@pytest.mark.parametrize(
    ("error", "setting"),
    [
        (FakeOpenAI.unauthorized(), "LASTWORD_LLM__API_KEY"),
        (key_echoing_401(), "LASTWORD_LLM__API_KEY"),
        (FakeOpenAI.model_not_found(), "LASTWORD_LLM__MODEL"),
        (key_echoing_400(), "LASTWORD_LLM__MODEL"),
    ],
    ids=["401", "401-echoing-key", "404", "400-echoing-key"],
)
async def test_client_errors_are_permanent_and_name_the_setting(
    fake: FakeOpenAI, error: ScriptedError, setting: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail_next(error)
    with pytest.raises(LLMError) as caught:
        await openai_llm(fake).complete(prompt("hi"), Usage())
    assert caught.value.permanent is True
    assert setting in str(caught.value)
    assert KEY not in str(caught.value)
    # The error is raised `from None`: no chained provider exception carries the key along.
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    logging.getLogger("test").error("failed: %s", caught.value)
    assert_key_not_logged(caplog)


# -- the retry policy ------------------------------------------------------------------------


async def test_transient_failures_are_retried_with_backoff(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.reply = lambda request: "third time lucky"
    fake.fail_next(FakeOpenAI.server_error(), FakeOpenAI.server_error())
    base_s = 0.05
    settings = LLMSettings(**llm_config(fake, retries=3, retry_base_s=base_s))
    answer = await generate(OpenAILLM(settings), prompt("hi"), settings, Usage())
    assert answer == Answer("third time lucky")
    assert len(fake.requests) == 3
    starts = [r.started_at for r in fake.requests]
    # Jitter takes at most half off base * 2**attempt, so each wait is at least half of that.
    assert starts[1] - starts[0] >= base_s * 0.5
    assert starts[2] - starts[1] >= base_s * 2 * 0.5
    retried = [
        r for r in caplog.records if r.name == "bot.llm.base" and r.levelno == logging.WARNING
    ]
    assert len(retried) == 2
    assert_key_not_logged(caplog)


async def test_retries_give_up_after_the_limit(fake: FakeOpenAI) -> None:
    # One more failure queued than the limit allows: a fourth attempt would succeed instead.
    fake.fail_next(*(FakeOpenAI.server_error() for _ in range(3)))
    with pytest.raises(LLMError) as caught:
        settings = LLMSettings(**llm_config(fake, retries=2))
        await generate(OpenAILLM(settings), prompt("hi"), settings, Usage())
    assert caught.value.permanent is False
    assert len(fake.requests) == 3


async def test_permanent_failures_are_not_retried(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.fail_next(FakeOpenAI.unauthorized())
    with pytest.raises(LLMError) as caught:
        settings = LLMSettings(**llm_config(fake, retries=3))
        await generate(OpenAILLM(settings), prompt("hi"), settings, Usage())
    assert caught.value.permanent is True
    assert len(fake.requests) == 1
    assert_key_not_logged(caplog)


# -- the apology, end to end in one process --------------------------------------------------


async def run_burst_against_failing_model(
    fake: FakeOpenAI, runtime_factory: RuntimeFactory, *errors: ScriptedError
) -> tuple[Runtime, RecordingOutbound]:
    fake.fail_next(*errors)
    runtime, outbound = await runtime_factory(llm=llm_config(fake))
    for n in (1, 2, 3):
        assert await runtime.ingest(message(n=n))
    await settled(runtime, "test:1")
    return runtime, outbound


async def test_permanent_failure_sends_one_apology_covering_the_burst(
    fake: FakeOpenAI, runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # Only one request is expected: a retry would get a real answer, not an apology.
    runtime, outbound = await run_burst_against_failing_model(
        fake, runtime_factory, key_echoing_401()
    )
    assert outbound.texts() == [APOLOGY]
    assert len(fake.requests) == 1
    assert fake.requests[0].last_user_text == f"{FOLD_HEADER}\n1. text 1\n2. text 2\n3. text 3"
    assert await runtime.store.counters("test:1") == (3, 3)
    assert runtime.stats.apologies == 1
    assert any(
        r.levelno == logging.ERROR and "LASTWORD_LLM__API_KEY" in r.getMessage()
        for r in caplog.records
    )

    # The provider has recovered: the next message gets a real answer. The model is not shown
    # the apology, nor the messages it alone answered.
    assert await runtime.ingest(message(n=4))
    await settled(runtime, "test:1")
    assert outbound.texts() == [APOLOGY, "You said: text 4"]
    assert await runtime.store.counters("test:1") == (4, 4)
    assert fake.requests[1].messages[1:] == [{"role": "user", "content": "text 4"}]
    await runtime.stop()  # what it logs on the way out is checked too
    assert_key_not_logged(caplog)


async def test_exhausted_transient_failures_also_end_in_one_apology(
    fake: FakeOpenAI, runtime_factory: RuntimeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # retries=2: three attempts, all failing, then the apology rather than retrying forever.
    runtime, outbound = await run_burst_against_failing_model(
        fake, runtime_factory, *(FakeOpenAI.server_error() for _ in range(3))
    )
    assert outbound.texts() == [APOLOGY]
    assert len(fake.requests) == 3
    assert await runtime.store.counters("test:1") == (3, 3)
    await runtime.stop()  # what it logs on the way out is checked too
    assert_key_not_logged(caplog)


async def test_a_model_that_refuses_images_answers_once_without_them(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = ScriptedError(
        status=400,
        body={
            "error": {
                "message": "Invalid content type. image_url is only supported by certain models.",
                "type": "invalid_request_error",
                "param": "messages.[1].content.[1].type",
                "code": None,
            }
        },
    )
    fake.fail_next(refusal)
    image = Image("data:image/jpeg;base64,/9j/AA==", 255)
    asked = Prompt("Be brief.", (), ("[photo] what is this?",), images=((image,),))
    answer = await generate(openai_llm(fake), asked, LLMSettings(**llm_config(fake)), Usage())
    assert answer == Answer("You said: [photo] what is this?")
    first, second = fake.requests
    assert first.image_urls() == [image.url] and second.image_urls() == []
    assert "could not be shown to you" in second.messages[0]["content"]
    assert "LASTWORD_MEDIA__VISION=off" in caplog.text


async def test_the_echo_model_streams_word_by_word_and_a_long_answer_briefly() -> None:
    seen: list[str] = []
    answer = await EchoLLM(word_ms=1).complete(prompt("one two"), Usage(on_text=seen.append))
    assert answer == Answer("You said: one two")
    # Each step a longer prefix, the last the whole answer.
    assert seen == ["You", "You said:", "You said: one", answer.text, answer.text]
    seen.clear()
    long = " ".join(f"w{n}" for n in range(1000))
    await EchoLLM(word_ms=1).complete(prompt(long), Usage(on_text=seen.append))
    assert len(seen) <= 26 and seen[-1].endswith("w999")
    assert all(b.startswith(a) and b != a for a, b in itertools.pairwise(seen[:-1]))

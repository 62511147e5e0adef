"""The fake OpenAI server must be indistinguishable, to the real ``openai`` client, from the
real API in every way the bot relies on; these tests pin that down."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai.types import AudioResponseFormat
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)

from tests.support.fakes.openai_server import (
    IMAGE_TOKENS,
    FakeOpenAI,
    RawReply,
    RecordedRequest,
    ScriptedError,
    SeenCall,
    SeenResult,
    ToolCalls,
    ToolPolicy,
)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="k1", max_retries=0) as c:
        yield c


async def test_plain_completion(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="gpt-test",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
    )

    assert completion.choices[0].message.content == "You said: hello there"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "gpt-test"
    assert completion.usage is not None
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    [recorded] = fake.requests
    assert recorded.api_key == "k1"
    assert recorded.model == "gpt-test"
    assert recorded.stream is False
    assert recorded.last_user_text == "hello there"
    assert recorded.headers["authorization"] == "Bearer k1"
    assert recorded.finished and not recorded.cancelled


async def test_streamed_completion(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    reply = "one two  three, four five"
    fake.reply = lambda r: reply
    fake.delay_s = 0.1

    stream = await client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "count"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas: list[str] = []
    finish_reasons: list[str] = []
    usage_seen = False
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)
        if chunk.usage is not None:
            usage_seen = True

    assert "".join(deltas) == reply
    assert len(deltas) > 1
    assert finish_reasons == ["stop"]
    assert usage_seen
    [recorded] = fake.requests
    assert recorded.stream is True
    assert recorded.api_key == "k1"
    assert recorded.finished and not recorded.cancelled


async def test_rate_limit_surfaces_with_retry_after(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.fail_next(FakeOpenAI.rate_limited(2.5))

    with pytest.raises(openai.RateLimitError) as excinfo:
        await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}]
        )

    assert excinfo.value.status_code == 429
    assert excinfo.value.response.headers["retry-after"] == "2.5"
    assert excinfo.value.code == "rate_limit_exceeded"
    # The queue holds one error, so the next request is answered normally.
    completion = await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "again"}]
    )
    assert completion.choices[0].message.content == "You said: again"
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("error", "exc_type", "code"),
    [
        (FakeOpenAI.unauthorized(), openai.AuthenticationError, "invalid_api_key"),
        (FakeOpenAI.context_length(), openai.BadRequestError, "context_length_exceeded"),
        (FakeOpenAI.model_not_found(), openai.NotFoundError, "model_not_found"),
        (FakeOpenAI.server_error(), openai.InternalServerError, None),
    ],
)
async def test_scripted_errors_map_to_client_exceptions(
    fake: FakeOpenAI,
    client: openai.AsyncOpenAI,
    error: ScriptedError,
    exc_type: type[openai.APIStatusError],
    code: str | None,
) -> None:
    fake.fail_next(error)

    with pytest.raises(exc_type) as excinfo:
        await client.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "hi"}]
        )

    assert excinfo.value.status_code == error.status
    assert excinfo.value.code == code
    assert fake.requests[0].finished


async def test_client_cancellation_is_recorded(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.hold()

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(
            client.chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "wait"}]
            ),
            timeout=0.3,
        )

    def gave_up(r: RecordedRequest) -> bool:
        return r.cancelled

    recorded = await fake.wait_for_request(gave_up, timeout=2.0)
    assert recorded.last_user_text == "wait"
    assert not recorded.finished
    fake.release()


async def test_disconnect_mid_stream_is_recorded(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.delay_s = 1.0  # spread over the chunks, so the stream is still going when we leave
    stream = await client.chat.completions.create(
        model="gpt-test",
        messages=[{"role": "user", "content": "a fairly long message to stream back"}],
        stream=True,
    )
    first = await anext(aiter(stream))
    assert first.choices[0].delta.role == "assistant"
    await stream.close()

    recorded = await fake.wait_for_request(lambda r: r.cancelled, timeout=2.0)
    assert recorded.stream and not recorded.finished


async def test_stop_does_not_hang_on_held_requests() -> None:
    server = FakeOpenAI()
    await server.start()
    server.hold()
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k3", max_retries=0) as c:
        call = asyncio.create_task(
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        )
        held = await server.wait_for_request(timeout=2.0)

        await asyncio.wait_for(server.stop(), timeout=3.0)

        with pytest.raises(openai.APIConnectionError):
            await call
    assert held.cancelled and not held.finished


async def test_delay_and_models(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.delay_s = 0.2
    models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]

    completion = await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "slow"}]
    )
    recorded = fake.requests[0]
    assert completion.choices[0].message.content == "You said: slow"
    assert recorded.finished


async def test_wait_for_request_times_out(fake: FakeOpenAI) -> None:
    with pytest.raises(TimeoutError):
        await fake.wait_for_request(timeout=0.1)


async def test_malformed_json_is_an_openai_style_400(fake: FakeOpenAI) -> None:
    # The openai client cannot send broken JSON, so this goes through a raw HTTP client.
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            fake.base_url + "/chat/completions",
            data=b"{not json",
            headers={"Content-Type": "application/json", "Authorization": "Bearer k1"},
        ) as response,
    ):
        body = await response.json()

    assert response.status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["message"], str)
    assert fake.requests == []


# -- content parts ---------------------------------------------------------------------------

JPEG_URL = "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xe0 not really").decode()
WEB_URL = "https://example.com/cat.png"


async def test_content_parts_are_answered_and_recorded_in_order(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    completion = await client.chat.completions.create(
        model="gpt-test",
        messages=[
            {"role": "system", "content": "describe"},
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at this "},
                    {"type": "image_url", "image_url": {"url": JPEG_URL}},
                    {"type": "text", "text": "and this"},
                    {"type": "image_url", "image_url": {"url": WEB_URL, "detail": "low"}},
                ],
            },
        ],
    )

    assert completion.choices[0].message.content == "You said: look at this and this"
    [recorded] = fake.requests
    assert recorded.user_parts() == [
        ("text", "look at this "),
        ("image", JPEG_URL),
        ("text", "and this"),
        ("image", WEB_URL),
    ]
    assert recorded.image_urls() == [JPEG_URL, WEB_URL]
    assert recorded.last_user_text == "look at this and this"
    # Each image costs a fixed amount by its detail, on top of the text.
    text_only = await client.chat.completions.create(
        model="gpt-test",
        messages=[
            {"role": "system", "content": "describe"},
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "look at this and this"},
        ],
    )
    assert completion.usage is not None and text_only.usage is not None
    assert completion.usage.prompt_tokens - text_only.usage.prompt_tokens == (
        IMAGE_TOKENS["auto"] + IMAGE_TOKENS["low"]
    )
    assert fake.requests[1].user_parts() == [("text", "look at this and this")]
    assert fake.requests[1].image_urls() == []


def _with_part(part: dict[str, Any], role: str = "user") -> list[dict[str, Any]]:
    return [{"role": role, "content": [{"type": "text", "text": "see"}, part]}]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            _with_part({"type": "image_url", "image_url": {}}),
            "messages[0].content[1].image_url.url",
        ),
        (_with_part({"type": "image_url"}), "messages[0].content[1].image_url"),
        (
            _with_part({"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}),
            "messages[0].content[1].image_url.url",
        ),
        (
            _with_part({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}),
            "messages[0].content[1].image_url.url",
        ),
        (
            _with_part({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}),
            "messages[0].content[1].image_url.url",
        ),
        (
            _with_part({"type": "image_url", "image_url": {"url": "data:image/png,raw"}}),
            "messages[0].content[1].image_url.url",
        ),
        (
            _with_part({"type": "image_url", "image_url": {"url": JPEG_URL, "detail": "max"}}),
            "messages[0].content[1].image_url.detail",
        ),
        (
            _with_part({"type": "image_url", "image_url": {"url": JPEG_URL}}, "system"),
            "messages[0]",
        ),
        (_with_part({"type": "video"}), "messages[0].content[1].type"),
        (_with_part({"type": "text"}), "messages[0].content[1].text"),
    ],
)
async def test_malformed_content_parts_are_openai_style_400s(
    fake: FakeOpenAI,
    client: openai.AsyncOpenAI,
    messages: list[dict[str, Any]],
    param: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as excinfo:
        await client.chat.completions.create(model="gpt-test", messages=messages)  # type: ignore[arg-type]

    assert excinfo.value.param == param
    assert isinstance(excinfo.value.body, dict)
    assert excinfo.value.body["type"] == "invalid_request_error"
    assert fake.requests == []
    assert [body["messages"] for body in fake.rejected] == [messages]


# -- transcriptions --------------------------------------------------------------------------

VOICE = b"OggS" + bytes(range(256)) * 8


async def test_transcription_is_answered_and_recorded(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=("voice.ogg", VOICE, "audio/ogg"), language="de"
    )

    assert result.text == "transcript of voice.ogg"
    [recorded] = fake.transcriptions
    assert recorded.model == "whisper-1"
    assert recorded.filename == "voice.ogg"
    assert recorded.content_type == "audio/ogg"
    assert recorded.size == len(VOICE)
    assert recorded.sha256 == hashlib.sha256(VOICE).hexdigest()
    assert recorded.data == VOICE
    assert recorded.api_key == "k1"
    assert recorded.headers["authorization"] == "Bearer k1"
    assert recorded.language == "de" and recorded.response_format == "json"
    assert recorded.finished and not recorded.cancelled
    assert fake.requests == []
    # The audio is out of repr: a failing assertion should not print megabytes.
    assert "OggS" not in repr(recorded)


@pytest.mark.parametrize("response_format", ["json", "verbose_json", "text", "srt", "vtt"])
async def test_transcription_response_formats(
    fake: FakeOpenAI, client: openai.AsyncOpenAI, response_format: AudioResponseFormat
) -> None:
    fake.transcribe = lambda t: f"{t.prompt} words from {t.size} bytes"

    result: Any = await client.audio.transcriptions.create(
        model="whisper-1",
        file=("note.mp3", b"ID3...", "audio/mpeg"),
        prompt="some",
        response_format=response_format,
    )

    text = result if isinstance(result, str) else result.text
    assert "some words from 6 bytes" in text
    if response_format == "text":
        assert result == "some words from 6 bytes\n"
    assert fake.transcriptions[0].response_format == response_format


async def test_a_file_over_aiohttps_default_body_limit_is_taken(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    audio = b"\x00" * (3 * 1024 * 1024)
    result = await client.audio.transcriptions.create(
        model="whisper-1", file=("long.wav", audio, "audio/wav")
    )
    assert result.text == "transcript of long.wav"
    assert fake.transcriptions[0].size == len(audio)


@pytest.mark.parametrize(
    ("error", "exc_type"),
    [
        (FakeOpenAI.rate_limited(1.5), openai.RateLimitError),
        (FakeOpenAI.server_error(), openai.InternalServerError),
        (FakeOpenAI.unauthorized(), openai.AuthenticationError),
    ],
)
async def test_scripted_transcription_failures(
    fake: FakeOpenAI,
    client: openai.AsyncOpenAI,
    error: ScriptedError,
    exc_type: type[openai.APIStatusError],
) -> None:
    fake.fail_next_transcription(error)

    with pytest.raises(exc_type) as excinfo:
        await client.audio.transcriptions.create(
            model="whisper-1", file=("voice.ogg", VOICE, "audio/ogg")
        )

    assert excinfo.value.status_code == error.status
    assert [t.finished for t in fake.transcriptions] == [True]
    # Chat has a queue of its own, and the transcription queue held one error.
    chat = await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].message.content == "You said: hi"
    again = await client.audio.transcriptions.create(
        model="whisper-1", file=("voice.ogg", VOICE, "audio/ogg")
    )
    assert again.text == "transcript of voice.ogg"


async def test_a_wrong_key_is_refused_on_both_endpoints(fake: FakeOpenAI) -> None:
    fake.expected_api_key = "right"
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as excinfo:
            await c.audio.transcriptions.create(
                model="whisper-1", file=("voice.ogg", VOICE, "audio/ogg")
            )
        assert excinfo.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert fake.transcriptions == [] and fake.requests == []


async def test_an_interrupted_transcription_is_recorded_as_cancelled(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    fake.transcription_delay_s = 5.0
    call = asyncio.create_task(
        client.audio.transcriptions.create(
            model="whisper-1", file=("voice.ogg", VOICE, "audio/ogg")
        )
    )
    started = await fake.wait_for_transcription(timeout=2.0)
    assert not started.finished
    call.cancel()

    recorded = await fake.wait_for_transcription(lambda t: t.cancelled, timeout=2.0)
    assert recorded is started and not recorded.finished


async def test_wait_for_transcription_times_out(fake: FakeOpenAI) -> None:
    with pytest.raises(TimeoutError):
        await fake.wait_for_transcription(timeout=0.1)


def _form(**fields: str) -> aiohttp.FormData:
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        form.add_field(name, value)
    return form


@pytest.mark.parametrize(
    ("data", "headers", "status", "param"),
    [
        (_form(model="whisper-1"), {"Authorization": "Bearer k1"}, 400, "file"),
        (b'{"model": "whisper-1"}', {"Authorization": "Bearer k1"}, 400, None),
        (_form(model="whisper-1"), {}, 401, None),
    ],
)
async def test_transcription_without_file_or_key_is_refused(
    fake: FakeOpenAI,
    data: aiohttp.FormData | bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    # The openai client cannot leave out the file or the key, so this goes through aiohttp.
    async with (
        aiohttp.ClientSession() as session,
        session.post(fake.base_url + "/audio/transcriptions", data=data, headers=headers) as r,
    ):
        body = await r.json()

    assert r.status == status
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    assert fake.transcriptions == []
    assert len(fake.rejected_transcriptions) == (1 if status == 400 else 0)


# -- raw replies -------------------------------------------------------------------------------


async def post_chat(fake: FakeOpenAI, text: str, *, stream: bool = True) -> tuple[int, str, bytes]:
    """Status, Content-Type and body bytes of one chat request, read by a raw HTTP client (the
    openai client would parse them); the body is what came before the connection ended."""
    request = {"model": "m", "messages": [{"role": "user", "content": text}], "stream": stream}
    body = bytearray()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            fake.base_url + "/chat/completions",
            json=request,
            headers={"Authorization": "Bearer k1"},
        ) as response,
    ):
        try:
            async for chunk in response.content.iter_any():
                body += chunk
        except aiohttp.ClientPayloadError:
            pass  # a cut body: what came before the cut is the point
        return response.status, response.content_type, bytes(body)


async def test_raw_replies_go_out_byte_for_byte_in_order_after_scripted_errors(
    fake: FakeOpenAI,
) -> None:
    parts = RawReply.chunk(
        {"content": [{"type": "thinking", "thinking": []}, {"type": "text", "text": "hi"}]},
        usage=7,
    )
    junk = b"data: not json at all\n\n: a comment\n\n"
    stream = RawReply.events(parts, junk, ["a", "list"])
    odd = RawReply.json(RawReply.completion({"content": [{"type": "text", "text": "x"}]}))
    fake.fail_next(FakeOpenAI.server_error())
    fake.answer_next(stream, odd)

    assert (await post_chat(fake, "one"))[0] == 500
    assert await post_chat(fake, "two") == (200, "text/event-stream", stream.body)
    assert await post_chat(fake, "three", stream=False) == (200, "application/json", odd.body)
    # Queue used up: the ordinary reply again.
    status, _, body = await post_chat(fake, "four", stream=False)
    assert status == 200 and b"You said: four" in body

    assert stream.body == (
        b"data: "
        + json.dumps(parts).encode()
        + b"\n\n"
        + junk
        + b'data: ["a", "list"]\n\ndata: [DONE]\n\n'
    )
    assert [r.last_user_text for r in fake.requests] == ["one", "two", "three", "four"]
    assert all(r.finished and not r.dropped for r in fake.requests)
    assert fake.requests[1].pieces_streamed == 4 and fake.raw_replies == []


async def test_a_raw_reply_can_be_an_html_page_with_a_200(fake: FakeOpenAI) -> None:
    fake.answer_next(RawReply.html(), RawReply.html(status=502))
    status, kind, page = await post_chat(fake, "hi")
    assert (status, kind) == (200, "text/html") and b"<title>502 Bad Gateway</title>" in page
    assert (await post_chat(fake, "again"))[:2] == (502, "text/html")


@pytest.mark.parametrize("cut", [0, 1, 25, 60])
async def test_a_raw_reply_cut_after_n_bytes_ends_the_body_there(
    fake: FakeOpenAI, cut: int
) -> None:
    reply = RawReply.events(RawReply.chunk({"content": "hello"}), b"data: x\n\n", cut_after=cut)
    fake.answer_next(reply)
    assert await post_chat(fake, "hi") == (200, "text/event-stream", reply.body)
    assert len(reply.body) == cut
    [recorded] = fake.requests
    assert recorded.dropped and not recorded.finished


async def test_a_raw_reply_is_written_piece_by_piece(fake: FakeOpenAI) -> None:
    # The pause comes before each piece: the client has the first event while the second is
    # still to come, as with a provider that is slow to generate.
    fake.answer_next(RawReply.events({"n": 1}, {"n": 2}, pause_s=0.5))
    async with aiohttp.ClientSession() as session:
        request = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with session.post(
            fake.base_url + "/chat/completions", json=request, headers={"Authorization": "Bearer k"}
        ) as response:
            first = await response.content.readline()
            [recorded] = fake.requests
            assert first == b'data: {"n": 1}\n' and recorded.pieces_streamed == 1
            assert not recorded.finished
            assert await response.content.read() == b'\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
    assert recorded.finished


# -- tools -------------------------------------------------------------------------------------

CLOCK_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_current_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}},
    },
}
UTC_ARGS = '{"timezone": "UTC"}'
ASK_TIME: list[dict[str, Any]] = [{"role": "user", "content": "what time is it?"}]


def answered_call(call_id: str, result: str) -> list[dict[str, Any]]:
    """The steps after a call of the clock: the assistant's call, then the tool's result."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_current_time", "arguments": UTC_ARGS},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


async def chat(client: openai.AsyncOpenAI, **request: Any) -> ChatCompletionMessage:
    """The message of one completion asked of the clock-offering fake (plain dicts in, as the
    bot sends them, rather than the client's typed parameters); an option given as None is
    left out."""
    request = {"model": "m", "messages": ASK_TIME, "tools": [CLOCK_TOOL]} | request
    sent = {key: value for key, value in request.items() if value is not None}
    completion: ChatCompletion = await client.chat.completions.create(**sent)
    [choice] = completion.choices
    return choice.message


def function_calls(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    calls = message.tool_calls or []
    assert all(isinstance(c, ChatCompletionMessageFunctionToolCall) for c in calls)
    return [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]


@pytest.mark.parametrize("interleave", [False, True], ids=["in-turn", "interleaved"])
async def test_streamed_tool_calls_are_what_the_official_client_assembles(
    fake: FakeOpenAI, client: openai.AsyncOpenAI, interleave: bool
) -> None:
    calls = [("get_current_time", UTC_ARGS), ("get_current_time", '{"timezone": "Asia/Tokyo"}')]
    fake.answer_next(ToolCalls(calls, text="Checking.", interleave=interleave))
    request: dict[str, Any] = {"model": "m", "messages": ASK_TIME, "tools": [CLOCK_TOOL]}
    async with client.chat.completions.stream(
        **request, stream_options={"include_usage": True}
    ) as stream:
        deltas = [
            event.chunk.choices[0].delta
            async for event in stream
            if event.type == "chunk" and event.chunk.choices
        ]
        final = await stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    made = function_calls(choice.message)
    assert [(c.function.name, c.function.arguments) for c in made] == calls
    assert all(c.id.startswith("call_") for c in made) and len({c.id for c in made}) == 2
    # As OpenAI streams them: each call's first piece has its id, type and name and no
    # arguments yet; the rest only argument pieces.
    pieces = [p for d in deltas for p in d.tool_calls or ()]
    firsts = [(p.index, p.type, p.function and p.function.arguments) for p in pieces if p.id]
    assert firsts == [(0, "function", ""), (1, "function", "")]
    assert all(p.function and p.function.name is None for p in pieces if not p.id)
    assert len(pieces) > 2 * len(firsts)
    assert final.usage is not None
    assert final.usage.completion_tokens == ToolCalls(calls, "Checking.").tokens()
    [recorded] = fake.requests
    # Every chunk but the first (the role, empty content) and the last (the finish reason).
    assert recorded.pieces_streamed == len(deltas) - 2
    assert recorded.tool_names == ["get_current_time"] and recorded.tool_choice is None


async def test_tool_calls_not_streamed(fake: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    fake.answer_next(ToolCalls([("get_current_time", UTC_ARGS)], ids=["call_1"]))
    message = await chat(client, tool_choice="auto")
    assert message.content is None
    [call] = function_calls(message)
    assert call.id == "call_1" and call.function.arguments == UTC_ARGS
    assert fake.requests[0].tool_choice == "auto"


def results(message: ChatCompletionMessage, label: str) -> list[dict[str, Any]]:
    """The steps after `message`: it, then a result for each of its calls."""
    told = [
        {"role": "tool", "tool_call_id": call.id, "content": f"{label} {n}"}
        for n, call in enumerate(function_calls(message))
    ]
    return [message.model_dump(exclude_none=True), *told]


async def test_a_tool_policy_runs_call_result_text_on_its_own(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    cet = '{"timezone": "CET"}'
    fake.reply = ToolPolicy(
        "get_current_time", [UTC_ARGS, cet], steps=2, answer="{results} | {user}"
    )
    first = await chat(client)
    assert [c.function.arguments for c in function_calls(first)] == [UTC_ARGS, cet]
    steps = results(first, "time")
    # Two steps asked for: a second round of calls, then the text quoting every result.
    second = await chat(client, messages=ASK_TIME + steps)
    assert len(function_calls(second)) == 2
    steps += results(second, "later")
    text = await chat(client, messages=ASK_TIME + steps)
    assert text.content == "time 0\ntime 1\nlater 0\nlater 1 | what time is it?"
    assert not text.tool_calls
    # Told to answer in text: no call, and with no result yet, the echo.
    none = await chat(client, tool_choice="none")
    assert none.content == "You said: what time is it?" and not none.tool_calls
    # Not offered the tool: the same.
    bare = await chat(client, tools=[CLOCK_TOOL | {"function": {"name": "other"}}])
    assert bare.content == "You said: what time is it?" and not bare.tool_calls
    last = fake.requests[2]
    assert [len(step) for step in last.tool_steps(this_turn=True)] == [2, 2]
    assert [r.text for r in last.tool_results()] == ["time 0", "time 1", "later 0", "later 1"]
    assert {r.name for r in last.tool_results()} == {"get_current_time"}


async def test_tool_steps_this_turn_leave_the_history_out(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    messages = [
        {"role": "user", "content": "earlier"},
        *answered_call("call_old", "then"),
        {"role": "assistant", "content": "It was then."},
        {"role": "user", "content": "and now?"},
        *answered_call("call_new", "now"),
    ]
    await chat(client, messages=messages)
    [recorded] = fake.requests
    assert [call.id for call in recorded.tool_calls()] == ["call_old", "call_new"]
    now = recorded.tool_calls(this_turn=True)
    assert now == [SeenCall("call_new", "get_current_time", UTC_ARGS)]
    told = recorded.tool_results(this_turn=True)
    assert told == [SeenResult("call_new", "get_current_time", "now")]
    assert recorded.last_user_text == "and now?"


async def test_tools_and_tool_messages_are_billed(
    fake: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    said = "twelve o'clock, " * 10
    await chat(client, tools=None)
    await chat(client)
    await chat(client, messages=[*ASK_TIME, *answered_call("call_1", said)])
    plain, offered, stepped = (r.prompt_tokens for r in fake.requests)
    assert offered - plain == len(json.dumps([CLOCK_TOOL])) // 4 + 1
    call = len("get_current_time" + UTC_ARGS) // 4 + 1
    result = len(said) // 4 + 1
    # The assistant message with the call has no content: an empty text costs 1 like any.
    assert stepped - offered == 1 + call + result


def unanswered_then_asked() -> list[dict[str, Any]]:
    call, result = answered_call("c", "r")
    return [*ASK_TIME, call, *ASK_TIME, result]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [CLOCK_TOOL], "tool_choice": "always"}, "tool_choice"),
        ({"tools": CLOCK_TOOL}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools[0].function.name",
        ),
        ({"messages": [*ASK_TIME, answered_call("c", "r")[1]]}, "messages.[1].role"),
        ({"messages": [*ASK_TIME, answered_call("c", "r")[0]]}, "messages.[1].role"),
        ({"messages": unanswered_then_asked()}, "messages.[1].role"),
        (
            {"messages": [*ASK_TIME, {"role": "assistant", "content": None, "tool_calls": []}]},
            "messages[1].tool_calls",
        ),
        (
            {
                "messages": [
                    *ASK_TIME,
                    answered_call("c", "r")[0],
                    {"role": "tool", "tool_call_id": "c"},
                ]
            },
            "messages[2].content",
        ),
    ],
    ids=[
        "choice-without-tools",
        "unknown-choice",
        "tools-not-a-list",
        "no-function",
        "bad-name",
        "long-name",
        "orphan-result",
        "unanswered-call",
        "result-too-late",
        "empty-calls",
        "result-without-content",
    ],
)
async def test_malformed_tools_and_tool_messages_are_openai_style_400s(
    fake: FakeOpenAI, body: dict[str, Any], param: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            fake.base_url + "/chat/completions",
            json={"model": "m", "messages": ASK_TIME} | body,
            headers={"Authorization": "Bearer k1"},
        ) as response,
    ):
        error = (await response.json())["error"]
    assert response.status == 400 and error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    assert fake.requests == [] and len(fake.rejected) == 1

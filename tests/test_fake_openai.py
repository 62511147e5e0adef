"""The fake OpenAI server must be indistinguishable, to the real ``openai`` client, from the
real API in every way the bot relies on; these tests pin that down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from tests.fakes.openai_server import FakeOpenAI, RecordedRequest, ScriptedError


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

"""What the fake provider bills: every request's prompt tokens as it lands (the figure its usage
reports), so a request the client gave up on and made again is billed its prompt twice, as a
provider bills the prefill of each. Benchmarks count tokens per reply from it."""

from __future__ import annotations

import asyncio
import contextlib

import openai
import pytest

from tests.support.chatting import fake
from tests.support.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.timeout(30)
__all__ = ["fake"]  # the fixture, imported for pytest

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "a question long enough to cost a few prompt tokens"},
]


async def test_a_request_given_up_and_made_again_is_billed_its_prompt_twice(
    fake: FakeOpenAI,
) -> None:
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0) as client:
        fake.delay_s = 30.0
        given_up = asyncio.create_task(client.chat.completions.create(model="m", messages=MESSAGES))
        first = await fake.wait_for_request()
        given_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await given_up
        await fake.wait_for_request(lambda r: r is first and r.cancelled)

        fake.delay_s = 0.0
        completion = await client.chat.completions.create(model="m", messages=MESSAGES)

    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert [r.prompt_tokens for r in fake.requests] == [completion.usage.prompt_tokens] * 2

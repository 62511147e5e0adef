"""A provider that keeps the stream open after its answer, end to end: `lastword run` with the
real Telegram adapter and the real OpenAI client against the fake Bot API and a fake provider
that sends `[DONE]` and then keep-alive comments, or nothing, without ending the body (as some
proxies and self-hosted servers do). The reply goes out at once, not after a read timeout or
the whole deadline, and not as the apology."""

from __future__ import annotations

import pytest

from tests.support.fakes.openai_server import AfterDone
from tests.support.world import CHAT, World

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("after", ["keep-alive", "silent"])
async def test_the_reply_goes_out_as_soon_as_the_answer_is_whole(
    world: World, after: AfterDone
) -> None:
    telegram, provider = world.telegram, world.provider
    provider.after_done = after
    # A read timeout and a deadline far above what the reply may take, as in production.
    limits = {"LASTWORD_LLM__TIMEOUT_S": "20", "LASTWORD_LLM__DEADLINE_S": "40"}
    async with world.bot(**limits) as bot:
        await bot.post(telegram.private_text_update(CHAT, CHAT, "are you still there"))
        reply = await world.one_reply()
        [request] = provider.requests
        # The replica hangs up on the held stream rather than keep its connection.
        await provider.wait_for_request(lambda r: r.hung_up, timeout=5)
    assert reply == "You said: are you still there"
    [sent] = telegram.sent_messages
    assert request.ended_at is not None
    waited = sent.at - request.ended_at
    assert 0 < waited < 3.0, f"the reply went out {waited:.1f}s after the answer's [DONE]"

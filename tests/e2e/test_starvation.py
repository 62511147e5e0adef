"""The starvation guard at a human pace: `lastword run` (Telegram webhook, the echo model) and a
user who sends a message every 1.5 s for 20 s, each one interrupting the generation started
for the ones before. No reply may be forced out before the oldest unanswered message has
waited the configured age; one must be, after it; and every message is answered once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bot.store.embedded import EmbeddedRedis
from tests.support.fakes.telegram_server import FakeTelegram
from tests.support.telegram_runs import CHAT, CONVERSATION, webhook_bot
from tests.support.waits import settled

pytestmark = pytest.mark.timeout(60)

AGE_S = 14.0
GAP_S = 1.5
TYPING_S = 20.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as telegram:
        yield telegram


def covered(text: str | None) -> list[str]:
    """The messages a reply answered (the echo model repeats them, ' / '-separated)."""
    return (text or "").removeprefix("You said: ").split(" / ")


async def test_a_user_typing_every_second_and_a_half_is_answered_at_the_age_not_before(
    server: EmbeddedRedis, redis: Redis, fake: FakeTelegram, short_dir: Path
) -> None:
    settings = {
        "LASTWORD_STARVATION_AGE_MS": str(int(AGE_S * 1000)),
        "LASTWORD_STARVATION_LIMIT": "100",
        # Each window closes 0.6 s after a message, and its 3 s generation is cut short by
        # the next message 0.9 s later: only the guard can get a reply out while they type.
        "LASTWORD_DEBOUNCE__QUIET_MS": "600",
        "LASTWORD_DEBOUNCE__MAX_WAIT_MS": "3000",
        "LASTWORD_LLM__ECHO_DELAY_MS": "3000",
        "LASTWORD_LEASE__TTL_MS": "3000",
    }
    sent: list[tuple[float, str]] = []
    async with webhook_bot(server, fake, short_dir, **settings) as bot:
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < TYPING_S:
            n += 1
            assert await bot.post(fake.private_text_update(CHAT, CHAT, f"m{n}")) == 200
            sent.append((time.monotonic(), f"m{n}"))
            await asyncio.sleep(GAP_S)  # the user's typing rhythm is the workload
        await settled(redis, CONVERSATION, within_s=20)
        replies = [(call.at, covered(call.text)) for call in fake.sent_messages]

    first_at, first = replies[0]
    # Nothing before the age: the first reply went out after the oldest message had waited it.
    assert first_at - sent[0][0] >= AGE_S, f"a reply {first_at - sent[0][0]:.1f} s in"
    # It was forced: newer messages had arrived before it went out.
    newer = [text for at, text in sent if at < first_at and text not in first]
    assert newer, "the first reply covered everything: nothing was forced"
    assert len(replies) >= 2
    # Every message answered exactly once, in order.
    answered = [text for _, texts in replies for text in texts]
    assert answered == [text for _, text in sent]
